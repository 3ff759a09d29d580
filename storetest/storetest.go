// Package storetest is the conformance suite of [sluice.Store]. Every store
// calls [Run] from its tests and passes all of it:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T, clock *storetest.Clock) sluice.Store {
//			return memstore.New(memstore.Config{Now: clock.Now})
//		})
//	}
//
// The suite checks the contract documented on sluice.Store: every algorithm
// decides exactly as the algo package says (a differential test on a random
// trace of times and costs), all-or-nothing requests, shadow limits,
// block_for, peeks, several hits on one key, concurrency, long keys, soft and
// elastic margins and the fields of a Decision. It also requires that two
// different limits given the same key string keep separate state. For a
// store with TakeEach ([sluice.EachTaker]) it checks that contract too:
// hits decided one by one, and debts (algo.Overdraw); a store without it
// is checked through Limiter.TakeEach's fallback.
//
// The store must read the suite's Clock for every decision. This package
// imports sluice, algo and the standard library, never a store.
package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/algo"
	"github.com/sluicehq/sluice/internal/limits"
)

// Run runs the whole suite against the stores newStore makes. newStore
// returns a new, empty store that reads clock for the time; it is called
// once per subtest, and should close the store through t.Cleanup.
func Run(t *testing.T, newStore func(t *testing.T, clock *Clock) sluice.Store) {
	s := suite{newStore: newStore}
	tests := []struct {
		name string
		f    func(*testing.T)
	}{
		{"Basic", s.basic},
		{"Trace", s.trace},
		{"ZeroLimit", s.zeroLimit},
		{"AllOrNothing", s.allOrNothing},
		{"Shadow", s.shadow},
		{"BlockFor", s.blockFor},
		{"Peek", s.peek},
		{"SameKeyTwice", s.sameKeyTwice},
		{"KeyIsolation", s.keyIsolation},
		{"LimitsShareKeyString", s.limitsShareKeyString},
		{"Concurrency", s.concurrency},
		{"ConcurrentAllOrNothing", s.concurrentAllOrNothing},
		{"LongKeys", s.longKeys},
		{"SoftAndElastic", s.softAndElastic},
		{"DecisionFields", s.decisionFields},
		{"CanceledContext", s.canceledContext},
		{"EachIndependent", s.eachIndependent},
		{"EachOverdraw", s.eachOverdraw},
		{"EachTrace", s.eachTrace},
	}
	for _, tc := range tests {
		t.Run(tc.name, tc.f)
	}
}

type suite struct {
	newStore func(t *testing.T, clock *Clock) sluice.Store
}

// env is one fresh store, its clock and a limiter over it.
type env struct {
	t     *testing.T
	clock *Clock
	store sluice.Store
	lim   *sluice.Limiter
}

func (s suite) env(t *testing.T) *env {
	clock := NewClock(Start)
	store := s.newStore(t, clock)
	return &env{t: t, clock: clock, store: store, lim: sluice.NewLimiter(store)}
}

// forKinds runs f in a subtest, on a fresh store, for each algorithm.
func (s suite) forKinds(t *testing.T, f func(t *testing.T, e *env, k algo.Kind)) {
	for _, k := range algo.Kinds() {
		t.Run(k.String(), func(t *testing.T) { f(t, s.env(t), k) })
	}
}

func hit(key string, l *sluice.Limit, n int64) sluice.Hit {
	return sluice.Hit{Key: key, Limit: l, Cost: n}
}

// take decides hits together and returns the overall and per-hit decisions.
func (e *env) take(hits ...sluice.Hit) (sluice.Decision, []sluice.Decision) {
	e.t.Helper()
	per := make([]sluice.Decision, len(hits))
	d, err := e.lim.Take(context.Background(), hits, per)
	if err != nil {
		e.t.Fatalf("Decide: %v", err)
	}
	return d, per
}

func (e *env) allow(key string, l *sluice.Limit, n int64) sluice.Decision {
	e.t.Helper()
	d, err := e.lim.AllowN(context.Background(), key, l, n)
	if err != nil {
		e.t.Fatalf("AllowN(%q, %d): %v", key, n, err)
	}
	return d
}

// want checks the fields of d that matter to the suite; what says which
// request it was.
func want(t *testing.T, what string, d sluice.Decision, allowed bool, remaining int64) {
	t.Helper()
	if d.Allowed != allowed || d.Remaining != remaining {
		t.Fatalf("%s: allowed=%v remaining=%d, want allowed=%v remaining=%d (decision %+v)",
			what, d.Allowed, d.Remaining, allowed, remaining, d)
	}
	if d.Allowed && d.RetryAfter != 0 {
		t.Fatalf("%s: allowed with RetryAfter %v", what, d.RetryAfter)
	}
	if !d.Allowed && d.RetryAfter <= 0 {
		t.Fatalf("%s: denied with RetryAfter %v", what, d.RetryAfter)
	}
	if d.Remaining < 0 || d.Remaining > d.Limit {
		t.Fatalf("%s: remaining %d outside [0, %d]", what, d.Remaining, d.Limit)
	}
}

// basic: admit up to the limit, deny the next with a finite RetryAfter,
// deny a cost above the limit with Never, admit again once replenished.
func (s suite) basic(t *testing.T) {
	s.forKinds(t, func(t *testing.T, e *env, k algo.Kind) {
		l := &sluice.Limit{Name: "basic", Algorithm: k, Rate: 4, Period: time.Second}
		for i := range 4 {
			d := e.allow("k", l, 1)
			want(t, fmt.Sprintf("request %d", i+1), d, true, int64(3-i))
			if d.Limit != 4 {
				t.Fatalf("Limit = %d, want 4", d.Limit)
			}
		}
		d := e.allow("k", l, 1)
		want(t, "request 5", d, false, 0)
		if d.RetryAfter > 2*time.Second {
			t.Fatalf("request 5: RetryAfter %v, want at most two periods", d.RetryAfter)
		}
		if d := e.allow("other", l, 5); d.Allowed || d.RetryAfter != sluice.Never {
			t.Fatalf("cost above the limit: %+v, want denied with RetryAfter Never", d)
		}
		if d := e.allow("other", l, 0); !d.Allowed || d.Remaining != 4 {
			t.Fatalf("a denied cost above the limit consumed: peek %+v", d)
		}
		e.clock.Advance(d.RetryAfter)
		if d := e.allow("k", l, 1); !d.Allowed {
			t.Fatalf("denied after waiting the RetryAfter of the denial: %+v", d)
		}
		e.clock.Advance(3 * time.Second)
		want(t, "after replenishing", e.allow("k", l, 1), true, 3)
	})
}

// trace compares the store with the algo package on a random trace: each
// decision must be exactly the one algo computes on the committed state.
// The sketch is left out: its estimate depends on the store's key hash.
func (s suite) trace(t *testing.T) {
	cases := []*sluice.Limit{
		{Name: "fw", Algorithm: algo.FixedWindow, Rate: 5, Period: time.Second},
		{Name: "fw-soft", Algorithm: algo.FixedWindow, Rate: 5, Period: time.Second, SoftPercent: 40},
		{Name: "tb", Algorithm: algo.TokenBucket, Rate: 5, Period: time.Second, Burst: 8},
		{Name: "tb-discrete", Algorithm: algo.TokenBucket, Rate: 5, Period: time.Second, Burst: 8, RefillInterval: 200 * time.Millisecond},
		{Name: "lb", Algorithm: algo.LeakyBucket, Rate: 5, Period: time.Second, Burst: 8},
		{Name: "gcra", Algorithm: algo.GCRA, Rate: 7, Period: time.Second, Burst: 3},
		{Name: "sw", Algorithm: algo.SlidingWindow, Rate: 6, Period: time.Second},
		{Name: "log", Algorithm: algo.SlidingLog, Rate: 6, Period: time.Second},
		{Name: "log-elastic", Algorithm: algo.SlidingLog, Rate: 6, Period: time.Second, ElasticCeiling: 9},
	}
	for li, l := range cases {
		t.Run(l.Name, func(t *testing.T) {
			e := s.env(t)
			p := limits.Params(l)
			rng := rand.New(rand.NewPCG(uint64(li), 0x5eed))
			costs := []int64{0, 1, 1, 1, 1, 2, 3, p.Capacity + 1}
			var st algo.State
			var log algo.Log
			for i := range 500 {
				step := time.Duration(rng.Int64N(int64(400 * time.Millisecond)))
				// Time goes backwards now and then, but never back across
				// the point where the state went idle: a store may forget
				// an idle state, and then a fresh key is all it can see.
				now := e.clock.Now().UnixNano()
				idle := st.A
				if len(log.Entries) > 0 {
					idle = log.Newest() + p.Period
				}
				if rng.IntN(25) == 0 && (idle > now || idle == 0) {
					step = -step
				}
				e.clock.Advance(step)
				now = e.clock.Now().UnixNano()
				n := costs[rng.IntN(len(costs))]
				var r algo.Result
				if l.Algorithm == algo.SlidingLog {
					r = logRef(&p, &log, now, n, false)
				} else {
					var next algo.State
					next, r = algo.Step(&p, st, now, n)
					if r.Allowed && n > 0 {
						st = next
					}
				}
				wantD := limits.Decision(l, r, &p)
				got := e.allow("trace", l, n)
				if got.Allowed != wantD.Allowed || got.Limit != wantD.Limit || got.Remaining != wantD.Remaining ||
					got.ResetAfter != wantD.ResetAfter || got.RetryAfter != wantD.RetryAfter || got.Over != wantD.Over {
					t.Fatalf("step %d (t=+%v, cost %d): store decided %+v, algo %+v",
						i, e.clock.Now().Sub(Start), n, got, wantD)
				}
			}
		})
	}
}

func (s suite) zeroLimit(t *testing.T) {
	s.forKinds(t, func(t *testing.T, e *env, k algo.Kind) {
		l := &sluice.Limit{Algorithm: k, Rate: 0, Period: time.Minute}
		for range 2 {
			if d := e.allow("k", l, 1); d.Allowed || d.RetryAfter != sluice.Never {
				t.Fatalf("zero limit: %+v, want denied with RetryAfter Never", d)
			}
		}
	})
}

// allOrNothing: a request denied by one limit consumes from none, whichever
// position the denying limit has.
func (s suite) allOrNothing(t *testing.T) {
	s.forKinds(t, func(t *testing.T, e *env, k algo.Kind) {
		day := &sluice.Limit{Name: "day", Algorithm: k, Rate: 100, Period: 24 * time.Hour}
		sec := &sluice.Limit{Name: "sec", Rate: 1, Period: time.Second}
		if d, _ := e.take(hit("u:day", day, 1), hit("u:sec", sec, 1)); !d.Allowed {
			t.Fatalf("first request denied: %+v", d)
		}
		d, per := e.take(hit("u:day", day, 1), hit("u:sec", sec, 1))
		if d.Allowed || d.Index != 1 || !per[0].Allowed || per[1].Allowed {
			t.Fatalf("second request: %+v %+v, want denied by the per-second limit (index 1)", d, per)
		}
		// Nothing was consumed, and the limit that would have allowed says
		// so: its Remaining is the state as it stands, not as if consumed.
		want(t, "per-day limit in a denied request", per[0], true, 99)
		if d, _ := e.take(hit("u:sec", sec, 1), hit("u:day", day, 1)); d.Allowed || d.Index != 0 {
			t.Fatalf("third request: %+v, want denied by the per-second limit (index 0)", d)
		}
		want(t, "per-day quota after two denials", e.allow("u:day", day, 0), true, 99)

		// The other way round: the limit of this algorithm denies, the
		// per-second window must not be consumed.
		tight := &sluice.Limit{Name: "tight", Algorithm: k, Rate: 1, Period: 24 * time.Hour}
		wide := &sluice.Limit{Name: "wide", Rate: 10, Period: time.Second}
		if d, _ := e.take(hit("v:wide", wide, 1), hit("v:tight", tight, 1)); !d.Allowed {
			t.Fatalf("first request on tight: %+v", d)
		}
		for range 3 {
			if d, _ := e.take(hit("v:wide", wide, 1), hit("v:tight", tight, 1)); d.Allowed || d.Index != 1 {
				t.Fatalf("request over tight: %+v, want denied by index 1", d)
			}
		}
		want(t, "wide quota after denials", e.allow("v:wide", wide, 0), true, 9)
	})
}

// shadow: a shadow limit reports but never denies, and one that would deny
// consumes nothing.
func (s suite) shadow(t *testing.T) {
	e := s.env(t)
	enforced := &sluice.Limit{Name: "enforced", Rate: 10, Period: time.Hour}
	shadow := &sluice.Limit{Name: "shadow", Algorithm: algo.GCRA, Rate: 1, Period: time.Second, Shadow: true}
	d, per := e.take(hit("e", enforced, 1), hit("s", shadow, 1))
	if !d.Allowed || d.Shadow || !per[1].Allowed {
		t.Fatalf("first request: %+v %+v", d, per)
	}
	for i := range 4 {
		d, per := e.take(hit("e", enforced, 1), hit("s", shadow, 1))
		if !d.Allowed || !d.Shadow || per[1].Allowed || !per[1].Shadow || d.Index != 0 {
			t.Fatalf("request %d: %+v %+v, want allowed, reporting the shadow denial", i+2, d, per)
		}
		if per[0].Remaining != int64(8-i) {
			t.Fatalf("request %d: enforced remaining %d, want %d", i+2, per[0].Remaining, 8-i)
		}
	}
	// The four denials were not committed: one period later the GCRA
	// shadow limit admits again.
	e.clock.Advance(time.Second)
	if d, per := e.take(hit("e", enforced, 1), hit("s", shadow, 1)); !d.Allowed || d.Shadow || !per[1].Allowed {
		t.Fatalf("after one period: %+v %+v, want the shadow limit to admit", d, per)
	}
	// Only shadow limits, all denying: the request passes.
	if d, _ := e.take(hit("s", shadow, 1)); !d.Allowed || !d.Shadow {
		t.Fatalf("shadow only: %+v, want allowed with Shadow", d)
	}
	// A shadow limit's denial does not stop the enforced ones from being
	// consumed, nor does an enforced denial consume the shadow limit.
	full := &sluice.Limit{Name: "full", Rate: 1, Period: time.Hour}
	e.allow("f", full, 1)
	e.clock.Advance(time.Second)
	if d, _ := e.take(hit("f", full, 1), hit("s", shadow, 1)); d.Allowed {
		t.Fatalf("denied by the enforced limit: %+v", d)
	}
	if d := e.allow("s", shadow, 1); !d.Allowed {
		t.Fatalf("the shadow limit was consumed by a denied request: %+v", d)
	}
}

// blockFor: a denial starts a block during which the key is denied whatever
// the algorithm says, with Blocked set and RetryAfter the time left.
func (s suite) blockFor(t *testing.T) {
	s.forKinds(t, func(t *testing.T, e *env, k algo.Kind) {
		l := &sluice.Limit{Name: "login", Algorithm: k, Rate: 2, Period: time.Second, BlockFor: 10 * time.Second}
		other := &sluice.Limit{Name: "other", Rate: 100, Period: time.Hour}
		for i := range 2 {
			want(t, fmt.Sprintf("request %d", i+1), e.allow("k", l, 1), true, int64(1-i))
		}
		d := e.allow("k", l, 1)
		if d.Allowed || !d.Blocked || d.RetryAfter != 10*time.Second || d.Remaining != 0 {
			t.Fatalf("the denial that starts the block: %+v, want Blocked with RetryAfter 10s", d)
		}
		want(t, "another key", e.allow("k2", l, 1), true, 1)
		e.clock.Advance(3 * time.Second)
		d = e.allow("k", l, 1)
		if d.Allowed || !d.Blocked || d.RetryAfter != 7*time.Second {
			t.Fatalf("3s into the block: %+v, want Blocked with RetryAfter 7s", d)
		}
		if d := e.allow("k", l, 0); d.Allowed || !d.Blocked {
			t.Fatalf("peek during the block: %+v, want Blocked", d)
		}
		bd, per := e.take(hit("o", other, 1), hit("k", l, 1))
		if bd.Allowed || !per[1].Blocked || bd.Index != 1 {
			t.Fatalf("request with the blocked key: %+v %+v", bd, per)
		}
		want(t, "the other limit after the blocked request", e.allow("o", other, 0), true, 100)
		e.clock.Advance(7*time.Second - 1)
		if d := e.allow("k", l, 1); d.Allowed || !d.Blocked || d.RetryAfter != 1 {
			t.Fatalf("1ns before the end of the block: %+v", d)
		}
		e.clock.Advance(1)
		d = e.allow("k", l, 1)
		if !d.Allowed || d.Blocked {
			t.Fatalf("after the block: %+v, want allowed", d)
		}
	})
}

// peek: cost 0 reports without consuming.
func (s suite) peek(t *testing.T) {
	s.forKinds(t, func(t *testing.T, e *env, k algo.Kind) {
		l := &sluice.Limit{Algorithm: k, Rate: 4, Period: time.Minute}
		want(t, "peek at a fresh key", e.allow("k", l, 0), true, 4)
		e.allow("k", l, 1)
		e.allow("k", l, 1)
		for range 3 {
			want(t, "peek after two hits", e.allow("k", l, 0), true, 2)
		}
		e.allow("k", l, 2)
		if d := e.allow("k", l, 0); d.Remaining != 0 {
			t.Fatalf("peek at an exhausted key: %+v", d)
		}
		want(t, "peek at another key", e.allow("k2", l, 0), true, 4)
	})
}

// sameKeyTwice: hits on one key in one request see each other.
func (s suite) sameKeyTwice(t *testing.T) {
	s.forKinds(t, func(t *testing.T, e *env, k algo.Kind) {
		l := &sluice.Limit{Algorithm: k, Rate: 3, Period: time.Minute}
		d, per := e.take(hit("k", l, 1), hit("k", l, 1))
		if !d.Allowed || per[0].Remaining != 2 || per[1].Remaining != 1 {
			t.Fatalf("first request: %+v %+v, want remaining 2 then 1", d, per)
		}
		d, per = e.take(hit("k", l, 1), hit("k", l, 1))
		// The first hit would fit, the second not; the request is denied,
		// so the first reports the stored state: 1 remaining.
		if d.Allowed || !per[0].Allowed || per[0].Remaining != 1 || per[1].Allowed {
			t.Fatalf("second request: %+v %+v, want the second hit to deny and the first to report 1 remaining", d, per)
		}
		want(t, "after the denied request", e.allow("k", l, 0), true, 1)
		want(t, "last hit", e.allow("k", l, 1), true, 0)
	})
}

// keyIsolation: keys do not share state, however alike.
func (s suite) keyIsolation(t *testing.T) {
	s.forKinds(t, func(t *testing.T, e *env, k algo.Kind) {
		l := &sluice.Limit{Algorithm: k, Rate: 2, Period: time.Minute}
		keys := []string{"a", "b", "", "a\x00", "A", "ab", "ba"}
		for _, key := range keys {
			want(t, fmt.Sprintf("key %q", key), e.allow(key, l, 2), true, 0)
		}
		for _, key := range keys {
			want(t, fmt.Sprintf("key %q again", key), e.allow(key, l, 1), false, 0)
		}
	})
}

// limitsShareKeyString: different limits given the same key string keep
// separate state.
func (s suite) limitsShareKeyString(t *testing.T) {
	e := s.env(t)
	sec := &sluice.Limit{Name: "sec", Rate: 1, Period: time.Second}
	day := &sluice.Limit{Name: "day", Rate: 100, Period: 24 * time.Hour}
	want(t, "per second", e.allow("k", sec, 1), true, 0)
	want(t, "per second again", e.allow("k", sec, 1), false, 0)
	want(t, "per day on the same key string", e.allow("k", day, 1), true, 99)
	for _, k := range algo.Kinds() {
		l := &sluice.Limit{Name: "x", Algorithm: k, Rate: 1, Period: time.Second}
		if k == algo.FixedWindow {
			l.Rate = 2 // differs from sec
		}
		want(t, k.String()+" on the same key string", e.allow("k", l, 1), true, l.Rate-1)
	}
}

// concurrency: many goroutines on one hot key; every algorithm admits
// exactly its capacity while the clock stands still.
func (s suite) concurrency(t *testing.T) {
	s.forKinds(t, func(t *testing.T, e *env, k algo.Kind) {
		const limit, workers, tries = 50, 16, 20
		l := &sluice.Limit{Algorithm: k, Rate: limit, Period: time.Hour}
		var admitted atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for range workers {
			wg.Go(func() {
				for range tries {
					d, err := e.lim.Allow(context.Background(), "hot", l)
					if err != nil {
						errs <- err
						return
					}
					if d.Allowed {
						admitted.Add(1)
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if got := admitted.Load(); got != limit {
			t.Fatalf("admitted %d of %d requests on a hot key, want exactly %d", got, workers*tries, limit)
		}
	})
}

// concurrentAllOrNothing: requests of two limits under contention consume
// both or neither.
func (s suite) concurrentAllOrNothing(t *testing.T) {
	e := s.env(t)
	const limit, workers, tries = 40, 8, 25
	shared := &sluice.Limit{Name: "shared", Rate: limit, Period: time.Hour}
	own := &sluice.Limit{Name: "own", Algorithm: algo.TokenBucket, Rate: 1000, Period: time.Hour}
	var wg sync.WaitGroup
	var admitted [workers]int64
	for w := range workers {
		wg.Go(func() {
			hits := []sluice.Hit{hit(fmt.Sprintf("own%d", w), own, 1), hit("shared", shared, 1)}
			for range tries {
				out := make([]sluice.Decision, len(hits))
				d, err := e.lim.Take(context.Background(), hits, out)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted[w]++
				}
			}
		})
	}
	wg.Wait()
	total := int64(0)
	for w, n := range admitted {
		total += n
		if d := e.allow(fmt.Sprintf("own%d", w), own, 0); 1000-d.Remaining != n {
			t.Errorf("worker %d: admitted %d but its own limit consumed %d", w, n, 1000-d.Remaining)
		}
	}
	if total != limit {
		t.Fatalf("admitted %d, want %d", total, limit)
	}
}

// longKeys: keys up to MaxKeyLen work, and differ by any byte.
func (s suite) longKeys(t *testing.T) {
	e := s.env(t)
	l := &sluice.Limit{Rate: 1, Period: time.Minute}
	base := strings.Repeat("k", sluice.MaxKeyLen)
	keys := []string{
		base,
		base[:sluice.MaxKeyLen-1] + "x",
		"x" + base[1:],
		base[:sluice.MaxKeyLen/2] + "x" + base[sluice.MaxKeyLen/2+1:],
		base[:sluice.MaxKeyLen-1],
	}
	for i, key := range keys {
		want(t, fmt.Sprintf("long key %d", i), e.allow(key, l, 1), true, 0)
	}
	for i, key := range keys {
		want(t, fmt.Sprintf("long key %d again", i), e.allow(key, l, 1), false, 0)
	}
	if _, err := e.lim.Allow(context.Background(), base+"k", l); err == nil {
		t.Fatalf("a key over MaxKeyLen was accepted")
	}
}

// softAndElastic: requests within the margin are admitted, reported Over,
// with Remaining 0 and the configured Limit.
func (s suite) softAndElastic(t *testing.T) {
	s.forKinds(t, func(t *testing.T, e *env, k algo.Kind) {
		for _, l := range []*sluice.Limit{
			{Name: "soft", Algorithm: k, Rate: 10, Period: time.Hour, SoftPercent: 20},
			{Name: "elastic", Algorithm: k, Rate: 10, Period: time.Hour, ElasticCeiling: 15},
		} {
			top := limits.Params(l).Capacity
			for i := range top {
				d := e.allow(l.Name, l, 1)
				what := fmt.Sprintf("%s request %d", l.Name, i+1)
				want(t, what, d, true, max(9-i, 0))
				if d.Over != (i >= 10) || d.Limit != 10 {
					t.Fatalf("%s: Over=%v Limit=%d", what, d.Over, d.Limit)
				}
			}
			d := e.allow(l.Name, l, 1)
			want(t, l.Name+" beyond the margin", d, false, 0)
			if d.Over {
				t.Fatalf("a denial reported Over: %+v", d)
			}
		}
	})
}

// decisionFields: Limit, Remaining, ResetAfter and RetryAfter at the
// boundaries, for a fixed window, a token bucket and a sliding log.
func (s suite) decisionFields(t *testing.T) {
	type check struct {
		at        time.Duration // since Start
		cost      int64
		allowed   bool
		remaining int64
		reset     time.Duration // -1: not checked
		retry     time.Duration
	}
	cases := []struct {
		limit  sluice.Limit
		checks []check
	}{
		{sluice.Limit{Name: "window", Rate: 5, Period: time.Minute}, []check{
			{10 * time.Second, 1, true, 4, 50 * time.Second, 0},
			{10 * time.Second, 3, true, 1, 50 * time.Second, 0},
			{20 * time.Second, 1, true, 0, 40 * time.Second, 0},
			{20 * time.Second, 1, false, 0, 40 * time.Second, 40 * time.Second},
			{time.Minute - 1, 1, false, 0, 1, 1},
			{time.Minute, 0, true, 5, -1, 0},
			{time.Minute, 5, true, 0, time.Minute, 0},
			{time.Minute, 6, false, 0, time.Minute, sluice.Never},
		}},
		{sluice.Limit{Name: "bucket", Algorithm: algo.TokenBucket, Rate: 1, Period: time.Second, Burst: 5}, []check{
			{0, 1, true, 4, time.Second, 0},
			{0, 4, true, 0, 5 * time.Second, 0},
			{0, 1, false, 0, 5 * time.Second, time.Second},
			{500 * time.Millisecond, 1, false, 0, 4500 * time.Millisecond, 500 * time.Millisecond},
			{time.Second, 1, true, 0, 5 * time.Second, 0},
			{time.Second, 6, false, 0, 5 * time.Second, sluice.Never},
			{6 * time.Second, 0, true, 5, 0, 0},
		}},
		{sluice.Limit{Name: "log", Algorithm: algo.SlidingLog, Rate: 3, Period: 10 * time.Second}, []check{
			{0, 1, true, 2, -1, 0},
			{time.Second, 1, true, 1, -1, 0},
			{2 * time.Second, 1, true, 0, -1, 0},
			{3 * time.Second, 1, false, 0, -1, 7 * time.Second},
			{10*time.Second - 1, 1, false, 0, -1, 1},
			{10 * time.Second, 1, true, 0, -1, 0},
			{10 * time.Second, 1, false, 0, -1, time.Second},
		}},
	}
	for _, c := range cases {
		t.Run(c.limit.Name, func(t *testing.T) {
			e := s.env(t)
			for i, ch := range c.checks {
				e.clock.Set(Start.Add(ch.at))
				d := e.allow("k", &c.limit, ch.cost)
				ok := d.Allowed == ch.allowed && d.Remaining == ch.remaining && d.RetryAfter == ch.retry &&
					d.Limit == c.limit.Nominal() && (ch.reset < 0 || d.ResetAfter == ch.reset)
				if !ok {
					t.Fatalf("check %d (t=+%v cost %d): got %+v, want allowed=%v remaining=%d reset=%v retry=%v limit=%d",
						i, ch.at, ch.cost, d, ch.allowed, ch.remaining, ch.reset, ch.retry, c.limit.Nominal())
				}
			}
		})
	}
}

func (s suite) canceledContext(t *testing.T) {
	e := s.env(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l := &sluice.Limit{Rate: 1, Period: time.Minute}
	if _, err := e.lim.Allow(ctx, "k", l); err == nil {
		t.Fatalf("Allow with a canceled context returned no error")
	}
	want(t, "after the canceled request", e.allow("k", l, 1), true, 0)
}

// each decides hits one by one (Limiter.TakeEach).
func (e *env) each(hits ...sluice.Hit) (sluice.Decision, []sluice.Decision) {
	e.t.Helper()
	out := make([]sluice.Decision, len(hits))
	d, err := e.lim.TakeEach(context.Background(), hits, out)
	if err != nil {
		e.t.Fatalf("DecideEach: %v", err)
	}
	return d, out
}

// eachIndependent: hits decided one by one, as envoyproxy/ratelimit
// counts descriptors: a request denied by one limit still consumes the
// others.
func (s suite) eachIndependent(t *testing.T) {
	s.forKinds(t, func(t *testing.T, e *env, k algo.Kind) {
		day := &sluice.Limit{Name: "day", Algorithm: k, Rate: 100, Period: 24 * time.Hour}
		sec := &sluice.Limit{Name: "sec", Rate: 1, Period: time.Second}
		if d, _ := e.each(hit("u:day", day, 1), hit("u:sec", sec, 1)); !d.Allowed {
			t.Fatalf("first request denied: %+v", d)
		}
		d, per := e.each(hit("u:day", day, 1), hit("u:sec", sec, 1))
		if d.Allowed || d.Index != 1 || !per[0].Allowed || per[1].Allowed {
			t.Fatalf("second request: %+v %+v, want denied by the per-second limit (index 1)", d, per)
		}
		// The per-day limit allowed its hit, and it was consumed.
		want(t, "per-day limit in a denied request", per[0], true, 98)
		want(t, "per-day quota after the denied request", e.allow("u:day", day, 0), true, 98)
		// The per-second limit was exhausted: its denial consumed nothing
		// (no debt, whatever the store).
		e.clock.Advance(time.Second)
		want(t, "per-second limit a second later", e.allow("u:sec", sec, 0), true, 1)
	})
}

// eachOverdraw: with TakeEach, the debit of envoyproxy/ratelimit's
// apply_on_stream_done pattern: a check of cost 0, a charge after the fact
// that goes over, and the next check denied until time repays the debt;
// a denied client digs no deeper. Without TakeEach, nothing is overdrawn.
func (s suite) eachOverdraw(t *testing.T) {
	s.forKinds(t, func(t *testing.T, e *env, k algo.Kind) {
		_, hasEach := e.store.(sluice.EachTaker)
		l := &sluice.Limit{Name: "tokens", Algorithm: k, Rate: 10, Period: time.Minute}
		if d, _ := e.each(hit("u", l, 8)); !d.Allowed {
			t.Fatalf("8 of 10: %+v", d)
		}
		if d, _ := e.each(hit("u", l, 0)); !d.Allowed {
			t.Fatalf("check before the charge: %+v", d)
		}
		d, per := e.each(hit("u", l, 5))
		if d.Allowed || per[0].Allowed || per[0].Overdrawn != hasEach {
			t.Fatalf("charge of 5 with 2 left: %+v, want denied, overdrawn %v", per[0], hasEach)
		}
		if !hasEach {
			// The fallback consumes nothing of a denied hit: 2 are left.
			want(t, "check after a denied charge (no TakeEach)", e.allow("u", l, 0), true, 2)
			return
		}
		if per[0].Remaining != 0 || per[0].RetryAfter <= 0 || per[0].RetryAfter == sluice.Never {
			t.Fatalf("overdrawn charge: %+v, want nothing remaining and a finite RetryAfter", per[0])
		}
		retry := per[0].RetryAfter
		if d, _ := e.each(hit("u", l, 0)); d.Allowed {
			t.Fatalf("check after the overdrawing charge: %+v, want denied (in debt)", d)
		}
		for range 3 {
			if d, per := e.each(hit("u", l, 2)); d.Allowed || per[0].Overdrawn {
				t.Fatalf("cost 2 in debt: %+v, want denied without overdrawing", per[0])
			}
		}
		// The same key twice in one request: the second hit sees the
		// debt the first left (here still the same debt: nothing fits).
		if _, per := e.each(hit("u", l, 1), hit("u", l, 0)); per[0].Allowed || per[1].Allowed {
			t.Fatalf("two hits in debt: %+v", per)
		}
		e.clock.Advance(retry)
		if d, _ := e.each(hit("u", l, 1)); !d.Allowed {
			t.Fatalf("cost 1 after the RetryAfter %v of the overdrawn charge: %+v", retry, d)
		}
		// Exhausted exactly, not in debt: a charge is counted on a fixed
		// window (its debt ends with its window) and on a limit charged
		// after the fact (Debit), so that the next check denies; on the
		// others it consumes nothing. In debt, no charge counts.
		for _, debit := range []bool{false, true} {
			f := &sluice.Limit{Name: fmt.Sprintf("full-%v", debit), Algorithm: k, Rate: 3, Period: time.Hour, Debit: debit}
			key := fmt.Sprintf("f-%v", debit)
			e.each(hit(key, f, 3))
			counted := k == algo.FixedWindow || debit
			if _, per := e.each(hit(key, f, 1)); per[0].Allowed || per[0].Overdrawn != counted {
				t.Fatalf("debit %v: charge of 1 on an exhausted limit: %+v, want denied, overdrawn %v", debit, per[0], counted)
			}
			if d, _ := e.each(hit(key, f, 0)); d.Allowed == counted || d.Remaining != 0 {
				t.Fatalf("debit %v: check after the charge on an exhausted limit: %+v, want allowed %v with 0 left", debit, d, !counted)
			}
			if _, per := e.each(hit(key, f, 1)); per[0].Allowed || per[0].Overdrawn {
				t.Fatalf("debit %v: a second charge: %+v, want denied, not overdrawn", debit, per[0])
			}
		}
		if k != algo.FixedWindow {
			return
		}
		// A zero fixed window (requests_per_unit: 0): envoyproxy/ratelimit
		// counts the denied hit, so a check after it in its window is
		// denied, and one in the next window is allowed. (Right after a
		// charge that found a window in debt: a Redis fast path once read
		// that debt for this one.)
		z := &sluice.Limit{Name: "zero", Algorithm: k, Rate: 0, Period: time.Minute}
		if d, _ := e.each(hit("z", z, 0)); !d.Allowed {
			t.Fatalf("check of a zero limit before any hit: %+v, want allowed", d)
		}
		if _, per := e.each(hit("z", z, 1)); per[0].Allowed || per[0].Overdrawn != hasEach {
			t.Fatalf("a hit on a zero limit: %+v, want denied, overdrawn %v", per[0], hasEach)
		}
		if d, _ := e.each(hit("z", z, 0)); d.Allowed == hasEach {
			t.Fatalf("check of a zero limit after a denied hit: %+v, want allowed %v", d, !hasEach)
		}
		if _, per := e.each(hit("z", z, 1)); per[0].Allowed || per[0].Overdrawn {
			t.Fatalf("a second hit on a zero limit: %+v, want denied, not overdrawn (in debt)", per[0])
		}
		e.clock.Advance(time.Minute)
		if d, _ := e.each(hit("z", z, 0)); !d.Allowed {
			t.Fatalf("check of a zero limit in the next window: %+v, want allowed", d)
		}
		if !hasEach {
			return
		}
		// A zero rate with an elastic ceiling of 2: charged until the
		// count passes the ceiling, on every store alike (a Redis fast
		// path once stopped at the first).
		zc := &sluice.Limit{Name: "zero-ceiling", Algorithm: k, Rate: 0, Period: time.Minute, ElasticCeiling: 2}
		for i, want := range []bool{true, true, true, false} {
			if _, per := e.each(hit("zc", zc, 1)); per[0].Allowed || per[0].Overdrawn != want {
				t.Fatalf("hit %d on a zero limit with a ceiling of 2: %+v, want denied, overdrawn %v", i, per[0], want)
			}
		}
	})
}

// eachTrace compares TakeEach with the algo package on a random trace, as
// trace does for Take: every decision exactly algo.Overdraw's (for sliding
// logs, LogStepEach with algo.Overdraws) on the state it left. A store
// without TakeEach is checked through Limiter.TakeEach's fallback, a
// Take a hit: algo.Step's (LogStep's) decisions, nothing overdrawn.
func (s suite) eachTrace(t *testing.T) {
	cases := []*sluice.Limit{
		{Name: "fw", Algorithm: algo.FixedWindow, Rate: 5, Period: time.Second},
		{Name: "tb", Algorithm: algo.TokenBucket, Rate: 5, Period: time.Second, Burst: 8},
		{Name: "tb-discrete", Algorithm: algo.TokenBucket, Rate: 5, Period: time.Second, Burst: 8, RefillInterval: 200 * time.Millisecond},
		{Name: "lb", Algorithm: algo.LeakyBucket, Rate: 5, Period: time.Second, Burst: 8},
		{Name: "gcra", Algorithm: algo.GCRA, Rate: 7, Period: time.Second, Burst: 3},
		{Name: "sw", Algorithm: algo.SlidingWindow, Rate: 6, Period: time.Second},
		{Name: "log", Algorithm: algo.SlidingLog, Rate: 6, Period: time.Second},
		{Name: "tb-debit", Algorithm: algo.TokenBucket, Rate: 5, Period: time.Second, Burst: 8, Debit: true},
		{Name: "sw-debit", Algorithm: algo.SlidingWindow, Rate: 6, Period: time.Second, Debit: true},
		{Name: "log-debit", Algorithm: algo.SlidingLog, Rate: 6, Period: time.Second, Debit: true},
	}
	for li, l := range cases {
		t.Run(l.Name, func(t *testing.T) {
			e := s.env(t)
			_, each := e.store.(sluice.EachTaker)
			p := limits.Params(l)
			rng := rand.New(rand.NewPCG(uint64(li), 0xeac4))
			costs := []int64{0, 0, 1, 1, 1, 2, 3, p.Capacity + 1}
			var st algo.State
			var log algo.Log
			for i := range 500 {
				e.clock.Advance(time.Duration(rng.Int64N(int64(300 * time.Millisecond))))
				now := e.clock.Now().UnixNano()
				n := costs[rng.IntN(len(costs))]
				var r algo.Result
				switch {
				case l.Algorithm == algo.SlidingLog:
					r = logRef(&p, &log, now, n, each)
				case each:
					st, r = algo.Overdraw(&p, st, now, n)
				default:
					var next algo.State
					next, r = algo.Step(&p, st, now, n)
					if r.Allowed && n > 0 {
						st = next
					}
				}
				wantD := limits.Decision(l, r, &p)
				_, per := e.each(hit("trace", l, n))
				got := per[0]
				if got.Allowed != wantD.Allowed || got.Remaining != wantD.Remaining || got.Overdrawn != wantD.Overdrawn ||
					got.ResetAfter != wantD.ResetAfter || got.RetryAfter != wantD.RetryAfter {
					t.Fatalf("step %d (t=+%v, cost %d): store decided %+v, algo %+v",
						i, e.clock.Now().Sub(Start), n, got, wantD)
				}
			}
		})
	}
}

// logRef is what a sliding log decides for a hit of cost n at now, and
// commits to log: all or nothing (LogStep), or one by one (LogStepEach,
// overdrawing as algo.Overdraws and algo.OverdrawsExhausted say).
func logRef(p *algo.Params, log *algo.Log, now, n int64, each bool) algo.Result {
	if !each {
		expired, r := algo.LogStep(p, log, now, n)
		cost := int64(0)
		if r.Allowed {
			cost = n
		}
		log.Commit(expired, now, cost)
		return r
	}
	expired, r := algo.LogStepEach(p, log, now, n)
	over := algo.Overdraws(r, n) || algo.OverdrawsExhausted(p, r, n, func() bool {
		_, peek := algo.LogStepEach(p, log, now, 0)
		return !peek.Allowed
	})
	cost := int64(0)
	if r.Allowed || over {
		cost = n
	}
	log.Commit(expired, now, cost)
	if over {
		_, after := algo.LogStep(p, log, now, 1)
		r = algo.Result{ResetAfter: after.ResetAfter, RetryAfter: after.RetryAfter, Overdrawn: true}
	}
	return r
}
