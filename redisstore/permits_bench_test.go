package redisstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

// BenchmarkPermit measures the permits of a Concurrency limit on a real
// redis-server, over 10,000 keys: Acquire then Release (the Permit's), one
// pair at a time; the same with a rate limit in the acquiring Take (a
// request's "4 at once and 600 a minute"); Renew of a held permit; and
// Acquire then Release from GOMAXPROCS goroutines at once, whose calls the
// store batches. ns/op is the pair's time, redis-cpu-ns/op the CPU
// redis-server used for it (INFO cpu), calls/op the script calls made.
func BenchmarkPermit(b *testing.B) {
	srv := redistest.Standalone(b)
	s := newTestStore(b, Config{URL: srv.URL(), Heartbeat: -1}, nil)
	lim := sluice.NewLimiter(s)
	info, err := srv.Dial()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { info.Close() })
	ctx := context.Background()
	conc := &sluice.Limit{Name: "conc", Algorithm: sluice.Concurrency, Rate: 4, Period: 15 * time.Second}
	rate := &sluice.Limit{Name: "rate", Rate: 1e9, Period: 24 * time.Hour}
	const keys = 10000
	key := func(i int) string { return "k" + strconv.Itoa(i%keys) }
	pair := func(i int) {
		p, d, err := lim.Acquire(ctx, []sluice.Hit{{Key: key(i), Limit: conc, Cost: 1}}, nil)
		if err != nil || p == nil {
			b.Fatalf("acquire %d: %+v %v", i, d, err)
		}
		if err := p.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range []struct {
		name     string
		run      func(i int)
		parallel bool
	}{
		{"acquire+release", pair, false},
		{"acquire+release/with_rate", func(i int) {
			hits := []sluice.Hit{{Key: key(i), Limit: rate, Cost: 1}, {Key: key(i), Limit: conc, Cost: 1, Permit: "p" + strconv.Itoa(i)}}
			out := make([]sluice.Decision, 2)
			if d, err := lim.Take(ctx, hits, out); err != nil || !d.Allowed {
				b.Fatalf("take %d: %+v %v", i, d, err)
			}
			if err := s.Permits(ctx, hits[1:], nil, true); err != nil {
				b.Fatal(err)
			}
		}, false},
		{"renew", func(i int) {
			h := []sluice.Hit{{Key: "held" + strconv.Itoa(i%keys), Limit: conc, Cost: 1, Permit: "p"}}
			out := make([]sluice.Decision, 1)
			if err := s.Permits(ctx, h, out, false); err != nil || !out[0].Allowed {
				b.Fatalf("renew %d: %+v %v", i, out[0], err)
			}
		}, false},
		{"acquire+release/parallel", pair, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			if c.name == "renew" {
				for i := range keys {
					h := []sluice.Hit{{Key: "held" + strconv.Itoa(i), Limit: conc, Cost: 1, Permit: "p"}}
					if _, err := lim.Take(ctx, h, make([]sluice.Decision, 1)); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportAllocs()
			cpu := redisCPU(b, info)
			calls := s.metrics.fcalls.Load()
			if c.parallel {
				b.RunParallel(func(pb *testing.PB) {
					for i := 0; pb.Next(); i++ {
						c.run(i)
					}
				})
			} else {
				i := 0
				for b.Loop() {
					c.run(i)
					i++
				}
			}
			b.ReportMetric((redisCPU(b, info)-cpu)*1e9/float64(b.N), "redis-cpu-ns/op")
			b.ReportMetric(float64(s.metrics.fcalls.Load()-calls)/float64(b.N), "calls/op")
		})
	}
}
