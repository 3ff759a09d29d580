package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
	"github.com/sluicehq/sluice/internal/stores/decorator"
)

// eachIndependent: hits decided one by one, as envoyproxy/ratelimit
// counts descriptors: a request denied by one limit still consumes the
// others.
func (s suite) eachIndependent(t *testing.T) {
	s.forKinds(t, func(t *testing.T, e *env, k algo.Kind) {
		day := &sluice.Limit{Name: "day", Algorithm: sluice.Algorithm(k), Rate: 100, Period: 24 * time.Hour}
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
		_, hasEach := e.store.(decorator.EachTaker)
		l := &sluice.Limit{Name: "tokens", Algorithm: sluice.Algorithm(k), Rate: 10, Period: time.Minute}
		charge := overdrawCharge(t, e, l, hasEach)
		if !hasEach {
			// The fallback consumes nothing of a denied hit: 2 are left.
			want(t, "check after a denied charge (no TakeEach)", e.allow("u", l, 0), true, 2)
			return
		}
		overdrawDebt(t, e, l, charge)
		for _, debit := range []bool{false, true} {
			overdrawExhausted(t, e, k, debit)
		}
		if k != algo.FixedWindow {
			return
		}
		overdrawZeroWindow(t, e, k, hasEach)
		if !hasEach {
			return
		}
		overdrawZeroCeiling(t, e, k)
	})
}

// overdrawCharge spends 8 of l's 10 on key "u", checks, then charges 5,
// which goes over (overdrawn with TakeEach, denied either way), and
// returns the charge's decision.
func overdrawCharge(t *testing.T, e *env, l *sluice.Limit, hasEach bool) sluice.Decision {
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
	return per[0]
}

// overdrawDebt: after the overdrawing charge, key "u" is in debt: checks
// are denied, denied hits dig no deeper, hits on the key twice in one
// request see the debt, and cost 1 fits again after the charge's
// RetryAfter.
func overdrawDebt(t *testing.T, e *env, l *sluice.Limit, charge sluice.Decision) {
	if charge.Remaining != 0 || charge.RetryAfter <= 0 || charge.RetryAfter == sluice.Never {
		t.Fatalf("overdrawn charge: %+v, want nothing remaining and a finite RetryAfter", charge)
	}
	retry := charge.RetryAfter
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
}

// overdrawExhausted: a charge on a limit exhausted exactly, not in debt,
// is counted on a fixed window (its debt ends with its window) and on a
// limit charged after the fact (Debit), so that the next check denies;
// on the others it consumes nothing. In debt, only a Debit limit's charge
// counts.
func overdrawExhausted(t *testing.T, e *env, k algo.Kind, debit bool) {
	f := &sluice.Limit{Name: fmt.Sprintf("full-%v", debit), Algorithm: sluice.Algorithm(k), Rate: 3, Period: time.Hour, Debit: debit}
	key := fmt.Sprintf("f-%v", debit)
	e.each(hit(key, f, 3))
	counted := k == algo.FixedWindow || debit
	if _, per := e.each(hit(key, f, 1)); per[0].Allowed || per[0].Overdrawn != counted {
		t.Fatalf("debit %v: charge of 1 on an exhausted limit: %+v, want denied, overdrawn %v", debit, per[0], counted)
	}
	if d, _ := e.each(hit(key, f, 0)); d.Allowed == counted || d.Remaining != 0 {
		t.Fatalf("debit %v: check after the charge on an exhausted limit: %+v, want allowed %v with 0 left", debit, d, !counted)
	}
	// In debt, a charge is counted only on a Debit limit: what was
	// spent after the fact, whatever the debt.
	if _, per := e.each(hit(key, f, 1)); per[0].Allowed || per[0].Overdrawn != debit {
		t.Fatalf("debit %v: a second charge: %+v, want denied, overdrawn %v", debit, per[0], debit)
	}
}

// overdrawZeroWindow: a zero fixed window (requests_per_unit: 0):
// envoyproxy/ratelimit counts the denied hit, so a check after it in its
// window is denied, and one in the next window is allowed. (Right after a
// charge that found a window in debt: a Redis fast path once read that
// debt for this one.)
func overdrawZeroWindow(t *testing.T, e *env, k algo.Kind, hasEach bool) {
	z := &sluice.Limit{Name: "zero", Algorithm: sluice.Algorithm(k), Rate: 0, Period: time.Minute}
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
}

// overdrawZeroCeiling: a zero rate with an elastic ceiling of 2 is
// charged until the count passes the ceiling, on every store alike (a
// Redis fast path once stopped at the first).
func overdrawZeroCeiling(t *testing.T, e *env, k algo.Kind) {
	zc := &sluice.Limit{Name: "zero-ceiling", Algorithm: sluice.Algorithm(k), Rate: 0, Period: time.Minute, ElasticCeiling: 2}
	for i, want := range []bool{true, true, true, false} {
		if _, per := e.each(hit("zc", zc, 1)); per[0].Allowed || per[0].Overdrawn != want {
			t.Fatalf("hit %d on a zero limit with a ceiling of 2: %+v, want denied, overdrawn %v", i, per[0], want)
		}
	}
}
