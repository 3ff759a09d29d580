package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testsupport/redistest"
	"github.com/sluicehq/sluice/internal/vocab/limits"
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
						s.batchOf(c, hits, i, "t", batch)
						i += n
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

// batchOf fills batch with requests as take builds them, one a hit of
// hits from hits[from] on (wrapping around).
func (s *Store) batchOf(c *conn, hits [][]sluice.Hit, from int, mode string, batch []*batchReq) {
	for j := range batch {
		h := hits[(from+j)%len(hits)]
		ops := make([]op, len(h))
		k := keyer{prefix: s.cfg.Prefix, tag: s.tag}
		for i := range h {
			s.encode(&k, &h[i], &ops[i])
		}
		g := groupBySlot(c, ops)[0]
		g.build(h, ops, "", mode, nil)
		batch[j] = &batchReq{g: g}
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

// floorLib is the least a script can do for a decision of a state kept
// as a string: read it, write it back keeping its TTL, answer two
// integers. BenchmarkFloor holds the store's script to it.
const floorLib = `#!lua name=sluice_floor
redis.register_function('sluice_floor', function(keys, args)
  local out = {}
  for i = 1, #keys do
    local v = redis.call('GET', keys[i])
    redis.call('SET', keys[i], v, 'KEEPTTL')
    out[2 * i - 1], out[2 * i] = -1, 0
  end
  return out
end)
`

// incrLib is the least a script can do for a decision of a state kept
// as a bare integer, as envoyproxy/ratelimit keeps its counters: one
// INCRBY a key, two integers answered. It is below any exact decision (it
// never reads a limit, never refuses, never sets a time to live).
const incrLib = `#!lua name=sluice_incr
redis.register_function('sluice_incr', function(keys, args)
  local out = {}
  for i = 1, #keys do
    out[2 * i - 1], out[2 * i] = -1 - redis.call('INCRBY', keys[i], 1), 0
  end
  return out
end)
`

// BenchmarkFloor compares, on one redis-server and 10k keys within their
// limits, what Redis spends on a decision (redis-cpu-ns/decision, INFO
// cpu, the round trips included): the store's fixed window in batches of
// n requests ("sluice-t", and "sluice-e" one by one, as the RLS server
// decides); floorLib's GET and SET on the same keys in calls
// of n ("floor"); incrLib's INCRBY in calls of n ("incr"); n INCRBY
// commands pipelined in one round trip, no script ("pipe": a decision's
// share of a round trip plus one command, the least any design that asks
// Redis can spend); and envoyproxy/ratelimit's way, INCRBY and EXPIRE sent
// together, a round trip a decision ("envoy").
func BenchmarkFloor(b *testing.B) {
	s, info := benchStore(b)
	c := s.client.Load()
	ctx := context.Background()
	for _, lib := range []string{floorLib, incrLib} {
		if _, err := info.Do("FUNCTION", "LOAD", "REPLACE", lib); err != nil {
			b.Fatal(err)
		}
	}
	l := &sluice.Limit{Name: "fw", Rate: 1e9, Period: 24 * time.Hour}
	const keys = 10000
	hits := make([][]sluice.Hit, keys)
	states := make([]string, keys)
	for i := range hits {
		hits[i] = []sluice.Hit{{Key: "k" + strconv.Itoa(i), Limit: l, Cost: 1}}
		if err := s.Take(ctx, hits[i], make([]sluice.Decision, 1)); err != nil {
			b.Fatal(err)
		}
		k := keyer{prefix: s.cfg.Prefix, tag: s.tag}
		p := limits.Params(l)
		states[i] = k.stateKey(&hits[i][0], &p)
	}
	measure := func(b *testing.B, n int, call func(i int)) {
		cpu := redisCPU(b, info)
		i := 0
		for b.Loop() {
			call(i)
			i += n
		}
		b.ReportMetric((redisCPU(b, info)-cpu)*1e9/float64(i), "redis-cpu-ns/decision")
		b.ReportMetric(0, "ns/op")
	}
	for _, n := range []int{1, 10} {
		// "t" as Take decides, "e" as the RLS server does (TakeEach).
		for _, mode := range []string{"t", "e"} {
			b.Run(fmt.Sprintf("sluice-%s/n=%d", mode, n), func(b *testing.B) {
				batch := make([]*batchReq, n)
				measure(b, n, func(i int) {
					b.StopTimer()
					s.batchOf(c, hits, i, mode, batch)
					b.StartTimer()
					s.call(c, batch)
					if err := batch[0].g.err; err != nil {
						b.Fatal(err)
					}
				})
			})
		}
		b.Run(fmt.Sprintf("floor/n=%d", n), func(b *testing.B) {
			ks := make([]string, n)
			measure(b, n, func(i int) {
				for j := range ks {
					ks[j] = states[(i+j)%keys]
				}
				if err := c.c.Do(ctx, c.c.B().Fcall().Function("sluice_floor").Numkeys(int64(n)).Key(ks...).Build()).Error(); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
	for _, n := range []int{1, 10} {
		b.Run(fmt.Sprintf("incr/n=%d", n), func(b *testing.B) {
			ks := make([]string, n)
			measure(b, n, func(i int) {
				for j := range ks {
					ks[j] = "incr:" + strconv.Itoa((i+j)%keys)
				}
				if err := c.c.Do(ctx, c.c.B().Fcall().Function("sluice_incr").Numkeys(int64(n)).Key(ks...).Build()).Error(); err != nil {
					b.Fatal(err)
				}
			})
		})
		b.Run(fmt.Sprintf("pipe/n=%d", n), func(b *testing.B) {
			cmds := make(rueidis.Commands, n)
			measure(b, n, func(i int) {
				for j := range cmds {
					cmds[j] = c.c.B().Incrby().Key("pipe:" + strconv.Itoa((i+j)%keys)).Increment(1).Build()
				}
				for _, r := range c.c.DoMulti(ctx, cmds...) {
					if err := r.Error(); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
	b.Run("envoy", func(b *testing.B) {
		measure(b, 1, func(i int) {
			k := "envoy:" + strconv.Itoa(i%keys)
			for _, r := range c.c.DoMulti(ctx, c.c.B().Incrby().Key(k).Increment(1).Build(), c.c.B().Expire().Key(k).Seconds(86400).Build()) {
				if err := r.Error(); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}
