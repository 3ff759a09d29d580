package proxy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Result is what became of a request, as the metrics count it.
type Result uint8

// The results, the values of the result label.
const (
	resultNone Result = iota // not known yet

	// Allowed: admitted by its route's limits and passed upstream (a
	// request every descriptor of which was skipped included).
	Allowed
	// Denied: denied by its route's limits, answered 429.
	Denied
	// Shadow: denied by its route's limits but passed upstream, in the
	// section's shadow mode. Rules' own shadow_mode limits never deny,
	// and count as Allowed.
	Shadow
	// Invalid: values the limits cannot take, answered 400.
	Invalid
	// Error: the decision failed with no failure policy to answer it,
	// answered 503.
	Error
	// Unlimited: matched no route, passed upstream unlimited.
	Unlimited

	numResults
)

var resultNames = [numResults]string{"", "allowed", "denied", "shadow", "invalid", "error", "unlimited"}

// String returns the label value of r: allowed, denied, shadow, invalid,
// error or unlimited.
func (r Result) String() string {
	if r < numResults {
		return resultNames[r]
	}
	return "unknown"
}

// Metrics are the Prometheus metrics of a Proxy, labelled by route name
// (the routes' names, bounded by the configuration; "_unmatched" for the
// requests that match none):
//
//	sluice_proxy_requests_total{route,result}  requests by Result
//	sluice_proxy_upstream_errors_total{route}  requests the upstream did
//	                      not answer (answered 502), client cancellations
//	                      not included
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
	duration       *prometheus.HistogramVec
}

// NewMetrics registers the proxy's metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_proxy_requests_total",
			Help: "Requests through the proxy, by route and result (allowed, denied, shadow, invalid, error, unlimited).",
		}, []string{"route", "result"}),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_proxy_upstream_errors_total",
			Help: "Requests the upstream did not answer (answered 502), by route.",
		}, []string{"route"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_proxy_request_duration_seconds",
			Help:    "Time from routing a request to the end of its answer, upstream response included, by route.",
			Buckets: prometheus.DefBuckets,
		}, []string{"route"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.upstreamErrors, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// routeMetrics are one route's series, resolved when its table is built so
// that a request looks up no label.
type routeMetrics struct {
	results        [numResults]prometheus.Counter
	upstreamErrors prometheus.Counter
	duration       prometheus.Observer
}

func (m *Metrics) route(name string) routeMetrics {
	var rm routeMetrics
	if m == nil {
		return rm
	}
	for r := Allowed; r < numResults; r++ {
		rm.results[r] = m.requests.WithLabelValues(name, r.String())
	}
	rm.upstreamErrors = m.upstreamErrors.WithLabelValues(name)
	rm.duration = m.duration.WithLabelValues(name)
	return rm
}

func (rm *routeMetrics) observe(r Result, upstreamErr bool, d time.Duration) {
	if rm.duration == nil {
		return
	}
	rm.results[r].Inc()
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
			m.duration.Delete(l)
		}
	}
}
