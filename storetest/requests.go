package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
)

// allOrNothing: a request denied by one limit consumes from none, whichever
// position the denying limit has.
func (s suite) allOrNothing(t *testing.T) {
	s.forKinds(t, func(t *testing.T, e *env, k algo.Kind) {
		day := &sluice.Limit{Name: "day", Algorithm: sluice.Algorithm(k), Rate: 100, Period: 24 * time.Hour}
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
		tight := &sluice.Limit{Name: "tight", Algorithm: sluice.Algorithm(k), Rate: 1, Period: 24 * time.Hour}
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
	shadow := &sluice.Limit{Name: "shadow", Algorithm: sluice.Algorithm(algo.GCRA), Rate: 1, Period: time.Second, Shadow: true}
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
		l := &sluice.Limit{Name: "login", Algorithm: sluice.Algorithm(k), Rate: 2, Period: time.Second, BlockFor: 10 * time.Second}
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

// sameKeyTwice: hits on one key in one request see each other.
func (s suite) sameKeyTwice(t *testing.T) {
	s.forKinds(t, func(t *testing.T, e *env, k algo.Kind) {
		l := &sluice.Limit{Algorithm: sluice.Algorithm(k), Rate: 3, Period: time.Minute}
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
