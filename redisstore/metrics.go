package redisstore

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/base/wheremetric"
)

// metrics counts the store's calls; Collector exports them.
type metrics struct {
	ok, failed, rejected atomic.Int64
	probeFailed          atomic.Int64 // the probe's PINGs that failed
	forgot               atomic.Int64 // Redis found without the library once loaded
	shed                 atomic.Int64
	fcalls               atomic.Int64 // script calls that decide requests
	refundFailed         atomic.Int64
	permitsExpired       atomic.Int64 // permits the script dropped on expiry
	latency              prometheus.Histogram
}

func (m *metrics) init() {
	m.latency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sluice_redis_call_duration_seconds",
		Help:    "Time of a Redis store call (one script call per slot, in parallel), from when it had a slot among the calls in flight.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	})
}

// countExpired counts the permits the script dropped on expiry, which it
// reports with a hit's answer (take.lua).
func (m *metrics) countExpired(answers []answer) {
	var n int64
	for i := range answers {
		n += answers[i].dropped
	}
	if n > 0 {
		m.permitsExpired.Add(n)
	}
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
		"Nodes sharing the limits, as this node counts them from the Redis store's registry (this one included; 0 before it first read it): it rises at once and falls once the registry has held fewer for three heartbeats in a row. The local failure policy gives each node 1/N of every limit (N at least --local-nodes).", nil, nil)
	queuedDesc = prometheus.NewDesc("sluice_redis_queued",
		"Requests waiting for a slot among the calls in flight (at most --redis-max-queue; beyond it they are shed).", nil, nil)
	upDesc = prometheus.NewDesc("sluice_redis_up",
		"1 when the Redis store is connected and its circuit breaker closed.", nil, nil)
	refundDesc = prometheus.NewDesc("sluice_redis_refund_failures_total",
		"Cross-slot requests denied in one slot whose consumption in another could not be taken back (it stays consumed).", nil, nil)
	breakerDesc = prometheus.NewDesc("sluice_redis_breaker_state",
		"The Redis store's circuit breaker: 0 closed, 1 half-open, 2 open.", nil, nil)
	permitsExpiredDesc = wheremetric.PermitsExpiredDesc("redis")
)

// Stats counts the store's calls since it was created, and its state now.
type Stats struct {
	Calls        int64 // calls Redis answered
	Errors       int64 // calls Redis refused, stayed silent on, or lost the connection for
	Rejected     int64 // calls not made: not connected, or the circuit open
	Shed         int64 // calls not made: calls in flight and queue full
	ScriptCalls  int64 // decision script calls (FCALL); fewer than Calls when requests go together
	RefundFailed int64 // cross-slot consumption that could not be taken back
	InFlight     int   // calls in flight now
	Queued       int   // requests waiting for a slot now
	Nodes        int   // nodes sharing the limits, as counted from the registry (Store.Nodes)
	Up           bool  // connected and the circuit breaker closed
	BreakerState int   // 0 closed, 1 half-open, 2 open
	ProbeErrors  int64 // PINGs of an idle node's probe that failed: outages no call met (not in Errors)
	// Forgot counts the times this node found Redis without the function
	// library after it had loaded it there: a call that had to load it
	// again, or an idle node's probe that found it gone. Redis then
	// restarted empty, was flushed, or failed over to a replica that never
	// had it: its counters and permits are gone (a restart too quick for
	// any call or PING to fail shows here only).
	Forgot int64

	// PermitsExpired counts the permits of Concurrency limits that this
	// node's calls dropped because they reached their expiry unreleased
	// (their holders died, stalled, or never released them). Redis drops
	// a key's expired permits when a take, renewal or release finds them
	// there, whichever node made it, so the nodes' counts add up to the
	// fleet's; a key left untouched for a period after its last permit
	// expired disappears uncounted.
	PermitsExpired int64
}

// Stats returns the store's counters and state.
func (s *Store) Stats() Stats {
	m := &s.metrics
	return Stats{
		Calls:        m.ok.Load(),
		Errors:       m.failed.Load(),
		Rejected:     m.rejected.Load(),
		Shed:         m.shed.Load(),
		ScriptCalls:  m.fcalls.Load(),
		RefundFailed: m.refundFailed.Load(),
		InFlight:     int(s.gate.inFlight()),
		Queued:       int(s.gate.queued()),
		Nodes:        s.Nodes(),
		Up:           s.Health() == nil,
		BreakerState: int(s.br.State()),
		ProbeErrors:  m.probeFailed.Load(),
		Forgot:       m.forgot.Load(),

		PermitsExpired: m.permitsExpired.Load(),
	}
}

// Collector returns the store's Prometheus metrics, read from Stats: calls
// by result, call duration, calls in flight and queued, nodes, whether
// Redis is up, the circuit breaker's state, and the permits dropped on
// expiry (sluice_permits_expired_total{store="redis"}).
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
	ch <- permitsExpiredDesc
	c.s.metrics.latency.Describe(ch)
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v int) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	counter(callsDesc, st.Calls, "ok")
	counter(callsDesc, st.Errors, "error")
	counter(callsDesc, st.Rejected, "rejected")
	counter(callsDesc, st.Shed, "shed")
	counter(decisionsDesc, st.Calls)
	counter(fcallsDesc, st.ScriptCalls)
	counter(refundDesc, st.RefundFailed)
	counter(permitsExpiredDesc, st.PermitsExpired)
	gauge(inFlightDesc, st.InFlight)
	gauge(queuedDesc, st.Queued)
	gauge(nodesDesc, st.Nodes)
	up := 0
	if st.Up {
		up = 1
	}
	gauge(upDesc, up)
	gauge(breakerDesc, st.BreakerState)
	c.s.metrics.latency.Collect(ch)
}
