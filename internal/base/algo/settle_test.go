package algo

import (
	"math"
	"math/rand/v2"
	"testing"
)

// settleCases are the limits Settle settles: every algorithm with a state,
// smooth and discrete buckets, windows with and without an offset.
func settleCases() []Params {
	s := int64(1e9)
	return []Params{
		{Kind: FixedWindow, Rate: 1000, Period: 60 * s, Capacity: 1000},
		{Kind: FixedWindow, Rate: 50, Period: s, Capacity: 50, Offset: s / 3},
		{Kind: SlidingWindow, Rate: 1000, Period: 60 * s, Capacity: 1000},
		{Kind: SlidingWindow, Rate: 40, Period: s, Capacity: 40},
		{Kind: TokenBucket, Rate: 1000, Period: 60 * s, Capacity: 1000},
		{Kind: TokenBucket, Rate: 600, Period: 60 * s, Capacity: 300, Interval: 10 * s},
		{Kind: GCRA, Rate: 7, Period: s, Capacity: 20},
		{Kind: LeakyBucket, Rate: 1000, Period: 60 * s, Capacity: 500},
	}
}

// TestSettleNeverBelowSpent: a reservation of r hits at t0, other hits
// after it, and a settlement of spent at t1. The settled state must never
// admit more than the state of the history in which the request had taken
// spent in the first place (the same other hits forced in), now or at any
// later time; with no other traffic, no time passed and the take's time
// known exactly, it must admit exactly as much.
func TestSettleNeverBelowSpent(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, p := range settleCases() {
		p := p
		t.Run(p.Kind.String(), func(t *testing.T) {
			for trial := 0; trial < 3000; trial++ {
				settleTrial(t, rng, &p, trial)
			}
		})
	}
}

func settleTrial(t *testing.T, rng *rand.Rand, p *Params, trial int) {
	t.Helper()
	t0 := int64(1_700_000_000e9) + rng.Int64N(3*p.Period)
	var st, alt State
	// Some traffic before.
	now := t0 - rng.Int64N(p.Period)
	for range rng.IntN(4) {
		n := rng.Int64N(p.Capacity/3 + 1)
		next, r := Step(p, st, now, n)
		if r.Allowed {
			st, alt = next, force(p, alt, now, n)
		}
		now += rng.Int64N(p.Period/4 + 1)
	}
	now = max(now, t0)
	reserved := 1 + rng.Int64N(p.Capacity/2+1)
	next, r := Step(p, st, now, reserved)
	if !r.Allowed {
		return
	}
	st = next
	spent := rng.Int64N(2 * reserved)
	if rng.IntN(4) == 0 {
		spent = reserved - 1 - rng.Int64N(reserved) // often a refund
	}
	spent = max(spent, 0)
	alt = force(p, alt, now, spent)
	at := now - rng.Int64N(min(p.Period, 5e6))
	reset := r.ResetAfter
	quiet := rng.IntN(3) == 0
	if quiet && rng.IntN(2) == 0 {
		at = now // the store's own clock: the take's time exactly
	}
	t1 := now
	if !quiet {
		for range rng.IntN(6) {
			t1 += rng.Int64N(p.Period/3 + 1)
			n := rng.Int64N(p.Capacity/4 + 1)
			next, r := Step(p, st, t1, n)
			if r.Allowed {
				st, alt = next, force(p, alt, t1, n)
			}
		}
	}
	settled, moved := Settle(p, st, t1, at, reset, reserved, spent)
	if spent > reserved && moved != spent-reserved {
		t.Fatalf("trial %d: charge of %d moved %d", trial, spent-reserved, moved)
	}
	if moved < -(reserved - spent) {
		t.Fatalf("trial %d: refunded %d of a reservation of %d, spent %d", trial, -moved, reserved, spent)
	}
	for _, d := range []int64{0, 1, p.Period / 7, p.Period / 2, p.Period - 1, p.Period, p.Period + p.Period/3, 2 * p.Period} {
		_, a := Step(p, settled, t1+d, 0)
		_, b := Step(p, alt, t1+d, 0)
		if a.Remaining > b.Remaining {
			t.Fatalf("trial %d (%+v): %d after the settlement, the settled state leaves %d, more than %d had the request spent %d (reserved %d, moved %d)",
				trial, *p, d, a.Remaining, b.Remaining, spent, reserved, moved)
		}
	}
	if quiet && at == now && t1 == now && spent < reserved {
		_, a := Step(p, settled, t1, 0)
		_, b := Step(p, alt, t1, 0)
		if a.Remaining != b.Remaining {
			t.Fatalf("trial %d (%+v): a settlement at once, alone, leaves %d, want %d (reserved %d, spent %d, moved %d)",
				trial, *p, a.Remaining, b.Remaining, reserved, spent, moved)
		}
	}
}

// TestSettleLater: a refund after the reservation's window is over, or
// after a bucket has refilled the whole reservation, returns nothing.
func TestSettleLater(t *testing.T) {
	for _, p := range settleCases() {
		p := p
		now := int64(1_700_000_000e9)
		st, r := Step(&p, State{}, now, p.Capacity/2)
		if !r.Allowed {
			t.Fatalf("%v: reservation denied", p.Kind)
		}
		later := now + 2*p.Period + p.Interval
		if _, moved := Settle(&p, st, later, now, r.ResetAfter, p.Capacity/2, 0); moved != 0 {
			t.Errorf("%v: a settlement two periods later refunded %d", p.Kind, -moved)
		}
	}
}

// TestSettleUnsupported: states Settle cannot settle are left alone.
func TestSettleUnsupported(t *testing.T) {
	for _, p := range []Params{
		{Kind: SlidingLog, Rate: 10, Period: 1e9, Capacity: 10},
		{Kind: Sketch, Rate: 10, Period: 1e9, Capacity: 10},
		{Kind: SlidingWindow, Rate: 10, Period: 1e9, Capacity: 10, Offset: 1},
	} {
		if Settles(&p) {
			t.Errorf("%+v: Settles", p)
		}
		st := State{A: 5e9, B: 3}
		if got, moved := Settle(&p, st, 1e9, 1e9, 1, 5, 0); got != st || moved != 0 {
			t.Errorf("%+v: settled to %+v, %d", p, got, moved)
		}
	}
}

// TestSettleDiscreteCut: a discrete bucket cut at the end of representable
// time (discreteForce) stays cut when a refund leaves the tick's remainder,
// rather than wrapping to a fresh bucket that forgets its debt.
func TestSettleDiscreteCut(t *testing.T) {
	p := Params{Kind: TokenBucket, Rate: 500000, Period: 1000000, Capacity: 970385, Interval: 17967259706}
	st, moved := Settle(&p, State{A: math.MaxInt64}, math.MaxInt64, 9223372036853985968, 935144, 105939, 0)
	if st.A != math.MaxInt64 || moved >= 0 {
		t.Fatalf("settled to %+v, moved %d; want the state cut at MaxInt64 and a refund", st, moved)
	}
}
