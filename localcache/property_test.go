package localcache_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/localcache"
)

// traceLimits is a small set of limits: every algorithm, block_for, soft
// margins, shadow mode, a zero limit, a sketch sharing its cells.
func traceLimits() []*sluice.Limit {
	ls := []*sluice.Limit{
		{Algorithm: sluice.FixedWindow, Rate: 3, Period: time.Second},
		{Algorithm: sluice.FixedWindow, Rate: 5, Period: time.Second}, // an override of the one above
		{Algorithm: sluice.TokenBucket, Rate: 2, Period: time.Second, Burst: 4},
		{Algorithm: sluice.TokenBucket, Rate: 4, Period: time.Second, Burst: 4, RefillInterval: 500 * time.Millisecond},
		{Algorithm: sluice.LeakyBucket, Rate: 3, Period: 700 * time.Millisecond},
		{Algorithm: sluice.GCRA, Rate: 5, Period: time.Second, Burst: 2},
		{Algorithm: sluice.SlidingWindow, Rate: 4, Period: time.Second},
		{Algorithm: sluice.SlidingLog, Rate: 3, Period: 1500 * time.Millisecond},
		{Algorithm: sluice.Sketch, Rate: 4, Period: time.Second, Sketch: sluice.SketchConfig{Width: 4, Depth: 2}},
		{Algorithm: sluice.FixedWindow, Rate: 2, Period: time.Second, BlockFor: 1200 * time.Millisecond},
		{Algorithm: sluice.GCRA, Rate: 2, Period: time.Second, BlockFor: 300 * time.Millisecond},
		{Algorithm: sluice.SlidingLog, Rate: 2, Period: time.Second, BlockFor: 2 * time.Second},
		{Algorithm: sluice.TokenBucket, Rate: 2, Period: time.Second, SoftPercent: 50},
		{Algorithm: sluice.SlidingWindow, Rate: 2, Period: time.Second, Shadow: true},
		{Algorithm: sluice.FixedWindow, Rate: 0, Period: time.Second},
	}
	for i, l := range ls {
		l.Name = fmt.Sprint("l", i)
	}
	return ls
}

// TestTrace runs random traces of requests through the cache over memstore
// A and directly through memstore B, on the same clock: the cache must
// never change whether a hit or a request is allowed, must report a
// RetryAfter no later than the store's, and must answer some requests
// itself.
func TestTrace(t *testing.T) {
	limits := traceLimits()
	keys := []string{"a", "b", "c"}
	seeds := 40
	if testing.Short() {
		seeds = 5
	}
	var local, total int
	for seed := range seeds {
		synctest.Test(t, func(t *testing.T) {
			e := newEnv(t, localcache.Config{MaxEntries: 8})
			rng := rand.New(rand.NewPCG(uint64(seed), 7))
			time.Sleep(time.Duration(rng.Int64N(int64(time.Second))))
			var last time.Duration // the longest finite RetryAfter seen last
			var hits []sluice.Hit
			for step := range 3000 {
				switch r := rng.IntN(10); {
				case r < 4:
				case r < 7:
					time.Sleep(time.Duration(rng.Int64N(int64(50 * time.Millisecond))))
				case r < 8 && last > 0:
					// Land exactly on the end of a RetryAfter, or 1ns
					// before it.
					time.Sleep(last - time.Duration(rng.IntN(2)))
				default:
					time.Sleep(time.Duration(rng.Int64N(int64(time.Second))))
				}
				// A third of the requests repeat the one before, as a
				// client retrying does.
				if hits == nil || rng.IntN(3) != 0 {
					hits = make([]sluice.Hit, 1+rng.IntN(3)*rng.IntN(2))
					for i := range hits {
						cost := int64(rng.IntN(4))
						if rng.IntN(20) == 0 {
							cost = 6 // above every burst
						}
						hits[i] = hit(keys[rng.IntN(len(keys))], limits[rng.IntN(len(limits))], cost)
					}
				}
				var got, want []sluice.Decision
				var wasLocal bool
				if len(hits) == 1 && rng.IntN(2) == 0 {
					g, w, l := e.one(hits[0])
					got, want, wasLocal = []sluice.Decision{g}, []sluice.Decision{w}, l
				} else {
					got, want, wasLocal = e.take(hits...)
				}
				total++
				if wasLocal {
					local++
				}
				last = 0
				for i := range hits {
					g, w := got[i], want[i]
					if g.Allowed != w.Allowed {
						t.Fatalf("seed %d step %d: hit %d of %+v: cache %+v, store %+v", seed, step, i, hits, g, w)
					}
					// A local answer may report a shorter RetryAfter (for a
					// cost above the cached one) and an older Remaining
					// (above a cost of 1), nothing else: the clock is the
					// same, and the cache saw all the traffic.
					if wasLocal && (g.RetryAfter > w.RetryAfter || g.RetryAfter == sluice.Never && w.RetryAfter != sluice.Never ||
						g.ResetAfter != w.ResetAfter || g.Limit != w.Limit || g.Blocked != w.Blocked ||
						hits[i].Cost == 1 && g.Remaining != w.Remaining || g.Index != w.Index || g.Over || g.Shadow) {
						t.Fatalf("seed %d step %d: local hit %d of %+v: cache %+v, store %+v", seed, step, i, hits, g, w)
					}
					if !wasLocal && g != w {
						t.Fatalf("seed %d step %d: hit %d (%s) of %+v passed to the store: %+v, store alone %+v", seed, step, i, hits[i].Limit.Name, hits, g, w)
					}
					if g.RetryAfter != sluice.Never {
						last = max(last, g.RetryAfter)
					}
				}
				if a, b := sluice.Overall(hits, got), sluice.Overall(hits, want); a.Allowed != b.Allowed {
					t.Fatalf("seed %d step %d: request %+v: cache %+v, store %+v", seed, step, hits, a, b)
				}
			}
			if st := e.cache.Stats(); st.Entries > 8 {
				t.Fatalf("seed %d: %+v", seed, st)
			}
		})
	}
	t.Logf("%d of %d requests answered locally", local, total)
	if local == 0 {
		t.Fatal("no request answered locally")
	}
}
