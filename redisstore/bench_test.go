package redisstore

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

// BenchmarkTake measures the store's decisions on a real redis-server, one
// request at a time over 10,000 keys, all within their limits and all
// stored before the timer starts: ns/op is a
// request's round trip, redis-cpu-ns/op the CPU time redis-server used
// for it (INFO cpu: the command, the Lua function and the reply), which
// other load on the machine does not inflate. One request at a time, so
// that every request is one call (concurrent requests share calls; see
// batch.go). The cases of one hit take the lean paths of take.lua; two
// limits, and block_for, take its general path.
func BenchmarkTake(b *testing.B) {
	const day = 24 * time.Hour
	fw := &sluice.Limit{Name: "fw", Rate: 1e9, Period: day}
	gcra := &sluice.Limit{Name: "gcra", Rate: 1e9, Period: day, Algorithm: sluice.GCRA}
	cases := []struct {
		name   string
		limits []*sluice.Limit
		each   bool
	}{
		{"fixed_window", []*sluice.Limit{fw}, false},
		{"fixed_window/each", []*sluice.Limit{fw}, true},
		{"gcra", []*sluice.Limit{gcra}, false},
		{"sliding_window", []*sluice.Limit{{Name: "sw", Rate: 1e9, Period: day, Algorithm: sluice.SlidingWindow}}, false},
		{"sliding_log", []*sluice.Limit{{Name: "log", Rate: 1e6, Period: time.Second, Algorithm: sluice.SlidingLog}}, false},
		{"sketch", []*sluice.Limit{{Name: "sk", Rate: 1e9, Period: day, Algorithm: sluice.Sketch}}, false},
		{"block_for", []*sluice.Limit{{Name: "block", Rate: 1e9, Period: day, BlockFor: time.Minute}}, false},
		{"two_limits", []*sluice.Limit{fw, gcra}, false},
		{"two_limits/each", []*sluice.Limit{fw, gcra}, true},
	}
	s, info := benchStore(b)
	ctx := context.Background()
	const keys = 10000
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			reqs := make([][]sluice.Hit, keys)
			for i := range reqs {
				for _, l := range c.limits {
					reqs[i] = append(reqs[i], sluice.Hit{Key: "k" + strconv.Itoa(i), Limit: l, Cost: 1})
				}
			}
			out := make([]sluice.Decision, len(c.limits))
			take := s.Take
			if c.each {
				take = s.TakeEach
			}
			for _, r := range reqs {
				if err := take(ctx, r, out); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			cpu := redisCPU(b, info)
			i := 0
			for b.Loop() {
				if err := take(ctx, reqs[i%keys], out); err != nil {
					b.Fatal(err)
				}
				if !out[0].Allowed {
					b.Fatalf("request %d denied: %+v", i, out[0])
				}
				i++
			}
			b.ReportMetric((redisCPU(b, info)-cpu)*1e9/float64(b.N), "redis-cpu-ns/op")
		})
	}
}

// benchStore returns a store on a redis-server of its own, and a
// connection to read the server's counters.
func benchStore(b *testing.B) (*Store, *redistest.Conn) {
	srv := redistest.Standalone(b)
	s := newTestStore(b, Config{URL: srv.URL(), Heartbeat: -1}, nil)
	info, err := srv.Dial()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { info.Close() })
	return s, info
}

// redisCPU returns the CPU seconds the server of c has used.
func redisCPU(b *testing.B, c *redistest.Conn) float64 {
	v, err := c.UsedCPU()
	if err != nil {
		b.Fatal(err)
	}
	return v
}

// BenchmarkSettle measures settlements (sluice.Limiter.Settle) on one key
// on a real redis-server, each with its own ID: a charge of one hit, and
// a refund of one hit of a large reservation, one at a time (ns/op is a
// settlement's round trip, redis-cpu-ns/op what Redis spent on it), and
// the charges from GOMAXPROCS goroutines at once on the same key.
func BenchmarkSettle(b *testing.B) {
	const day = 24 * time.Hour
	srv := redistest.Standalone(b)
	s := newTestStore(b, Config{URL: srv.URL(), Heartbeat: -1}, nil)
	lim := sluice.NewLimiter(s)
	info, err := srv.Dial()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { info.Close() })
	ctx := context.Background()
	var id atomic.Uint64
	const big = 1 << 39
	for _, c := range []struct {
		name     string
		l        *sluice.Limit
		reserved int64
		refund   bool
		parallel bool
	}{
		{"fixed_window/charge", &sluice.Limit{Name: "fw", Rate: 1 << 40, Period: day}, 1, false, false},
		{"fixed_window/refund", &sluice.Limit{Name: "fw", Rate: 1 << 40, Period: day}, big, true, false},
		{"token_bucket/refund", &sluice.Limit{Name: "tb", Algorithm: sluice.TokenBucket, Rate: 1e6, Period: day, Burst: 1 << 40}, 1e6, true, false},
		{"fixed_window/charge/parallel", &sluice.Limit{Name: "fw", Rate: 1 << 40, Period: day}, 1, false, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			key := "k" + strconv.FormatUint(id.Add(1), 10)
			h := sluice.Hit{Key: key, Limit: c.l, Cost: c.reserved}
			at, err := srv.Time()
			if err != nil {
				b.Fatal(err)
			}
			d, err := lim.Take(ctx, []sluice.Hit{h}, make([]sluice.Decision, 1))
			if err != nil || !d.Allowed {
				b.Fatalf("reserving: %+v, %v", d, err)
			}
			spent, want := c.reserved+1, int64(1)
			if c.refund {
				spent, want = c.reserved-1, -1
			}
			settle := func() {
				st := &sluice.Settlement{Hit: h, Spent: spent, ResetAfter: d.ResetAfter, At: at, ID: id.Add(1)}
				if moved, err := lim.Settle(ctx, st); err != nil || moved != want {
					b.Errorf("settling: moved %d, %v; want %d", moved, err, want) // from RunParallel's goroutines too
				}
			}
			b.ReportAllocs()
			cpu := redisCPU(b, info)
			if c.parallel {
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						settle()
					}
				})
			} else {
				for b.Loop() {
					settle()
				}
			}
			b.ReportMetric((redisCPU(b, info)-cpu)*1e9/float64(b.N), "redis-cpu-ns/op")
		})
	}
}
