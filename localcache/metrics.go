package localcache

import (
	"math/bits"
	"runtime"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/base/wheremetric"
)

// Stats counts what the cache did since it was created.
type Stats struct {
	Hits      int64 // requests answered locally
	Misses    int64 // requests passed to the wrapped store, peeks and shadow hits included
	Inserts   int64 // denials learned, new or replacing an entry
	Evictions int64 // live entries dropped to respect MaxEntries
	Entries   int64 // entries held now, expired ones not yet dropped included
}

// Stats returns the cache's counters.
func (s *Store) Stats() Stats {
	st := Stats{
		Hits:      s.hits.sum(),
		Misses:    s.misses.sum(),
		Inserts:   s.inserts.Load(),
		Evictions: s.evictions.Load(),
	}
	for i := range s.shards {
		st.Entries += s.shards[i].n.Load()
	}
	return st
}

// stripes is a counter split across cache lines: every request adds to
// one, so that cores counting at once rarely write to the same line (one
// shared atomic would serialize a hot key's local answers).
type stripes struct {
	s     []stripe
	shift uint
}

type stripe struct {
	n atomic.Int64
	_ [56]byte
}

func newStripes() stripes {
	b := bits.Len(uint(4*runtime.GOMAXPROCS(0) - 1))
	b = min(b, 10)
	return stripes{s: make([]stripe, 1<<b), shift: uint(64 - b)}
}

// add counts one in the stripe that x picks. Callers pass the clock they
// have just read: its nanoseconds differ from call to call and from core to
// core, and picking by them is free, unlike a random number.
func (c *stripes) add(x uint64) {
	c.s[(x*0x9e3779b97f4a7c15)>>c.shift&uint64(len(c.s)-1)].n.Add(1)
}

func (c *stripes) sum() int64 {
	var n int64
	for i := range c.s {
		n += c.s[i].n.Load()
	}
	return n
}

// Collector returns the cache's Prometheus metrics, named
// NAMESPACE_local_cache_hits_total, _misses_total, _inserts_total,
// _evictions_total (counters) and _entries (a gauge), as Stats reports
// them, and the hits again as sluice_decisions_total{where="local_cache"}
// (whatever the namespace). An empty namespace means "sluice".
func (s *Store) Collector(namespace string) prometheus.Collector {
	if namespace == "" {
		namespace = "sluice"
	}
	name := func(n string) string { return prometheus.BuildFQName(namespace, "local_cache", n) }
	return &collector{
		s:         s,
		hits:      prometheus.NewDesc(name("hits_total"), "Requests answered by the local cache of denied keys, without asking the store.", nil, nil),
		misses:    prometheus.NewDesc(name("misses_total"), "Requests the local cache of denied keys passed to the store.", nil, nil),
		inserts:   prometheus.NewDesc(name("inserts_total"), "Denials learned by the local cache, new or replacing an entry.", nil, nil),
		evictions: prometheus.NewDesc(name("evictions_total"), "Live entries the local cache dropped to respect its size bound.", nil, nil),
		entries:   prometheus.NewDesc(name("entries"), "Entries held by the local cache of denied keys.", nil, nil),
		decided:   wheremetric.Desc("local_cache"),
	}
}

type collector struct {
	s                                         *Store
	hits, misses, inserts, evictions, entries *prometheus.Desc
	decided                                   *prometheus.Desc // sluice_decisions_total{where="local_cache"}: the hits
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.hits
	ch <- c.misses
	ch <- c.inserts
	ch <- c.evictions
	ch <- c.entries
	ch <- c.decided
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	counter := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	counter(c.hits, st.Hits)
	counter(c.decided, st.Hits)
	counter(c.misses, st.Misses)
	counter(c.inserts, st.Inserts)
	counter(c.evictions, st.Evictions)
	ch <- prometheus.MustNewConstMetric(c.entries, prometheus.GaugeValue, float64(st.Entries))
}
