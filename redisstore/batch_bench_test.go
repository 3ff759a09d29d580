package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

// BenchmarkBatch measures what Redis spends on a decision inside one
// script call of a batch of n requests (one hit each), as batch.go builds
// it under load: redis-cpu-ns/decision is redis-server's CPU (INFO cpu)
// over the decisions, fcall-us/call the time commandstats counts inside
// the call. Varying n separates the cost of a call (the command, its
// arguments, the reply, the round trip) from that of a decision. Keys: 10k
// distinct keys within their limits, or one hot key (within its limit
// too, so that every hit commits).
func BenchmarkBatch(b *testing.B) {
	const day = 24 * time.Hour
	limits := []struct {
		name string
		l    *sluice.Limit
	}{
		{"fixed_window", &sluice.Limit{Name: "fw", Rate: 1e9, Period: day}},
		{"sliding_window", &sluice.Limit{Name: "sw", Rate: 1e9, Period: day, Algorithm: sluice.SlidingWindow}},
		{"token_bucket", &sluice.Limit{Name: "tb", Rate: 1e9, Period: day, Algorithm: sluice.TokenBucket}},
	}
	s, info := benchStore(b)
	c := s.client.Load()
	ctx := context.Background()
	const keys = 10000
	for _, lim := range limits {
		for _, hot := range []bool{false, true} {
			for _, n := range []int{1, 8, 32, 64} {
				scen := "10k"
				if hot {
					scen = "hot"
				}
				b.Run(fmt.Sprintf("%s/%s/n=%d", lim.name, scen, n), func(b *testing.B) {
					hits := make([][]sluice.Hit, keys)
					for i := range hits {
						k := "k" + strconv.Itoa(i)
						if hot {
							k = "hot"
						}
						hits[i] = []sluice.Hit{{Key: k, Limit: lim.l, Cost: 1}}
						if err := s.Take(ctx, hits[i], make([]sluice.Decision, 1)); err != nil {
							b.Fatal(err)
						}
					}
					// The requests as take builds them, n to a batch.
					batch := make([]*batchReq, n)
					i := 0
					next := func() {
						for j := range batch {
							h := hits[i%keys]
							i++
							ops := make([]op, 1)
							k := keyer{prefix: s.cfg.Prefix, tag: s.tag}
							s.encode(&k, &h[0], &ops[0])
							g := groupBySlot(c, ops)[0]
							g.build(h, ops, "", "t", nil)
							batch[j] = &batchReq{g: g}
						}
					}
					cmd0 := fcallUsec(b, info)
					cpu := redisCPU(b, info)
					calls := 0
					for b.Loop() {
						b.StopTimer()
						next()
						b.StartTimer()
						s.call(c, batch)
						calls++
						for _, r := range batch {
							if r.g.err != nil || r.g.res[0].v[0] != 1 {
								b.Fatalf("%v %v", r.g.err, r.g.res)
							}
						}
					}
					d := float64(calls * n)
					b.ReportMetric((redisCPU(b, info)-cpu)*1e9/d, "redis-cpu-ns/decision")
					b.ReportMetric((fcallUsec(b, info)-cmd0)/float64(calls), "fcall-us/call")
					b.ReportMetric(0, "ns/op")
				})
			}
		}
	}
}

// fcallUsec returns the microseconds commandstats counts in FCALL.
func fcallUsec(b *testing.B, c *redistest.Conn) float64 {
	v, err := c.Do("INFO", "commandstats")
	if err != nil {
		b.Fatal(err)
	}
	s, _ := v.(string)
	_, rest, _ := strings.Cut(s, "cmdstat_fcall:")
	_, rest, _ = strings.Cut(rest, "usec=")
	u, _, _ := strings.Cut(rest, ",")
	x, err := strconv.ParseFloat(u, 64)
	if err != nil {
		b.Fatalf("INFO commandstats: %q: %v", u, err)
	}
	return x
}
