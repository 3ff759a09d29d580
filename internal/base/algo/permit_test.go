package algo

import (
	"math"
	"slices"
	"testing"
)

// TestPermitStep: acquisitions, peeks, retries and denials at fixed times,
// on a limit of 2 permits of 10 s.
func TestPermitStep(t *testing.T) {
	p := Params{Kind: Concurrency, Rate: 2, Period: 10e9, Capacity: 2}
	const t0 = int64(1_700_000_000_000_000_000)
	for _, c := range []struct {
		name string
		s    PermitSet
		now  int64
		n    int64
		want Result
		exp  int64
	}{
		{"peek at nothing", PermitSet{}, t0, 0, Result{Allowed: true, Remaining: 2}, 0},
		{"first", PermitSet{}, t0, 1, Result{Allowed: true, Remaining: 1, ResetAfter: 10e9}, t0 + 10e9},
		{"rounded up to a millisecond", PermitSet{}, t0 + 1, 1, Result{Allowed: true, Remaining: 1, ResetAfter: 10e9 + ms - 1}, t0 + 10e9 + ms},
		{"second", PermitSet{Held: 1, Earliest: t0 + 4e9}, t0, 1, Result{Allowed: true, Remaining: 0, ResetAfter: 4e9}, t0 + 10e9},
		{"full", PermitSet{Held: 2, Earliest: t0 + 4e9}, t0, 1, Result{Remaining: 0, ResetAfter: 4e9, RetryAfter: 4e9}, 0},
		{"peek when full", PermitSet{Held: 2, Earliest: t0 + 4e9}, t0, 0, Result{Allowed: true, ResetAfter: 4e9}, 0},
		{"a retry when full counts once", PermitSet{Held: 2, Earliest: t0 + 4e9, Old: t0 + 6e9}, t0, 1, Result{Allowed: true, ResetAfter: 4e9}, t0 + 10e9},
		{"a retry never shortens", PermitSet{Held: 1, Earliest: t0 + 20e9, Old: t0 + 20e9}, t0, 1, Result{Allowed: true, Remaining: 1, ResetAfter: 20e9}, t0 + 20e9},
		{"an expired own permit is not held", PermitSet{Held: 2, Earliest: t0 + 4e9, Old: t0}, t0, 1, Result{ResetAfter: 4e9, RetryAfter: 4e9}, 0},
		{"cost 2 never fits", PermitSet{}, t0, 2, Result{Remaining: 2, RetryAfter: Never}, 0},
		{"negative cost peeks", PermitSet{Held: 1, Earliest: t0 + 1}, t0, -1, Result{Allowed: true, Remaining: 1, ResetAfter: 1}, 0},
		{"over capacity reports none left", PermitSet{Held: 5, Earliest: t0 + 1}, t0, 1, Result{ResetAfter: 1, RetryAfter: 1}, 0},
	} {
		r, exp := PermitStep(&p, c.s, c.now, c.n)
		if r != c.want || exp != c.exp {
			t.Errorf("%s: %+v exp %d, want %+v exp %d", c.name, r, exp, c.want, c.exp)
		}
	}
	zero := Params{Kind: Concurrency, Rate: 0, Period: 10e9, Capacity: 0}
	if r, exp := PermitStep(&zero, PermitSet{}, t0, 1); r.Allowed || r.RetryAfter != Never || exp != 0 {
		t.Errorf("zero limit: %+v exp %d, want a denial for ever", r, exp)
	}
	if r, _ := PermitStep(&zero, PermitSet{}, t0, 0); !r.Allowed {
		t.Errorf("peek at a zero limit: %+v, want allowed", r)
	}
}

// TestPermitRenew: a held permit is extended, even over capacity; one
// no longer held is acquired again when the set has room, and lost
// otherwise; a hand-over adds it whatever the room.
func TestPermitRenew(t *testing.T) {
	p := Params{Kind: Concurrency, Rate: 3, Period: 10e9, Capacity: 3}
	const t0 = int64(1_700_000_000_000_000_000)
	for _, c := range []struct {
		name string
		p    Params
		s    PermitSet
		hand bool
		want Result
		exp  int64
	}{
		{"held", p, PermitSet{Held: 2, Earliest: t0 + 1e9, Old: t0 + 1e9}, false, Result{Allowed: true, Remaining: 1, ResetAfter: 1e9}, t0 + 10e9},
		{"held over capacity", p, PermitSet{Held: 5, Earliest: t0 + 1e9, Old: t0 + 2e9}, false, Result{Allowed: true, ResetAfter: 1e9}, t0 + 10e9},
		{"never shortened", p, PermitSet{Held: 1, Earliest: t0 + 20e9, Old: t0 + 20e9}, false, Result{Allowed: true, Remaining: 2, ResetAfter: 20e9}, t0 + 20e9},
		{"gone, with room: acquired again", p, PermitSet{Held: 1, Earliest: t0 + 1e9}, false, Result{Allowed: true, Remaining: 1, ResetAfter: 1e9}, t0 + 10e9},
		{"gone from an empty set", p, PermitSet{}, false, Result{Allowed: true, Remaining: 2, ResetAfter: 10e9}, t0 + 10e9},
		{"gone, full: lost", p, PermitSet{Held: 3, Earliest: t0 + 1e9}, false, Result{ResetAfter: 1e9, RetryAfter: Never}, 0},
		{"gone, over capacity: lost", p, PermitSet{Held: 4, Earliest: t0 + 1e9}, false, Result{ResetAfter: 1e9, RetryAfter: Never}, 0},
		{"expired at now, full: lost", p, PermitSet{Held: 3, Earliest: t0, Old: t0}, false, Result{RetryAfter: Never}, 0},
		{"a zero limit acquires nothing again", Params{Kind: Concurrency, Period: 10e9}, PermitSet{}, false, Result{RetryAfter: Never}, 0},
		{"a zero limit renews a held one", Params{Kind: Concurrency, Period: 10e9}, PermitSet{Held: 1, Earliest: t0 + 1e9, Old: t0 + 1e9}, false, Result{Allowed: true, ResetAfter: 1e9}, t0 + 10e9},
		{"hand-over, full: held over capacity", p, PermitSet{Held: 3, Earliest: t0 + 1e9}, true, Result{Allowed: true, ResetAfter: 1e9}, t0 + 10e9},
		{"hand-over, held: renewed", p, PermitSet{Held: 2, Earliest: t0 + 1e9, Old: t0 + 1e9}, true, Result{Allowed: true, Remaining: 1, ResetAfter: 1e9}, t0 + 10e9},
		{"hand-over, room: added", p, PermitSet{Held: 1, Earliest: t0 + 1e9}, true, Result{Allowed: true, Remaining: 1, ResetAfter: 1e9}, t0 + 10e9},
		{"hand-over on a zero limit: added", Params{Kind: Concurrency, Period: 10e9}, PermitSet{}, true, Result{Allowed: true, ResetAfter: 10e9}, t0 + 10e9},
		{"hand-over of a zero period: lost", Params{Kind: Concurrency, Rate: 3, Capacity: 3}, PermitSet{}, true, Result{Remaining: 3, RetryAfter: Never}, 0},
	} {
		r, exp := PermitRenew(&c.p, c.s, t0, c.hand)
		if r != c.want || exp != c.exp {
			t.Errorf("%s: %+v exp %d, want %+v exp %d", c.name, r, exp, c.want, c.exp)
		}
	}
}

// TestPermitExpiry: rounding and saturation.
func TestPermitExpiry(t *testing.T) {
	p := Params{Kind: Concurrency, Rate: 1, Period: math.MaxInt64, Capacity: 1}
	last := int64(math.MaxInt64 - math.MaxInt64%ms)
	if e := PermitExpiry(&p, 5, 0); e != last {
		t.Errorf("saturated: %d, want %d", e, last)
	}
	p.Period = 1
	if e := PermitExpiry(&p, -7, 0); e != ms {
		t.Errorf("before the epoch: %d, want %d", e, ms)
	}
	if e := PermitExpiry(&p, 0, 5*ms); e != 5*ms {
		t.Errorf("old later: %d, want %d", e, 5*ms)
	}
}

// naivePermits is the reference for FuzzPermits: the permits of a key as
// a map, kept by the semantics written on PermitStep, not by its code.
type naivePermits map[uint8]int64

func (m naivePermits) drop(now int64) {
	for id, e := range m {
		if e <= now {
			delete(m, id)
		}
	}
}

func (m naivePermits) set(id uint8) PermitSet {
	s := PermitSet{Held: int64(len(m)), Old: m[id]}
	for _, e := range m {
		if s.Earliest == 0 || e < s.Earliest {
			s.Earliest = e
		}
	}
	return s
}

// FuzzPermits runs traces of acquisitions, peeks, renewals and releases on
// one key through PermitStep and PermitRenew, kept in a map as a store
// keeps them, and checks them against what the semantics say: never more
// than Capacity held, a retry counts once, a denial only when full, a
// renewal of a permit no longer held acquires it again only when not
// full, expiries whole milliseconds and a period on, and the durations
// reported.
func FuzzPermits(f *testing.F) {
	f.Add(uint8(2), int64(10e9), []byte{1, 0, 1, 1, 1, 2, 0, 3, 3, 1, 9, 1})
	f.Add(uint8(1), int64(1), []byte{1, 0, 200, 1, 1, 3})
	f.Fuzz(func(t *testing.T, capacity uint8, period int64, ops []byte) {
		p := Params{Kind: Concurrency, Rate: int64(capacity), Period: period, Capacity: int64(capacity)}
		if p.Validate() != nil {
			return
		}
		m := naivePermits{}
		now := int64(1_700_000_000_000_000_000)
		for i := 0; i+1 < len(ops); i += 2 {
			op, id := ops[i]%5, ops[i+1]%8
			if op == 4 {
				now = addSat(now, int64(ops[i+1])*max(period/7, 1))
				continue
			}
			m.drop(now)
			s := m.set(id)
			var r Result
			var exp int64
			switch op {
			case 0, 1: // peek, acquire
				r, exp = PermitStep(&p, s, now, int64(op))
				full := s.Old == 0 && s.Held >= p.Capacity
				if op == 1 && r.Allowed == full {
					t.Fatalf("acquire %d on %+v (cap %d): %+v", id, s, capacity, r)
				}
			case 2: // renew, or acquire again with room
				r, exp = PermitRenew(&p, s, now, false)
				if r.Allowed != (s.Old != 0 || s.Held < p.Capacity) {
					t.Fatalf("renew %d on %+v: %+v", id, s, r)
				}
			case 3: // release
				delete(m, id)
				continue
			}
			if exp != 0 {
				if exp%ms != 0 && exp != math.MaxInt64-math.MaxInt64%ms || exp < s.Old || exp <= now {
					t.Fatalf("expiry %d at %d (old %d)", exp, now, s.Old)
				}
				m[id] = exp
			}
			if len(m) > int(capacity) {
				t.Fatalf("%d permits held, capacity %d", len(m), capacity)
			}
			after := m.set(id)
			if !r.Allowed {
				after = s
			}
			if want := max(p.Capacity-after.Held, 0); r.Remaining != want {
				t.Fatalf("op %d id %d: remaining %d, want %d", op, id, r.Remaining, want)
			}
			if !r.Allowed && r.RetryAfter <= 0 {
				t.Fatalf("denied with RetryAfter %d", r.RetryAfter)
			}
			if r.Allowed && r.RetryAfter != 0 {
				t.Fatalf("allowed with RetryAfter %d", r.RetryAfter)
			}
			if s.Held == 0 && exp == 0 && r.ResetAfter != 0 {
				t.Fatalf("nothing held, ResetAfter %d", r.ResetAfter)
			}
			expiries := slices.Collect(func(yield func(int64) bool) {
				for _, e := range m {
					yield(e)
				}
			})
			if len(expiries) > 0 && r.ResetAfter > slices.Max(expiries)-now {
				t.Fatalf("ResetAfter %d past the last expiry %d", r.ResetAfter, slices.Max(expiries)-now)
			}
		}
	})
}
