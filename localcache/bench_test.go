package localcache_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/localcache"
	"github.com/sluicehq/sluice/memstore"
)

// TestAllocs: a local answer allocates nothing, and neither does a request
// passed to memstore, which allocates nothing itself.
func TestAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	m := memstore.New(memstore.Config{SweepInterval: -1})
	defer m.Close()
	c := localcache.New(m, localcache.Config{})
	denied := &sluice.Limit{Rate: 1, Period: time.Hour}
	open := &sluice.Limit{Algorithm: sluice.GCRA, Rate: 1 << 30, Period: time.Second}
	c.TakeOne(ctx, hit("hot", denied, 1))
	c.TakeOne(ctx, hit("hot2", denied, 1))
	if d, _ := c.TakeOne(ctx, hit("hot", denied, 1)); d.Allowed {
		t.Fatal("hot key allowed")
	}
	c.TakeOne(ctx, hit("hot2", denied, 1))
	hits := []sluice.Hit{hit("hot", denied, 1), hit("hot2", denied, 1)}
	misses := []sluice.Hit{hit("a", open, 1), hit("b", open, 1)}
	out := make([]sluice.Decision, 2)
	for _, tc := range []struct {
		name string
		f    func()
	}{
		{"TakeOne local", func() { c.TakeOne(ctx, hits[0]) }},
		{"TakeOne to the store", func() { c.TakeOne(ctx, misses[0]) }},
		{"Take local", func() { c.Take(ctx, hits, out) }},
		{"Take to the store", func() { c.Take(ctx, misses, out) }},
	} {
		before := c.Stats()
		if n := testing.AllocsPerRun(1000, tc.f); n != 0 {
			t.Errorf("%s: %v allocations", tc.name, n)
		}
		if st := c.Stats(); st.Inserts != before.Inserts {
			t.Errorf("%s: learned a denial", tc.name)
		}
	}
	if st := c.Stats(); st.Hits < 2002 || st.Misses < 2002 {
		t.Fatalf("stats %+v", st)
	}
}

// oneTaker is a store that takes a single hit directly.
type oneTaker interface {
	TakeOne(ctx context.Context, hit sluice.Hit) (sluice.Decision, error)
}

// stores returns the stores to compare: the cache over memstore, and
// memstore alone.
func stores(b *testing.B) map[string]oneTaker {
	m := memstore.New(memstore.Config{SweepInterval: -1})
	b.Cleanup(func() { m.Close() })
	return map[string]oneTaker{
		"localcache": localcache.New(m, localcache.Config{}),
		"memstore":   m,
	}
}

// BenchmarkTakeOneCached measures a hot key over its limit, from every
// core: the cache answers it; memstore alone is the baseline.
func BenchmarkTakeOneCached(b *testing.B) {
	l := &sluice.Limit{Rate: 100, Period: time.Hour}
	for _, name := range []string{"localcache", "memstore"} {
		b.Run("store="+name, func(b *testing.B) {
			s := stores(b)[name]
			h := hit("user:42", l, 1)
			for range 101 {
				s.TakeOne(ctx, h)
			}
			if d, _ := s.TakeOne(ctx, h); d.Allowed {
				b.Fatal("not denied")
			}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					s.TakeOne(ctx, h)
				}
			})
		})
	}
}

// BenchmarkTakeOneMiss measures keys within their limit, which the cache
// passes to memstore: its cost over memstore alone.
func BenchmarkTakeOneMiss(b *testing.B) {
	l := &sluice.Limit{Algorithm: sluice.GCRA, Rate: 1 << 30, Period: time.Second}
	const n = 10_000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprint("user:", i)
	}
	for _, name := range []string{"localcache", "memstore"} {
		b.Run("store="+name, func(b *testing.B) {
			s := stores(b)[name]
			for _, k := range keys {
				s.TakeOne(ctx, hit(k, l, 1))
			}
			var start atomic.Uint64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(start.Add(7919) % n)
				for pb.Next() {
					s.TakeOne(ctx, hit(keys[i], l, 1))
					if i += 7919; i >= n {
						i -= n
					}
				}
			})
		})
	}
}
