package rlsclient

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// result is how a call ended, the label of the calls counter.
type result uint8

const (
	resultOK          result = iota // the remote decided
	resultInvalid                   // the remote refused the request (InvalidArgument)
	resultMalformed                 // the remote's answer does not fit the request
	resultError                     // the remote failed (unavailable, refused, ...): the policy answered
	resultTimeout                   // no answer within the deadline
	resultCanceled                  // the caller gave up
	resultBreakerOpen               // not called: the breaker is open; the policy answered
	numResults
)

var resultNames = [numResults]string{"ok", "invalid", "malformed", "error", "timeout", "canceled", "breaker_open"}

// metrics counts the Client's calls; Collector exports them under a
// namespace chosen then, so the duration histogram is the Client's own.
type metrics struct {
	calls    [numResults]atomic.Int64
	duration histogram
}

// durationBuckets are the upper bounds, in seconds, of the call duration
// histogram: from a loopback call to well past the default timeout.
var durationBuckets = [...]float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1}

// histogram is a Prometheus histogram of durations, lock-free.
type histogram struct {
	counts [len(durationBuckets) + 1]atomic.Uint64 // per bucket, the last +Inf
	sum    atomic.Int64                            // nanoseconds
}

func (h *histogram) observe(d time.Duration) {
	s := d.Seconds()
	i := 0
	for i < len(durationBuckets) && s > durationBuckets[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sum.Add(int64(d))
}

// Collector returns the Client's Prometheus metrics, named
// <namespace>_remote_<name> (remote_<name> with an empty namespace):
//
//   - calls_total{result}: calls by result: ok (the remote decided),
//     invalid (the remote refused the request), malformed (its answer did
//     not fit the request), error (it failed: unavailable, refused, any
//     other gRPC error), timeout (no answer within Timeout or the caller's
//     deadline), canceled (the caller gave up), breaker_open (not called).
//     The failure policy answered error and breaker_open, and timeout
//     unless the caller's deadline passed.
//   - up: 1 when the breaker is closed and the last call reached the
//     remote (see Health).
//   - breaker_state: 0 closed, 1 half-open, 2 open.
//   - call_duration_seconds: the time of the calls made, a histogram.
func (c *Client) Collector(namespace string) prometheus.Collector {
	name := func(n string) string { return prometheus.BuildFQName(namespace, "remote", n) }
	return &collector{
		c: c,
		calls: prometheus.NewDesc(name("calls_total"),
			"Calls to the remote rate limit service by result: ok, invalid, malformed, error, timeout, canceled, breaker_open (not called).",
			[]string{"result"}, nil),
		up: prometheus.NewDesc(name("up"),
			"1 when the remote rate limit service answers and the circuit breaker is closed.", nil, nil),
		breaker: prometheus.NewDesc(name("breaker_state"),
			"The remote rate limit service's circuit breaker: 0 closed, 1 half-open, 2 open.", nil, nil),
		duration: prometheus.NewDesc(name("call_duration_seconds"),
			"Time of a call to the remote rate limit service.", nil, nil),
	}
}

type collector struct {
	c                            *Client
	calls, up, breaker, duration *prometheus.Desc
}

func (co *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- co.calls
	ch <- co.up
	ch <- co.breaker
	ch <- co.duration
}

func (co *collector) Collect(ch chan<- prometheus.Metric) {
	m := &co.c.metrics
	for r := range numResults {
		ch <- prometheus.MustNewConstMetric(co.calls, prometheus.CounterValue, float64(m.calls[r].Load()), resultNames[r])
	}
	up := 0.0
	if co.c.Health() == nil {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(co.up, prometheus.GaugeValue, up)
	ch <- prometheus.MustNewConstMetric(co.breaker, prometheus.GaugeValue, float64(co.c.br.State()))
	buckets := make(map[float64]uint64, len(durationBuckets))
	var n uint64
	for i, b := range durationBuckets {
		n += m.duration.counts[i].Load()
		buckets[b] = n
	}
	n += m.duration.counts[len(durationBuckets)].Load()
	sum := float64(m.duration.sum.Load()) / float64(time.Second)
	ch <- prometheus.MustNewConstHistogram(co.duration, n, sum, buckets)
}
