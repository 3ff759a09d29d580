package proxy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/httplimit"
)

// Metrics are the Prometheus metrics of a Proxy, labelled by route name
// (the routes' names, bounded by the configuration; "_unmatched" for the
// requests that match none):
//
//	sluice_proxy_requests_total{route,result}  requests by
//	                      httplimit.Result (allowed, delayed, denied,
//	                      shadow, too_concurrent, unlimited, invalid,
//	                      error, canceled); the requests that match no
//	                      route are unlimited
//	sluice_proxy_upstream_errors_total{route}  requests the upstream did
//	                      not answer (answered 502), client cancellations
//	                      not included
//	sluice_proxy_tokens_total{route,kind}  the tokens of a route's token
//	                      budget: reserved at admission, and spent as
//	                      the answers settled them
//	sluice_proxy_request_duration_seconds{route}  histogram of the time
//	                      from the request's routing to the end of its
//	                      answer: the decision and, when passed, the
//	                      upstream's whole response, body included (an
//	                      upgraded connection counts until it closes)
//
// The series of a route dropped by SetRoutes are deleted. Make one with
// NewMetrics and share it by Config.Metrics; a nil *Metrics counts
// nothing.
type Metrics struct {
	requests       *prometheus.CounterVec
	upstreamErrors *prometheus.CounterVec
	tokens         *prometheus.CounterVec
	duration       *prometheus.HistogramVec
}

// NewMetrics registers the proxy's metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_proxy_requests_total",
			Help: "Requests through the proxy, by route and result (allowed, delayed, denied, shadow, too_concurrent, unlimited, invalid, error, canceled).",
		}, []string{"route", "result"}),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_proxy_upstream_errors_total",
			Help: "Requests the upstream did not answer (answered 502), by route.",
		}, []string{"route"}),
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
	for _, c := range []prometheus.Collector{m.requests, m.upstreamErrors, m.tokens, m.duration} {
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
	reserved       prometheus.Counter // tokens
	spent          prometheus.Counter
	duration       prometheus.Observer
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
	rm.reserved = m.tokens.WithLabelValues(name, "reserved")
	rm.spent = m.tokens.WithLabelValues(name, "spent")
	rm.duration = m.duration.WithLabelValues(name)
	return rm
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
			m.tokens.DeletePartialMatch(l)
			m.duration.Delete(l)
		}
	}
}
