package proxy

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/vocab/permittrace"
)

// Metrics are the Prometheus metrics of a Proxy, labelled by route name
// (the routes' names, bounded by the configuration; "_unmatched" for the
// requests that match none):
//
//	sluice_proxy_requests_total{route,result}  requests by
//	                      httplimit.Result (allowed, delayed, denied,
//	                      shadow, too_concurrent, unlimited, invalid,
//	                      error, canceled); the requests that match no
//	                      route are unlimited; one admitted, then
//	                      cancelled because its concurrency permit was
//	                      lost, is an error
//	sluice_proxy_upstream_errors_total{route}  requests the upstream did
//	                      not answer (answered 502, or 504 for an
//	                      upstream timeout), client cancellations not
//	                      included
//	sluice_proxy_timeouts_total{route,timeout}  requests aborted by a
//	                      timeout: write_idle (Config.WriteIdleTimeout:
//	                      the client read nothing of its answer) or
//	                      upstream (Config.UpstreamTimeout: answered 504)
//	sluice_proxy_tokens_total{route,kind}  the tokens of a route's token
//	                      budget: reserved at admission, and spent as
//	                      the answers settled them
//	sluice_proxy_request_duration_seconds{route}  histogram of the time
//	                      from the request's routing to the end of its
//	                      answer: the decision and, when passed, the
//	                      upstream's whole response, body included (an
//	                      upgraded connection counts until it closes)
//	sluice_permits_acquired_total{route}, …_denied_total, …_renewed_total,
//	sluice_permits_lost_total, …_released_total, …_release_failures_total
//	                      the permits of the requests' concurrency rules
//	                      (permittrace.Trace says when each counts)
//	sluice_permits_held{route}  permits held by the route's requests in
//	                      flight: acquired, less those released (or whose
//	                      release failed) and those found lost
//
// The series of a route dropped by SetRoutes are deleted. Make one with
// NewMetrics and share it by Config.Metrics; a nil *Metrics counts
// nothing.
type Metrics struct {
	requests       *prometheus.CounterVec
	upstreamErrors *prometheus.CounterVec
	timeouts       *prometheus.CounterVec
	tokens         *prometheus.CounterVec
	duration       *prometheus.HistogramVec
	permits        [numPermitEvents]*prometheus.CounterVec
	held           *prometheus.GaugeVec
}

// The permit events counted, each a counter sluice_permits_<name>_total.
const (
	permitAcquired = iota
	permitDenied
	permitRenewed
	permitLost
	permitReleased
	permitReleaseFailed
	numPermitEvents
)

var permitEvents = [numPermitEvents]struct{ name, help string }{
	{"acquired", "Permits of concurrency rules acquired by admitted requests, by route."},
	{"denied", "Permits of concurrency rules refused for want of a slot (their requests denied), by route."},
	{"renewed", "Renewals of permits still held, by route: every ttl/3 while a request runs."},
	{"lost", "Permits a renewal found held no more, and their slots taken, by route: the request ran past the TTL without a renewal, or the store lost the permit, and others hold every slot; the request is cancelled."},
	{"released", "Permits released when their requests ended, by route."},
	{"release_failures", "Permits whose release failed (the store was down), by route: they expire after their TTL."},
}

// NewMetrics registers the proxy's metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_proxy_requests_total",
			Help: "Requests through the proxy, by route and result (allowed, delayed, denied, shadow, too_concurrent, unlimited, invalid, error, canceled; error includes a request cancelled because its concurrency permit was lost).",
		}, []string{"route", "result"}),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_proxy_upstream_errors_total",
			Help: "Requests the upstream did not answer (answered 502, or 504 for an upstream timeout), by route.",
		}, []string{"route"}),
		timeouts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_proxy_timeouts_total",
			Help: "Requests ended by a timeout, by route and timeout: write_idle (the client read nothing of its answer for the write idle timeout: the request was aborted, its permits released) or upstream (no response headers within the upstream timeout: answered 504).",
		}, []string{"route", "timeout"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_proxy_tokens_total",
			Help: "Tokens of the routes' token budgets, by route and kind: reserved at admission, spent as the answers settled them.",
		}, []string{"route", "kind"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_proxy_request_duration_seconds",
			Help:    "Time from routing a request to the end of its answer, upstream response included, by route.",
			Buckets: prometheus.DefBuckets,
		}, []string{"route"}),
	}
	m.held = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sluice_permits_held",
		Help: "Permits of concurrency rules held by the requests in flight in this process, by route.",
	}, []string{"route"})
	cs := []prometheus.Collector{m.requests, m.upstreamErrors, m.timeouts, m.tokens, m.duration, m.held}
	for i, e := range permitEvents {
		m.permits[i] = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_permits_" + e.name + "_total",
			Help: e.help,
		}, []string{"route"})
		cs = append(cs, m.permits[i])
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// routeMetrics are one route's series, resolved when its table is built so
// that a request looks up no label.
type routeMetrics struct {
	results        []prometheus.Counter // by httplimit.Result
	upstreamErrors prometheus.Counter
	writeIdle      prometheus.Counter // timeouts
	upstream       prometheus.Counter
	reserved       prometheus.Counter // tokens
	spent          prometheus.Counter
	duration       prometheus.Observer
	permits        *permittrace.Trace // counts the route's permits; nil without metrics
}

func (m *Metrics) route(name string) routeMetrics {
	var rm routeMetrics
	if m == nil {
		return rm
	}
	// Indexed by Result: every value from Allowed up has a name.
	rm.results = []prometheus.Counter{nil}
	for r := httplimit.Allowed; r.String() != ""; r++ {
		rm.results = append(rm.results, m.requests.WithLabelValues(name, r.String()))
	}
	rm.upstreamErrors = m.upstreamErrors.WithLabelValues(name)
	rm.writeIdle = m.timeouts.WithLabelValues(name, "write_idle")
	rm.upstream = m.timeouts.WithLabelValues(name, "upstream")
	rm.reserved = m.tokens.WithLabelValues(name, "reserved")
	rm.spent = m.tokens.WithLabelValues(name, "spent")
	rm.duration = m.duration.WithLabelValues(name)
	return rm
}

// limitedRoute is route, for a route with limits: its permits counted
// too.
func (m *Metrics) limitedRoute(name string) routeMetrics {
	rm := m.route(name)
	rm.permits = m.permitTrace(name)
	return rm
}

// traced returns r with the route's permit trace in its context, so that
// the permits of its concurrency rules are counted as the Limiter
// acquires, renews and releases them with that context (or one made from
// it); r itself without metrics.
func (rm *routeMetrics) traced(r *http.Request) *http.Request {
	if rm.permits == nil {
		return r
	}
	return r.WithContext(permittrace.With(r.Context(), rm.permits))
}

// permitTrace returns the Trace that counts the permits of route name
// (nil for a nil m).
func (m *Metrics) permitTrace(name string) *permittrace.Trace {
	if m == nil {
		return nil
	}
	var c [numPermitEvents]prometheus.Counter
	for i := range c {
		c[i] = m.permits[i].WithLabelValues(name)
	}
	held := m.held.WithLabelValues(name)
	add := func(e int) func(int) { return func(n int) { c[e].Add(float64(n)) } }
	return &permittrace.Trace{
		Acquired: func(n int) {
			c[permitAcquired].Add(float64(n))
			held.Add(float64(n))
		},
		Denied:  add(permitDenied),
		Renewed: add(permitRenewed),
		Lost: func(n int) {
			c[permitLost].Add(float64(n))
			held.Sub(float64(n))
		},
		Released: func(n int, err error) {
			if err != nil {
				c[permitReleaseFailed].Add(float64(n))
			} else {
				c[permitReleased].Add(float64(n))
			}
			held.Sub(float64(n))
		},
	}
}

// settled counts a request's token reservation and what it spent.
func (rm *routeMetrics) settled(reserved, spent int64) {
	if rm.reserved == nil {
		return
	}
	rm.reserved.Add(float64(reserved))
	rm.spent.Add(float64(spent))
}

func (rm *routeMetrics) observe(r httplimit.Result, upstreamErr bool, d time.Duration) {
	if rm.duration == nil {
		return
	}
	if int(r) < len(rm.results) && rm.results[r] != nil {
		rm.results[r].Inc()
	}
	if upstreamErr {
		rm.upstreamErrors.Inc()
	}
	rm.duration.Observe(d.Seconds())
}

// timedOut counts a request aborted for a client that stopped reading
// (writeIdle), or answered 504 for an upstream timeout.
func (rm *routeMetrics) timedOut(writeIdle, upstream bool) {
	if rm.writeIdle == nil {
		return
	}
	if writeIdle {
		rm.writeIdle.Inc()
	}
	if upstream {
		rm.upstream.Inc()
	}
}

// forget deletes the series of the routes of old that next does not have.
func (m *Metrics) forget(old, next *table) {
	keep := map[string]bool{}
	for _, rt := range next.routes {
		keep[rt.name] = true
	}
	for _, rt := range old.routes {
		if !keep[rt.name] {
			l := prometheus.Labels{"route": rt.name}
			m.requests.DeletePartialMatch(l)
			m.upstreamErrors.Delete(l)
			m.timeouts.DeletePartialMatch(l)
			m.tokens.DeletePartialMatch(l)
			m.duration.Delete(l)
			m.held.Delete(l)
			for _, c := range m.permits {
				c.Delete(l)
			}
		}
	}
}
