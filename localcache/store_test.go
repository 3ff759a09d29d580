package localcache_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/localcache"
	"github.com/sluicehq/sluice/memstore"
)

var ctx = context.Background()

// counting is a store that counts the requests reaching the real store it
// wraps, which still decides them.
type counting struct {
	next  *memstore.Store
	calls atomic.Int64
}

func (c *counting) Take(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	c.calls.Add(1)
	return c.next.Take(ctx, hits, out)
}

func (c *counting) TakeOne(ctx context.Context, h sluice.Hit) (sluice.Decision, error) {
	c.calls.Add(1)
	return c.next.TakeOne(ctx, h)
}

func (c *counting) TakeEach(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	c.calls.Add(1)
	return c.next.TakeEach(ctx, hits, out)
}

func (c *counting) Close() error { return c.next.Close() }

// env is a cache over a counting memstore (A), and a second memstore (B)
// fed every request directly, on the same clock: what the store alone would
// have answered.
type env struct {
	t     *testing.T
	cache *localcache.Store
	a     *counting
	b     *memstore.Store
}

// newEnv makes an env; call it inside a synctest bubble, whose clock both
// memstores and the cache follow.
func newEnv(t *testing.T, cfg localcache.Config) *env {
	// One seed, so that both place sketch keys in the same cells.
	a := &counting{next: memstore.New(memstore.Config{SweepInterval: -1, Seed: 1})}
	b := memstore.New(memstore.Config{SweepInterval: -1, Seed: 1})
	t.Cleanup(func() { b.Close() })
	t.Cleanup(func() { a.Close() }) // the cache's Close leaves it open
	cache := localcache.New(a, cfg)
	t.Cleanup(func() { cache.Close() })
	return &env{t: t, cache: cache, a: a, b: b}
}

// take sends hits to the cache and to B, and returns both answers and
// whether the cache answered locally.
func (e *env) take(hits ...sluice.Hit) (got, want []sluice.Decision, local bool) {
	e.t.Helper()
	before := e.a.calls.Load()
	got = make([]sluice.Decision, len(hits))
	want = make([]sluice.Decision, len(hits))
	if err := e.cache.Take(ctx, hits, got); err != nil {
		e.t.Fatalf("cache Take: %v", err)
	}
	if err := e.b.Take(ctx, hits, want); err != nil {
		e.t.Fatalf("memstore Take: %v", err)
	}
	return got, want, e.a.calls.Load() == before
}

// one sends h through TakeOne to the cache and B.
func (e *env) one(h sluice.Hit) (got, want sluice.Decision, local bool) {
	e.t.Helper()
	before := e.a.calls.Load()
	got, err := e.cache.TakeOne(ctx, h)
	if err != nil {
		e.t.Fatalf("cache TakeOne: %v", err)
	}
	want, err = e.b.TakeOne(ctx, h)
	if err != nil {
		e.t.Fatalf("memstore TakeOne: %v", err)
	}
	return got, want, e.a.calls.Load() == before
}

// same fails unless the cache's decision equals the store's in every field.
func (e *env) same(what string, got, want sluice.Decision) {
	e.t.Helper()
	if got != want {
		e.t.Fatalf("%s: cache answered %+v, the store %+v", what, got, want)
	}
}

func hit(key string, l *sluice.Limit, cost int64) sluice.Hit {
	return sluice.Hit{Key: key, Limit: l, Cost: cost}
}

// kinds is one limit of each algorithm: 3 per second.
func kinds() []*sluice.Limit {
	var ls []*sluice.Limit
	for _, k := range []sluice.Algorithm{sluice.FixedWindow, sluice.TokenBucket, sluice.LeakyBucket,
		sluice.GCRA, sluice.SlidingWindow, sluice.SlidingLog, sluice.Sketch} {
		ls = append(ls, &sluice.Limit{Name: k.String(), Algorithm: k, Rate: 3, Period: time.Second})
	}
	return ls
}

// TestLocalUntilRetryAfter: a denied key is answered locally, exactly as
// the store would answer it, until its RetryAfter ends; then the store is
// asked again and allows.
func TestLocalUntilRetryAfter(t *testing.T) {
	for _, l := range kinds() {
		t.Run(l.Name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, localcache.Config{})
				time.Sleep(100 * time.Millisecond) // not on a window boundary
				h := hit("user:1", l, 1)
				var d sluice.Decision
				for {
					got, want, local := e.one(h)
					e.same("filling", got, want)
					if local {
						t.Fatal("answered locally before any denial")
					}
					if !got.Allowed {
						d = got
						break
					}
				}
				until := time.Now().Add(d.RetryAfter)
				for step := d.RetryAfter / 5; time.Now().Add(step).Before(until); {
					time.Sleep(step)
					got, want, local := e.one(h)
					if !local {
						t.Fatalf("at %v before the end of RetryAfter: asked the store", time.Until(until))
					}
					e.same("local", got, want)
				}
				time.Sleep(time.Until(until) - 1)
				got, want, local := e.one(h)
				if !local || got.RetryAfter != 1 {
					t.Fatalf("1ns before the end: local=%v %+v", local, got)
				}
				e.same("1ns before the end", got, want)
				time.Sleep(time.Nanosecond)
				got, want, local = e.one(h)
				if local || !got.Allowed {
					t.Fatalf("at the end of RetryAfter: local=%v %+v", local, got)
				}
				e.same("at the end", got, want)
				if st := e.cache.Stats(); st.Entries != 0 || st.Inserts != 1 {
					t.Fatalf("the expired entry was not dropped: %+v", st)
				}
			})
		})
	}
}

// TestCost: a denial at cost 5 answers costs of 5 and more, never less.
func TestCost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, localcache.Config{})
		l := &sluice.Limit{Rate: 10, Period: time.Minute}
		e.one(hit("k", l, 8))
		got, want, local := e.one(hit("k", l, 5))
		if local || got.Allowed {
			t.Fatalf("cost 5 with 2 left: local=%v %+v", local, got)
		}
		e.same("cost 5", got, want)
		time.Sleep(time.Second)
		got, want, local = e.one(hit("k", l, 7))
		if !local {
			t.Fatal("cost 7 after a denial at cost 5: asked the store")
		}
		// The cached RetryAfter is the cost 5 one, which for a fixed window
		// is the same; Remaining is unchanged as nothing was consumed.
		e.same("cost 7", got, want)
		got, want, local = e.one(hit("k", l, 1))
		if local || !got.Allowed {
			t.Fatalf("cost 1 after a denial at cost 5: local=%v %+v", local, got)
		}
		e.same("cost 1", got, want)
		// That consumed: the entry's Remaining is out of date, so it is
		// dropped and the next denial comes from the store again.
		got, want, local = e.one(hit("k", l, 5))
		if local || got.Allowed {
			t.Fatalf("cost 5 after cost 1: local=%v %+v", local, got)
		}
		e.same("cost 5 after cost 1", got, want)
		got, want, local = e.one(hit("k", l, 5))
		if !local {
			t.Fatal("cost 5 again: asked the store")
		}
		e.same("cost 5 again", got, want)
		// Above the capacity the store says Never, and so does the cache.
		got, want, local = e.one(hit("k", l, 11))
		if !local || got.RetryAfter != sluice.Never {
			t.Fatalf("cost 11 of 10: local=%v %+v", local, got)
		}
		e.same("cost 11", got, want)
	})
}

// TestOverrides: the same key string under another limit (a per-request
// override) is never answered from the entry of the first.
func TestOverrides(t *testing.T) {
	base := &sluice.Limit{Name: "base", Rate: 1, Period: time.Minute}
	others := map[string]*sluice.Limit{
		"rate":      {Name: "base", Rate: 100, Period: time.Minute},
		"period":    {Name: "base", Rate: 1, Period: time.Second},
		"algorithm": {Name: "base", Algorithm: sluice.SlidingWindow, Rate: 1, Period: time.Minute},
		"soft":      {Name: "base", Rate: 1, Period: time.Minute, SoftPercent: 100},
		"block_for": {Name: "base", Rate: 1, Period: time.Minute, BlockFor: time.Hour},
	}
	sk := &sluice.Limit{Name: "a", Algorithm: sluice.Sketch, Rate: 1, Period: time.Minute}
	sketches := map[string]*sluice.Limit{
		"sketch name":  {Name: "b", Algorithm: sluice.Sketch, Rate: 1, Period: time.Minute},
		"sketch width": {Name: "a", Algorithm: sluice.Sketch, Rate: 1, Period: time.Minute, Sketch: sluice.SketchConfig{Width: 64}},
	}
	check := func(t *testing.T, first, other *sluice.Limit) {
		synctest.Test(t, func(t *testing.T) {
			e := newEnv(t, localcache.Config{})
			e.one(hit("k", first, 1))
			if d, _, _ := e.one(hit("k", first, 1)); d.Allowed {
				t.Fatal("second hit allowed")
			}
			if _, _, local := e.one(hit("k", first, 1)); !local {
				t.Fatal("the denial was not cached")
			}
			got, want, local := e.one(hit("k", other, 1))
			if local {
				t.Fatalf("the other limit was answered from the first's entry: %+v", got)
			}
			// The store keeps separate state for each, except for a
			// limit that differs only in BlockFor.
			if !got.Allowed && other.BlockFor == 0 {
				t.Fatalf("the other limit: %+v", got)
			}
			e.same("other limit", got, want)
		})
	}
	for name, other := range others {
		t.Run(name, func(t *testing.T) { check(t, base, other) })
	}
	for name, other := range sketches {
		t.Run(name, func(t *testing.T) { check(t, sk, other) })
	}
}

// TestPassThrough: shadow limits, peeks and requests only partly covered
// by entries go to the store.
func TestPassThrough(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, localcache.Config{})
		l := &sluice.Limit{Rate: 1, Period: time.Minute}
		shadow := &sluice.Limit{Rate: 1, Period: time.Minute, Shadow: true}

		e.one(hit("s", shadow, 1))
		for i := range 3 {
			got, want, local := e.one(hit("s", shadow, 1))
			if local || got.Allowed {
				t.Fatalf("shadow %d: local=%v %+v", i, local, got)
			}
			e.same("shadow", got, want)
		}
		if st := e.cache.Stats(); st.Inserts != 0 {
			t.Fatalf("a shadow denial was cached: %+v", st)
		}

		e.one(hit("x", l, 1))
		e.one(hit("x", l, 1)) // denied, cached
		e.one(hit("y", l, 1))
		e.one(hit("y", l, 1)) // denied, cached
		if _, _, local := e.one(hit("x", l, 1)); !local {
			t.Fatal("x not cached")
		}
		got, want, local := e.one(hit("x", l, 0))
		if local || !got.Allowed {
			t.Fatalf("peek: local=%v %+v", local, got)
		}
		e.same("peek", got, want)

		gots, wants, local := e.take(hit("x", l, 1), hit("z", l, 1))
		if local {
			t.Fatal("x and z, z uncached: answered locally")
		}
		for i := range gots {
			e.same(fmt.Sprint("x and z, hit ", i), gots[i], wants[i])
		}
		gots, wants, local = e.take(hit("x", l, 1), hit("s", shadow, 1))
		if local {
			t.Fatal("x and a shadow hit: answered locally")
		}
		for i := range gots {
			e.same(fmt.Sprint("x and shadow, hit ", i), gots[i], wants[i])
		}
		gots, wants, local = e.take(hit("x", l, 1), hit("y", l, 1))
		if !local {
			t.Fatal("x and y, both cached: asked the store")
		}
		for i := range gots {
			e.same(fmt.Sprint("x and y, hit ", i), gots[i], wants[i])
		}
		if err := e.cache.Take(ctx, []sluice.Hit{hit("x", l, 1)}, nil); err == nil {
			t.Fatal("Take with a short out: no error")
		}
	})
}

// TestSameKeyTwice: a hit decided after an earlier hit on the same key in
// one request says nothing of that hit alone, and is not learned.
func TestSameKeyTwice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, localcache.Config{})
		l := &sluice.Limit{Rate: 5, Period: time.Minute}
		gots, wants, _ := e.take(hit("k", l, 3), hit("k", l, 3))
		if gots[0] != wants[0] || gots[1] != wants[1] || gots[1].Allowed {
			t.Fatalf("3+3 of 5: %+v, the store %+v", gots, wants)
		}
		got, want, local := e.one(hit("k", l, 3))
		if local || !got.Allowed {
			t.Fatalf("3 of 5 alone: local=%v %+v", local, got)
		}
		e.same("3 of 5 alone", got, want)
	})
}

// TestBlockFor: a blocked key is answered locally, at any cost, until the
// block ends, even when the algorithm alone would deny for longer.
func TestBlockFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, localcache.Config{})
		l := &sluice.Limit{Rate: 1, Period: time.Second, BlockFor: 10 * time.Second}
		e.one(hit("k", l, 1))
		got, _, _ := e.one(hit("k", l, 1))
		if !got.Blocked || got.RetryAfter != 10*time.Second {
			t.Fatalf("second hit: %+v", got)
		}
		for _, cost := range []int64{1, 1, 3, 1} {
			time.Sleep(2 * time.Second)
			got, want, local := e.one(hit("k", l, cost))
			if !local {
				t.Fatalf("cost %d during the block: asked the store", cost)
			}
			e.same("blocked", got, want)
		}
		time.Sleep(2 * time.Second) // the block ends
		got, want, local := e.one(hit("k", l, 1))
		if local || !got.Allowed {
			t.Fatalf("after the block: local=%v %+v", local, got)
		}
		e.same("after the block", got, want)

		// A cost above the burst: never allowed, but after the block a
		// denial starts a new block, which only the store can do.
		tb := &sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 1, Period: time.Second, Burst: 2, BlockFor: 5 * time.Second}
		got, want, _ = e.one(hit("big", tb, 3))
		if !got.Blocked || got.RetryAfter != sluice.Never {
			t.Fatalf("cost 3 of 2: %+v", got)
		}
		e.same("cost 3 of 2", got, want)
		time.Sleep(4 * time.Second)
		if got, want, local = e.one(hit("big", tb, 1)); !local {
			t.Fatal("cost 1 during the block: asked the store")
		}
		e.same("cost 1 during the block", got, want)
		time.Sleep(time.Second)
		if got, want, local = e.one(hit("big", tb, 3)); local || !got.Blocked {
			t.Fatalf("cost 3 after the block: local=%v %+v", local, got)
		}
		e.same("cost 3 after the block", got, want)
		time.Sleep(time.Second)
		if got, want, local = e.one(hit("big", tb, 1)); !local {
			t.Fatal("cost 1 during the second block: asked the store")
		}
		e.same("cost 1 during the second block", got, want)
	})
}

// TestNever: a request that can never be allowed stays local, reporting
// the store's window as it moves on.
func TestNever(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, localcache.Config{})
		zero := &sluice.Limit{Rate: 0, Period: time.Second}
		big := &sluice.Limit{Algorithm: sluice.GCRA, Rate: 2, Period: time.Second}
		e.one(hit("z", zero, 1))
		e.one(hit("b", big, 3))
		for i := range 20 {
			time.Sleep(370 * time.Millisecond)
			for _, h := range []sluice.Hit{hit("z", zero, 1), hit("b", big, 3)} {
				got, want, local := e.one(h)
				if !local || got.RetryAfter != sluice.Never {
					t.Fatalf("step %d, %q: local=%v %+v", i, h.Key, local, got)
				}
				e.same(fmt.Sprint("step ", i), got, want)
			}
		}
	})
}

// errStore fails every request.
type errStore struct{}

var errDown = errors.New("down")

func (errStore) Take(context.Context, []sluice.Hit, []sluice.Decision) error { return errDown }

func TestErrors(t *testing.T) {
	c := localcache.New(errStore{}, localcache.Config{})
	l := &sluice.Limit{Rate: 1, Period: time.Second}
	if _, err := c.TakeOne(ctx, hit("k", l, 1)); err != errDown {
		t.Fatalf("TakeOne: %v, want the store's error unchanged", err)
	}
	if err := c.Take(ctx, []sluice.Hit{hit("k", l, 1)}, make([]sluice.Decision, 1)); err != errDown {
		t.Fatalf("Take: %v, want the store's error unchanged", err)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.TakeOne(canceled, hit("k", l, 1)); err != context.Canceled {
		t.Fatalf("TakeOne, canceled: %v", err)
	}
	if st := c.Stats(); st.Inserts != 0 || st.Misses != 2 {
		t.Fatalf("stats: %+v", st)
	}
	if c.Unwrap() != (errStore{}) || c.Close() != nil || c.Health() != nil {
		t.Fatal("Unwrap, Close or Health")
	}
}

// TestSizeBound: entries never exceed MaxEntries; expired entries go first,
// live ones are evicted and counted; the metrics report Stats.
func TestSizeBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const max = 256
		e := newEnv(t, localcache.Config{MaxEntries: max})
		short := &sluice.Limit{Rate: 0, Period: time.Second, BlockFor: time.Second}
		forever := &sluice.Limit{Rate: 0, Period: time.Second}
		// Half full: the entries are spread over shards, each holding a
		// share of MaxEntries.
		for i := range max / 2 {
			e.one(hit(fmt.Sprint("short:", i), short, 1))
		}
		st := e.cache.Stats()
		if st.Evictions != 0 || st.Entries != max/2 {
			t.Fatalf("after %d inserts: %+v", max/2, st)
		}
		time.Sleep(time.Second) // every entry expires
		for i := range 4 * max {
			e.one(hit(fmt.Sprint("forever:", i), forever, 1))
			if st = e.cache.Stats(); st.Entries > max {
				t.Fatalf("insert %d: %+v", i, st)
			}
			if i < max/2 && st.Evictions != 0 {
				t.Fatalf("insert %d evicted a live entry while expired ones remained: %+v", i, st)
			}
		}
		if st.Evictions != 4*max-st.Entries || st.Inserts != max/2+4*max || st.Entries < max*3/4 {
			t.Fatalf("after all inserts: %+v", st)
		}
		// The metrics, gathered as Prometheus would scrape them.
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(e.cache.Collector(""))
		want := map[string]float64{
			"sluice_local_cache_hits_total":      float64(st.Hits),
			"sluice_local_cache_misses_total":    float64(st.Misses),
			"sluice_local_cache_inserts_total":   float64(st.Inserts),
			"sluice_local_cache_evictions_total": float64(st.Evictions),
			"sluice_local_cache_entries":         float64(st.Entries),
			"sluice_decisions_total":             float64(st.Hits), // where="local_cache"
		}
		if got := gather(t, reg); !maps.Equal(got, want) {
			t.Fatalf("metrics %v, want %v", got, want)
		}
		edge := prometheus.NewPedanticRegistry()
		edge.MustRegister(e.cache.Collector("edge"))
		if _, ok := gather(t, edge)["edge_local_cache_entries"]; !ok {
			t.Fatal("namespace edge: no edge_local_cache_entries")
		}
	})
}

// TestStats: hits and misses count requests, local and passed on.
func TestStats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, localcache.Config{})
		l := &sluice.Limit{Rate: 1, Period: time.Minute}
		for range 10 {
			e.one(hit("k", l, 1))
		}
		e.take(hit("k", l, 1), hit("k2", l, 0))
		want := localcache.Stats{Hits: 8, Misses: 3, Inserts: 2, Entries: 1}
		if st := e.cache.Stats(); st != want {
			t.Fatalf("stats %+v, want %+v", st, want)
		}
	})
}

// TestConcurrent hammers a few keys from many goroutines, under -race:
// decisions stay those of the store, and the cache answers some of them.
func TestConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, localcache.Config{MaxEntries: 64})
		lim := sluice.NewLimiter(e.cache)
		limits := kinds()
		var allowed [8]atomic.Int64
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Go(func() {
				for i := range 300 {
					l := limits[(g+i)%len(limits)]
					key := fmt.Sprint("k", i%3)
					d, err := lim.AllowN(ctx, key, l, int64(1+i%2))
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						allowed[(g+i)%len(limits)].Add(1)
					}
					if i%50 == 0 {
						time.Sleep(100 * time.Millisecond)
					}
					if i%97 == 0 {
						// Fill the cache to make it evict.
						e.cache.TakeOne(ctx, hit(fmt.Sprint("z", g, i), &sluice.Limit{Period: time.Second}, 1))
					}
				}
			})
		}
		wg.Wait()
		st := e.cache.Stats()
		if st.Hits == 0 || st.Entries > 64 || st.Hits+st.Misses != 16*300+16*4 {
			t.Fatalf("stats: %+v", st)
		}
		// Every algorithm admits at most 3 per second per key, 2 seconds of
		// virtual time at most (6 sleeps of 100ms per goroutine, run
		// together), 3 keys; plus the sketch's and the windows' edges.
		for i := range limits {
			if n := allowed[i].Load(); n > 3*3*3 {
				t.Errorf("%s: %d allowed", limits[i].Name, n)
			}
		}
	})
}

// gather returns the value of every metric of reg, by name. (The
// prometheus/testutil package would need a module the build does not have.)
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	m := make(map[string]float64)
	for _, mf := range mfs {
		for _, x := range mf.GetMetric() {
			switch {
			case x.GetCounter() != nil:
				m[mf.GetName()] = x.GetCounter().GetValue()
			case x.GetGauge() != nil:
				m[mf.GetName()] = x.GetGauge().GetValue()
			}
		}
	}
	return m
}

// takeOnly hides everything of a store but Take.
type takeOnly struct{ sluice.Store }

// healthy is a store with Health and Close.
type healthy struct {
	takeOnly
	closed bool
}

func (h *healthy) Health() error { return errDown }
func (h *healthy) Close() error  { h.closed = true; return errDown }

// TestForwarding: a store without TakeOne is called through Take, Health
// reaches the wrapped store, and Close does not: a decorator never closes
// the store below (internal/stores/decorator).
func TestForwarding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := memstore.New(memstore.Config{SweepInterval: -1})
		defer m.Close()
		next := &healthy{takeOnly: takeOnly{m}}
		c := localcache.New(next, localcache.Config{})
		l := &sluice.Limit{Rate: 1, Period: time.Second}
		for i, want := range []bool{true, false, false} {
			d, err := c.TakeOne(ctx, hit("k", l, 1))
			if err != nil || d.Allowed != want {
				t.Fatalf("request %d: %+v, %v", i, d, err)
			}
		}
		if st := c.Stats(); st.Hits != 1 || st.Misses != 2 {
			t.Fatalf("stats %+v", st)
		}
		if c.Unwrap() != next || c.Health() != errDown {
			t.Fatal("Unwrap or Health not forwarded")
		}
		if err := c.Close(); err != nil || next.closed {
			t.Fatalf("Close: %v, store below closed %v; want nil, false", err, next.closed)
		}
	})
}

// each is take for requests decided one by one (TakeEach).
func (e *env) each(hits ...sluice.Hit) (got, want []sluice.Decision, local bool) {
	e.t.Helper()
	before := e.a.calls.Load()
	got = make([]sluice.Decision, len(hits))
	want = make([]sluice.Decision, len(hits))
	if err := e.cache.TakeEach(ctx, hits, got); err != nil {
		e.t.Fatalf("cache TakeEach: %v", err)
	}
	if err := e.b.TakeEach(ctx, hits, want); err != nil {
		e.t.Fatalf("store TakeEach: %v", err)
	}
	return got, want, e.a.calls.Load() == before
}

// TestEach: requests decided one by one are answered locally only from
// entries that deny every cost (a denial of cost 1, an overdrawn hit), so
// that a hit that would overdraw once its limit has room again always
// reaches the store; what the cache answers is what the store would.
func TestEach(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, localcache.Config{})
		l := &sluice.Limit{Rate: 10, Period: time.Minute}
		e.each(hit("k", l, 8))
		// A charge of 5 with 2 left overdraws: the store is asked.
		got, want, local := e.each(hit("k", l, 5))
		if local || !got[0].Overdrawn {
			t.Fatalf("overdrawing charge: %+v, local %v", got[0], local)
		}
		e.same("overdrawing charge", got[0], want[0])
		// Every cost is denied until the debt is repaid: answered here.
		for _, cost := range []int64{1, 3, 50} {
			got, want, local = e.each(hit("k", l, cost))
			if !local || got[0].Allowed {
				t.Fatalf("cost %d in debt: %+v, local %v, want a local denial", cost, got[0], local)
			}
			if got[0].Allowed != want[0].Allowed || got[0].RetryAfter != want[0].RetryAfter {
				t.Fatalf("cost %d in debt: cache %+v, store %+v", cost, got[0], want[0])
			}
		}
		// A denial of cost 3 on a limit with 2 left (learned by Take)
		// does not answer TakeEach, where the hit overdraws.
		m := &sluice.Limit{Rate: 10, Period: time.Minute}
		e.take(hit("m", m, 8))
		if got, _, _ := e.take(hit("m", m, 3)); got[0].Allowed {
			t.Fatalf("cost 3 with 2 left: %+v", got[0])
		}
		if _, _, local := e.take(hit("m", m, 3)); !local {
			t.Fatal("Take: the cost-3 denial was not answered locally")
		}
		got, want, local = e.each(hit("m", m, 3))
		if local || !got[0].Overdrawn {
			t.Fatalf("TakeEach after a cost-3 denial: %+v, local %v, want the store's overdrawn hit", got[0], local)
		}
		e.same("TakeEach after a cost-3 denial", got[0], want[0])
	})
}

// TestEachOverTakeOnly: over a store without TakeEach, TakeEach decides
// each hit with a Take of its own: the hits are independent (a request
// denied by one still consumes the other), and nothing is overdrawn.
func TestEachOverTakeOnly(t *testing.T) {
	m := memstore.New(memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { m.Close() })
	cache := localcache.New(takeOnly{m}, localcache.Config{})
	t.Cleanup(func() { cache.Close() })
	one := &sluice.Limit{Rate: 1, Period: time.Hour}
	ten := &sluice.Limit{Rate: 10, Period: time.Hour}
	out := make([]sluice.Decision, 2)
	for i := range 3 {
		if err := cache.TakeEach(ctx, []sluice.Hit{hit("u", one, 1), hit("ip", ten, 1)}, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Allowed != (i == 0) || !out[1].Allowed || out[1].Remaining != int64(9-i) {
			t.Fatalf("request %d: %+v", i+1, out)
		}
	}
	// A charge of 5 with 7 left fits; one of 5 with 2 left is denied
	// and overdraws nothing.
	if err := cache.TakeEach(ctx, []sluice.Hit{hit("ip", ten, 5), hit("ip2", ten, 8)}, out); err != nil {
		t.Fatal(err)
	}
	if err := cache.TakeEach(ctx, []sluice.Hit{hit("ip2", ten, 5)}, out[:1]); err != nil {
		t.Fatal(err)
	}
	if out[0].Allowed || out[0].Overdrawn {
		t.Fatalf("charge of 5 with 2 left: %+v, want denied, not overdrawn", out[0])
	}
}
