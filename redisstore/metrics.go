package redisstore

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/wheremetric"
)

// metrics counts the store's calls; Collector exports them.
type metrics struct {
	ok, failed, rejected atomic.Int64
	shed                 atomic.Int64
	fcalls               atomic.Int64 // script calls that decide requests
	refundFailed         atomic.Int64
	latency              prometheus.Histogram
}

func (m *metrics) init() {
	m.latency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sluice_redis_call_duration_seconds",
		Help:    "Time of a Redis store call (one script call per slot, in parallel), from when it had a slot among the calls in flight.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	})
}

func (m *metrics) observe(d time.Duration, err error) {
	m.latency.Observe(d.Seconds())
	if err != nil {
		m.failed.Add(1)
		return
	}
	m.ok.Add(1)
}

var (
	callsDesc = prometheus.NewDesc("sluice_redis_calls_total",
		"Redis store calls by result: ok, error (Redis refused, stayed silent, or the connection failed), rejected (not connected or circuit open, Redis not asked), shed (calls in flight and queue full, Redis not asked).",
		[]string{"result"}, nil)
	decisionsDesc = wheremetric.Desc("redis")
	inFlightDesc  = prometheus.NewDesc("sluice_redis_in_flight",
		"Requests in flight to Redis (at most --redis-max-in-flight).", nil, nil)
	fcallsDesc = prometheus.NewDesc("sluice_redis_script_calls_total",
		"Calls of the decision script (FCALL): fewer than the requests, when requests that arrive while calls are in flight go together.", nil, nil)
	nodesDesc = prometheus.NewDesc("sluice_nodes",
		"Nodes sharing the limits, as the Redis store's registry last told (this one included; 0 before it first did): the local failure policy divides every limit by it unless --local-nodes is set.", nil, nil)
	queuedDesc = prometheus.NewDesc("sluice_redis_queued",
		"Requests waiting for a slot among the calls in flight (at most --redis-max-queue; beyond it they are shed).", nil, nil)
	upDesc = prometheus.NewDesc("sluice_redis_up",
		"1 when the Redis store is connected and its circuit breaker closed.", nil, nil)
	refundDesc = prometheus.NewDesc("sluice_redis_refund_failures_total",
		"Cross-slot requests denied in one slot whose consumption in another could not be taken back (it stays consumed).", nil, nil)
	breakerDesc = prometheus.NewDesc("sluice_redis_breaker_state",
		"The Redis store's circuit breaker: 0 closed, 1 half-open, 2 open.", nil, nil)
)

// Collector returns the store's Prometheus metrics: calls by result, call
// duration, whether Redis is up, and the circuit breaker's state.
func (s *Store) Collector() prometheus.Collector { return collector{s} }

type collector struct{ s *Store }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- callsDesc
	ch <- decisionsDesc
	ch <- inFlightDesc
	ch <- queuedDesc
	ch <- nodesDesc
	ch <- fcallsDesc
	ch <- upDesc
	ch <- breakerDesc
	ch <- refundDesc
	c.s.metrics.latency.Describe(ch)
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	m := &c.s.metrics
	ch <- prometheus.MustNewConstMetric(callsDesc, prometheus.CounterValue, float64(m.ok.Load()), "ok")
	ch <- prometheus.MustNewConstMetric(callsDesc, prometheus.CounterValue, float64(m.failed.Load()), "error")
	ch <- prometheus.MustNewConstMetric(callsDesc, prometheus.CounterValue, float64(m.rejected.Load()), "rejected")
	ch <- prometheus.MustNewConstMetric(callsDesc, prometheus.CounterValue, float64(m.shed.Load()), "shed")
	ch <- prometheus.MustNewConstMetric(decisionsDesc, prometheus.CounterValue, float64(m.ok.Load()))
	ch <- prometheus.MustNewConstMetric(inFlightDesc, prometheus.GaugeValue, float64(c.s.gate.inFlight()))
	ch <- prometheus.MustNewConstMetric(queuedDesc, prometheus.GaugeValue, float64(c.s.gate.queued()))
	ch <- prometheus.MustNewConstMetric(nodesDesc, prometheus.GaugeValue, float64(c.s.Nodes()))
	ch <- prometheus.MustNewConstMetric(fcallsDesc, prometheus.CounterValue, float64(m.fcalls.Load()))
	up := 0.0
	if c.s.Health() == nil {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, up)
	ch <- prometheus.MustNewConstMetric(breakerDesc, prometheus.GaugeValue, float64(c.s.br.State()))
	ch <- prometheus.MustNewConstMetric(refundDesc, prometheus.CounterValue, float64(m.refundFailed.Load()))
	m.latency.Collect(ch)
}
