package redisstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
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
	srv := redistest.Standalone(b)
	s := newTestStore(b, Config{URL: srv.URL(), Heartbeat: -1}, nil)
	info, err := srv.Dial()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { info.Close() })
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

// redisCPU returns the CPU seconds the server of c has used.
func redisCPU(b *testing.B, c *redistest.Conn) float64 {
	v, err := c.UsedCPU()
	if err != nil {
		b.Fatal(err)
	}
	return v
}
