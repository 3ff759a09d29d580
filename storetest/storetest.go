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
// store with TakeEach ([sluice.Store]) it checks that contract too:
// hits decided one by one, and debts (algo.Overdraw); a store without it
// is checked through Limiter.TakeEach's fallback. For a store with Settle
// it checks settlements (Limiter.Settle) against algo.Settle; a store
// without it must refuse them. Every store decides the permits of
// Concurrency limits in Take and TakeEach; for a store with Release and
// Renew it checks those too, and many holders of one key at once through
// Limiter.Acquire, which must refuse a store without them.
//
// The store must read the suite's Clock for every decision. This package
// imports sluice, algo and the standard library, never a store.
package storetest

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
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
		{"WindowOffset", s.windowOffset},
		{"CalendarSliding", s.calendarSliding},
		{"Settle", s.settle},
		{"Permits", s.permits},
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

// each decides hits one by one (Limiter.TakeEach).
func (e *env) each(hits ...sluice.Hit) (sluice.Decision, []sluice.Decision) {
	e.t.Helper()
	out := make([]sluice.Decision, len(hits))
	d, err := e.lim.TakeEach(context.Background(), hits, out)
	if err != nil {
		e.t.Fatalf("TakeEach: %v", err)
	}
	return d, out
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
