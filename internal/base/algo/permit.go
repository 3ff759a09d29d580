package algo

import "math"

// Concurrency permits. A key of a Concurrency limit holds a set of
// permits: IDs, each with an expiry. Params.Capacity is the most permits
// held at once (the limit's Rate: no margin applies) and Params.Period how
// long a permit lives after it is acquired or last renewed. A permit whose
// expiry is at or before now has expired and is held no more: a store
// drops a key's expired permits before it decides (PermitExpired), and
// reads what the decision needs of the others, a PermitSet.
//
// Expiries are whole milliseconds (PermitExpiry rounds up), so that the
// Redis store keeps them exactly as the scores of a sorted set, which are
// doubles: a millisecond count of any int64 time is below 2^53.

// MaxPermits bounds the Capacity of a Concurrency limit: the permits of a
// key are held one by one, so that a key costs a store memory in
// proportion to them.
const MaxPermits = 1 << 20

// PermitSet is what a store reads of a key's permits at now, its expired
// permits dropped, for a hit on it.
type PermitSet struct {
	Held     int64 // permits held at now
	Earliest int64 // the earliest expiry among them; 0 when none is held
	Old      int64 // the expiry of the hit's own ID when it is held; 0 when not
}

// PermitExpired reports whether a permit that expires at exp has expired
// at now.
func PermitExpired(exp, now int64) bool { return exp <= clampNow(now) }

// msNs is a millisecond in nanoseconds, the unit of permit expiries.
const msNs = 1_000_000

// PermitExpiry is the expiry of a permit acquired or renewed at now whose
// expiry was old (0 for a new permit): now + Period, saturated, rounded up
// to a whole millisecond (down, at the end of int64 time), and never
// before old.
func PermitExpiry(p *Params, now, old int64) int64 {
	e := addSat(clampNow(now), max(p.Period, 0))
	const last = math.MaxInt64 - math.MaxInt64%msNs
	if e > last {
		e = last
	} else if r := e % msNs; r != 0 {
		e += msNs - r
	}
	return max(e, old)
}

// PermitStep decides a Concurrency hit of cost n on the set s at now. n =
// 0 is a peek, always allowed, which changes nothing. n = 1 acquires the
// hit's permit: it is admitted when its ID is already held (a retry: the
// permit counts once and its expiry is refreshed) or when fewer than
// Capacity permits are held. A larger n never fits, nor does any
// acquisition on a zero limit (Rate or Capacity 0): RetryAfter Never. A
// negative n is treated as 0.
//
// When an acquisition is admitted, exp is the expiry the store gives the
// permit (PermitExpiry), adding it or refreshing it; otherwise exp is 0
// and the store changes nothing.
//
// The result describes the set after the hit: Remaining is Capacity less
// the permits held (never negative); ResetAfter the time until the
// earliest expiry among the permits the hit found and its own (0 when none
// is held). On a denial RetryAfter is the time until the earliest held
// permit expires: an upper bound, since a holder may release one sooner,
// and never 0, since an expired permit is not held.
func PermitStep(p *Params, s PermitSet, now, n int64) (r Result, exp int64) {
	now = clampNow(now)
	s = s.at(now)
	switch {
	case n <= 0:
		return permitResult(p, s, now, true), 0
	case n > 1 || p.Rate <= 0 || p.Capacity <= 0 || p.Period <= 0:
		r = permitResult(p, s, now, false)
		r.RetryAfter = Never
		return r, 0
	case s.Old == 0 && s.Held >= p.Capacity:
		return permitResult(p, s, now, false), 0
	}
	exp = PermitExpiry(p, now, s.Old)
	return permitResult(p, s.with(exp), now, true), exp
}

// PermitRenew renews, at now, the permit whose expiry s.Old says: a
// permit still held gets exp = PermitExpiry, and an allowed result as
// PermitStep's, whatever room the set has (after Capacity is lowered
// below the permits held, they stay held). One no longer held (expired,
// released, lost by the store: s.Old is 0) is acquired again when the
// set has room, as PermitStep acquires it: fewer than Capacity held
// (then exp is a fresh PermitExpiry, and the result is allowed); that is
// an acquisition, checked against the capacity as any, so a store that
// lost its permits (a Redis restarted empty) counts their holders again
// at their next renewal instead of having them cancelled. Without room
// it is lost: its holder may have run past its expiry while another
// took its place. A lost permit's result is denied, with RetryAfter
// Never (renewing it again never helps), exp 0, and the set's Remaining
// and ResetAfter. A zero limit (Rate or Capacity 0) acquires nothing
// again.
//
// A hand-over (handOver true) adds a permit not held whatever the room:
// the permit of a holder that the local failure policy admitted, within
// the nodes' shares, while the store could not decide, given to the
// store when it answers again so that the store counts it and admits no
// newcomer to its slot. Its result is allowed (Remaining then counts the
// set over Capacity as none left). Only a zero Period loses it.
func PermitRenew(p *Params, s PermitSet, now int64, handOver bool) (r Result, exp int64) {
	now = clampNow(now)
	s = s.at(now)
	room := handOver || s.Held < p.Capacity && p.Rate > 0
	if s.Old == 0 && !room || p.Period <= 0 {
		r = permitResult(p, s, now, false)
		r.RetryAfter = Never
		return r, 0
	}
	exp = PermitExpiry(p, now, s.Old)
	return permitResult(p, s.with(exp), now, true), exp
}

// at returns s with the hit's own permit not held if it has expired at
// now: a store drops expired permits first, so it never has.
func (s PermitSet) at(now int64) PermitSet {
	if s.Old != 0 && PermitExpired(s.Old, now) {
		s.Old = 0
	}
	return s
}

// with returns s after the hit's permit is added, or refreshed, with
// expiry exp.
func (s PermitSet) with(exp int64) PermitSet {
	if s.Old == 0 {
		s.Held = addSat(s.Held, 1)
	}
	if s.Earliest == 0 || exp < s.Earliest {
		s.Earliest = exp
	}
	s.Old = exp
	return s
}

// permitResult reports the set s at now: allowed, or denied until its
// earliest permit expires.
func permitResult(p *Params, s PermitSet, now int64, allowed bool) Result {
	r := Result{Allowed: allowed, Remaining: max(p.Capacity-max(s.Held, 0), 0)}
	if s.Earliest > 0 {
		r.ResetAfter = max(s.Earliest-now, 0)
	}
	if !allowed {
		r.RetryAfter = Never
		if s.Earliest > 0 {
			r.RetryAfter = max(r.ResetAfter, 1)
		}
	}
	return r
}
