package algo

import (
	"math/rand/v2"
	"testing"
)

// TestOverdraw follows envoyproxy/ratelimit's debit pattern on every
// algorithm with a State: check with cost 0, charge the real cost after
// the fact, and the charge that goes over makes the next check deny until
// time repays it. A hit that finds the limit in debt changes nothing.
func TestOverdraw(t *testing.T) {
	for _, p := range tenAMinute() {
		name := p.Kind.String()
		if p.Interval > 0 {
			name += "/discrete"
		}
		t.Run(name, func(t *testing.T) {
			now := alignDown(base, minute)
			var s State
			step := func(n int64) Result {
				t.Helper()
				next, r := Overdraw(&p, s, now, n)
				if !r.Allowed && !r.Overdrawn && next != s {
					t.Fatalf("cost %d: denied without overdrawing, yet the state changed: %+v -> %+v", n, s, next)
				}
				s = next
				return r
			}
			if r := step(8); !r.Allowed || r.Remaining != 2 {
				t.Fatalf("8 of 10: %+v", r)
			}
			if r := step(0); !r.Allowed || r.Remaining != 2 {
				t.Fatalf("check before the charge: %+v", r)
			}
			// The charge after the fact: 5 where 2 are left.
			r := step(5)
			if r.Allowed || !r.Overdrawn || r.Remaining != 0 || r.RetryAfter <= 0 || r.RetryAfter == Never {
				t.Fatalf("charge of 5 with 2 left: %+v, want a denial that overdraws, with a finite retry", r)
			}
			retry := r.RetryAfter
			// The next check denies: the limit is in debt.
			if r := step(0); r.Allowed {
				t.Fatalf("check after the overdrawing charge: %+v, want denied", r)
			}
			// A client that keeps asking digs no deeper.
			before := s
			for range 5 {
				if r := step(3); r.Allowed || r.Overdrawn {
					t.Fatalf("cost 3 in debt: %+v", r)
				}
			}
			if s != before {
				t.Fatalf("denied hits changed the state in debt: %+v -> %+v", before, s)
			}
			// Once a hit of cost 1 fits again, the debt is repaid.
			now += retry
			if r := step(0); !r.Allowed {
				t.Fatalf("check at the retry time %v: %+v", retry, r)
			}
			if r := step(1); !r.Allowed {
				t.Fatalf("cost 1 at the retry time: %+v", r)
			}
		})
	}
}

// TestOverdrawExhausted: a charge of 1 after the fact that lands on a
// limit exhausted exactly (the last check passed with 0 left) is counted
// on a fixed window, whose debt ends with its window, and on every
// algorithm whose limit is charged after the fact (Debit), so that the
// next check denies, as in envoyproxy/ratelimit; on the others it changes
// nothing, so that a denied client digs no hole. Once in debt, no charge
// counts.
func TestOverdrawExhausted(t *testing.T) {
	const minute = 60 * sec
	for _, debit := range []bool{false, true} {
		for _, p := range tenAMinute() {
			p.Debit = debit
			name := p.Kind.String()
			if p.Interval > 0 {
				name += "/discrete"
			}
			if debit {
				name += "/debit"
			}
			t.Run(name, func(t *testing.T) {
				now := alignDown(base, minute)
				s, r := Overdraw(&p, State{}, now, 10)
				if !r.Allowed || r.Remaining != 0 {
					t.Fatalf("10 of 10: %+v", r)
				}
				if _, r := Overdraw(&p, s, now, 0); !r.Allowed {
					t.Fatalf("check at exactly the limit: %+v, want allowed", r)
				}
				next, r := Overdraw(&p, s, now, 1)
				counted := p.Kind == FixedWindow || debit
				if r.Allowed || r.Overdrawn != counted || (next != s) != counted {
					t.Fatalf("charge of 1 on the exhausted limit: %+v, state %+v -> %+v; want counted %v", r, s, next, counted)
				}
				if _, pk := Overdraw(&p, next, now, 0); pk.Allowed == counted {
					t.Fatalf("check after the charge: %+v, want denied %v", pk, counted)
				}
				if !counted {
					return
				}
				// In debt: a client that keeps asking digs no deeper; but
				// a debit limit counts every charge, what was spent.
				for range 3 {
					again, r := Overdraw(&p, next, now, 1)
					if debit {
						if !r.Overdrawn || again == next {
							t.Fatalf("debit charge in debt not counted: %+v, state %+v -> %+v", r, next, again)
						}
						next = again
						continue
					}
					if r.Overdrawn || again != next {
						t.Fatalf("charge in debt: %+v, state %+v -> %+v", r, next, again)
					}
				}
			})
		}
	}
}

// tenAMinute is a limit of 10 a minute in every algorithm with a State
// (the token bucket smooth and discrete).
func tenAMinute() []Params {
	const minute = 60 * sec
	return []Params{
		{Kind: FixedWindow, Rate: 10, Period: minute, Capacity: 10},
		{Kind: SlidingWindow, Rate: 10, Period: minute, Capacity: 10},
		{Kind: TokenBucket, Rate: 10, Period: minute, Capacity: 10},
		{Kind: TokenBucket, Rate: 10, Period: minute, Capacity: 10, Interval: 6 * sec},
		{Kind: LeakyBucket, Rate: 10, Period: minute, Capacity: 10},
		{Kind: GCRA, Rate: 10, Period: minute, Capacity: 10},
	}
}

// TestOverdrawBeyondCapacity: a charge larger than the whole limit, found
// with room left, is counted; one found with none is not.
func TestOverdrawBeyondCapacity(t *testing.T) {
	p := Params{Kind: FixedWindow, Rate: 10, Period: 60 * sec, Capacity: 10}
	now := alignDown(base, p.Period)
	s, r := Overdraw(&p, State{}, now, 500)
	if r.Allowed || !r.Overdrawn || s.B != 500 || r.RetryAfter != p.Period {
		t.Fatalf("charge of 500 on a fresh window: %+v %+v", s, r)
	}
	s2, r := Overdraw(&p, s, now, 500)
	if r.Overdrawn || s2 != s {
		t.Fatalf("second charge on a window in debt: %+v %+v", s2, r)
	}
	p = Params{Kind: GCRA, Rate: 10, Period: 60 * sec, Capacity: 10}
	s, r = Overdraw(&p, State{}, now, 500)
	// 500 tokens at 10 a minute: 490 beyond the bucket, repaid in 49
	// minutes before one token is back (and a minute more to fill).
	if r.Allowed || !r.Overdrawn || r.RetryAfter != 49*60*sec+6*sec || s.A != now+500*6*sec {
		t.Fatalf("charge of 500 on a full bucket: %+v %+v", s, r)
	}
}

// TestOverdrawProperties: on random traces of every algorithm with a
// State, with and without Debit, Overdraw admits exactly what Step
// admits, never changes a state on a denial that does not overdraw,
// overdraws only with room left or, where the limit charges an exhausted
// one, when not in debt (and then always), and owes at most one hit's
// cost beyond the limit.
func TestOverdrawProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	kinds := []Kind{FixedWindow, SlidingWindow, TokenBucket, LeakyBucket, GCRA}
	overdrawn, exhausted := map[Kind]int{}, map[Kind]int{}
	for trial := range 2000 {
		p := Params{Kind: kinds[trial%len(kinds)], Rate: 1 + rng.Int64N(20), Period: (1 + rng.Int64N(60)) * sec, Debit: trial%3 == 0}
		p.Capacity = p.Rate
		if p.Kind != FixedWindow && p.Kind != SlidingWindow {
			p.Capacity += rng.Int64N(5)
		}
		if p.Kind == TokenBucket && rng.IntN(2) == 0 {
			p.Interval = p.Period / p.Rate
			if p.Interval*p.Rate != p.Period {
				p.Interval = 0
			}
		}
		if err := p.Validate(); err != nil {
			continue
		}
		now := base + rng.Int64N(p.Period)
		var s State
		for range 50 {
			now += rng.Int64N(p.Period / 4)
			n := rng.Int64N(p.Capacity * 2)
			sNext, sr := Step(&p, s, now, n)
			next, r := Overdraw(&p, s, now, n)
			if r.Allowed != sr.Allowed && !(n == 0 && !r.Allowed) {
				t.Fatalf("%+v at %d cost %d: Overdraw %+v, Step %+v", p, now, n, r, sr)
			}
			switch {
			case r.Allowed && n > 0 && next != sNext:
				t.Fatalf("%+v: admitted with a state other than Step's: %+v vs %+v", p, next, sNext)
			case !r.Allowed && !r.Overdrawn && next != s:
				t.Fatalf("%+v: denial changed the state", p)
			case r.Overdrawn && sr.Remaining < 1 && !p.ChargesExhausted():
				t.Fatalf("%+v: overdrew with no room left: %+v", p, sr)
			case r.Overdrawn && sr.Remaining < 1:
				// Exhausted exactly: counted only if not in debt (a
				// debit limit: always).
				if _, pk := Overdraw(&p, s, now, 0); !pk.Allowed && !p.Debit {
					t.Fatalf("%+v: overdrew a limit in debt: %+v", p, sr)
				}
				exhausted[p.Kind]++
			case !r.Allowed && !r.Overdrawn && n > 0 && p.ChargesExhausted():
				// Not counted: the limit was in debt (never a debit
				// limit's charge).
				if _, pk := Overdraw(&p, s, now, 0); pk.Allowed || p.Debit {
					t.Fatalf("%+v at %d cost %d: a charge on a limit not in debt was not counted: %+v", p, now, n, r)
				}
			}
			if r.Overdrawn {
				overdrawn[p.Kind]++
				// The debt bound: a hit overdraws only with room for
				// one more (usage at most Capacity − 1), or, where the
				// limit charges an exhausted limit, with no debt
				// (usage at most Capacity); and it adds its own cost,
				// no more: the state is exactly the one the same limit
				// with n more capacity admits the hit to.
				big := p
				big.Capacity += n
				if _, pk := Overdraw(&p, s, now, 0); p.Debit && !pk.Allowed {
					// A debit charge on a debt: the debt grows by n.
					big.Capacity = 1 << 30
				}
				bigNext, br := Step(&big, s, now, n)
				if !br.Allowed || bigNext != next {
					t.Fatalf("%+v at %d cost %d: overdrawn state %+v, but with %d more capacity Step gives %+v (%+v)", p, now, n, next, n, bigNext, br)
				}
				// A peek sees the debt.
				if _, pk := Overdraw(&p, next, now, 0); pk.Allowed {
					t.Fatalf("%+v: peek allowed right after overdrawing", p)
				}
			}
			s = next
		}
	}
	for _, k := range kinds {
		if overdrawn[k] < 100 || exhausted[k] < 10 {
			t.Errorf("%s: %d overdrawn hits in the traces, %d of them on an exhausted limit; the properties were hardly exercised", k, overdrawn[k], exhausted[k])
		}
	}
}
