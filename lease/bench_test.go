package lease_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memstore"
)

// BenchmarkTake measures Store.Take on hits that leases serve, in
// parallel, over a memstore on the wall clock, with renewals in the
// background as in production: a fixed window far from its limit, so
// that a lease serves every hit but about one in ⌈U/4⌉ (the grants).
// "keys=1" is one hot key, all goroutines on one lease; "keys=10000"
// spreads them; "rest" adds to each request a hit that does not lease,
// which the memstore decides after the lease's reservation. grants/op is
// the calls made for grants (renewals included) per request.
func BenchmarkTake(b *testing.B) {
	ctx := context.Background()
	l := &sluice.Limit{Name: "bench", Rate: 1 << 40, Period: time.Hour, LeaseOvershoot: 4000}
	plain := &sluice.Limit{Name: "plain", Rate: 1 << 40, Period: time.Hour}
	for _, c := range []struct {
		name string
		keys int
		rest bool
	}{{"keys=1", 1, false}, {"keys=10000", 10_000, false}, {"rest/keys=10000", 10_000, true}} {
		b.Run(c.name, func(b *testing.B) {
			m := memstore.New(memstore.Config{SweepInterval: -1})
			defer m.Close()
			s := lease.New(m, lease.Config{})
			keys := make([]string, c.keys)
			for i := range keys {
				keys[i] = fmt.Sprintf("user:%d", i)
			}
			var start atomic.Uint64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				hits := []sluice.Hit{{Limit: l, Cost: 1}, {Limit: plain, Cost: 1}}
				if !c.rest {
					hits = hits[:1]
				}
				out := make([]sluice.Decision, len(hits))
				i := int(start.Add(7919) % uint64(len(keys)))
				for pb.Next() {
					hits[0].Key = keys[i]
					hits[len(hits)-1].Key = keys[i]
					if err := s.Take(ctx, hits, out); err != nil || !out[0].Allowed {
						b.Errorf("Take: %v, %+v", err, out[0])
						return
					}
					if i++; i == len(keys) {
						i = 0
					}
				}
			})
			if f := s.Stats().Fallback; f > 0 {
				b.Errorf("%d leasing hits decided by the store, want 0", f)
			}
			b.ReportMetric(float64(s.Stats().Grants)/float64(b.N), "grants/op")
		})
	}
}

// BenchmarkSweepFull measures a sweep of a Store holding DefaultMaxLeases
// leases of which none has expired: the walk that a full Store makes at
// most once a second (sweepEvery) when hits of new keys come.
func BenchmarkSweepFull(b *testing.B) {
	ctx := context.Background()
	m := memstore.New(memstore.Config{SweepInterval: -1})
	defer m.Close()
	var now time.Duration
	s := lease.New(m, lease.Config{Now: func() time.Duration { return now }, Go: func(f func()) { f() }})
	l := &sluice.Limit{Name: "w", Rate: 1 << 40, Period: time.Hour, LeaseOvershoot: 4000}
	out := make([]sluice.Decision, 1)
	for i := range lease.DefaultMaxLeases {
		if err := s.Take(ctx, []sluice.Hit{{Key: fmt.Sprint("k", i), Limit: l, Cost: 1}}, out); err != nil || !out[0].Allowed {
			b.Fatalf("Take: %v, %+v", err, out[0])
		}
	}
	if g := s.Stats().Grants; g != lease.DefaultMaxLeases {
		b.Fatalf("%d grants, want %d leases", g, lease.DefaultMaxLeases)
	}
	b.ReportAllocs()
	for b.Loop() {
		s.Sweep(now)
	}
}
