package algo

import "math"

// Settle settles a reservation: a hit of cost reserved that a store took
// (Step admitted it) before its real cost, spent, was known (the tokens of
// an LLM's answer). It returns the state after the difference is charged
// or refunded, and the hits charged (> 0) or refunded (< 0).
//
// A charge (spent > reserved) is counted whatever the state, past the
// limit if need be, as a debt later hits see (the forced step of
// Overdraw): the hits were spent.
//
// A refund (spent < reserved) never takes the state below what the key
// has spent. It returns at most reserved − spent, and only what of the
// reservation the state still holds:
//
//   - A FixedWindow refunds only in the window the reservation was
//     counted in, at most its count there. A SlidingWindow refunds from its
//     current count in that window, or from its previous count in the
//     window after (whose estimate the reservation still weighs on).
//     Later, nothing: the window that counted it is over.
//   - A bucket (TokenBucket, LeakyBucket, GCRA) refunds at most what of
//     the reservation cannot have drained yet: reserved less the hits the
//     bucket has refilled since at (Rate per Period, or a discrete refill's
//     steps). Refilling another client's hits instead would hand out
//     capacity the bucket never held.
//
// at is a time at or before the one the store took the reservation at, on
// the store's clock, and less than one Period before it; resetAfter is the
// ResetAfter the store reported for the hit then. Together they name the
// reservation's window: its end is resetAfter past the take, so the first
// window end at or after at + resetAfter.
//
// SlidingLog and Sketch keep no State; a SlidingWindow with an Offset (a
// calendar period) changes Period between windows. Settle leaves their
// states unchanged (Settles reports which it settles).
func Settle(p *Params, s State, now, at, resetAfter, reserved, spent int64) (State, int64) {
	now = clampNow(now)
	if !Settles(p) || reserved < 0 || spent < 0 || spent == reserved {
		return s, 0
	}
	if spent > reserved {
		n := spent - reserved
		return force(p, s, now, n), n
	}
	want := reserved - spent
	switch p.Kind {
	case FixedWindow:
		return refundFixed(p, s, now, reservedEnd(p, at, resetAfter), want)
	case SlidingWindow:
		return refundSliding(p, s, now, reservedEnd(p, at, resetAfter), want)
	case TokenBucket:
		if p.Interval > 0 {
			return refundDiscrete(p, s, now, at, reserved, want)
		}
	}
	return refundGCRA(p, s, now, at, reserved, want)
}

// Settles reports whether Settle settles the states of limits with
// parameters p: every algorithm with a State, but a SlidingWindow with an
// Offset.
func Settles(p *Params) bool {
	switch p.Kind {
	case FixedWindow, TokenBucket, LeakyBucket, GCRA:
		return p.Period > 0
	case SlidingWindow:
		return p.Period > 0 && p.Offset == 0
	}
	return false
}

// force counts n hits whatever the state: Overdraw's forced step.
func force(p *Params, s State, now, n int64) State {
	switch p.Kind {
	case FixedWindow:
		return fixedForce(p, s, now, n)
	case SlidingWindow:
		return slidingForce(p, s, now, n)
	case TokenBucket:
		if p.Interval > 0 {
			return discreteForce(p, s, now, n)
		}
	}
	if p.Rate <= 0 {
		return s // a zero bucket holds no debt: it denies for ever
	}
	return gcraForce(p, s, now, n)
}

// reservedEnd is the end of the window that counted a reservation taken
// in [at, at+Period) whose ResetAfter was resetAfter (0 < resetAfter <=
// Period): the window that holds at + resetAfter − 1.
func reservedEnd(p *Params, at, resetAfter int64) int64 {
	t := addSat(max(at, 0), max(resetAfter, 1)) - 1
	return windowEnd(p, alignFrom(t, p.Period, p.Offset))
}

// refundFixed takes up to want hits off a fixed window's count, if its
// window is the one that ends at end.
func refundFixed(p *Params, s State, now, end, want int64) (State, int64) {
	ws, count := readFixed(p, s, now)
	if s.A <= now || windowEnd(p, ws) != end {
		return s, 0
	}
	k := min(want, count)
	return State{A: end, B: count - k}, -k
}

// refundSliding takes up to want hits off a sliding window's current
// count, if its window ends at end, or off its previous count, if that is
// the window before.
func refundSliding(p *Params, s State, now, end, want int64) (State, int64) {
	if s.A <= now {
		return s, 0
	}
	w := readSlide(p.Period, s, now)
	var k uint64
	switch cur := w.end(p.Period); {
	case cur == end:
		k = min(uint64(want), w.curr)
		w.curr -= k
	case cur == addSat(end, p.Period):
		k = min(uint64(want), w.prev)
		w.prev -= k
	default:
		return s, 0
	}
	if k == 0 {
		return s, 0
	}
	return State{A: slideIdle(p, &w), B: int64(w.prev<<32 | w.curr)}, -int64(k)
}

// refundGCRA takes up to want hits off a GCRA-family bucket's level, and
// no more than what of reserved (taken at or after at) it still holds:
// reserved·Period − (now − at)·Rate, in the level's units (ns·Rate).
func refundGCRA(p *Params, s State, now, at, reserved, want int64) (State, int64) {
	if p.Rate <= 0 || s.A <= now {
		return s, 0
	}
	rate, period := uint64(p.Rate), uint64(p.Period)
	x, _ := readGCRA(p, s, now)
	held := mulU(uint64(reserved), period)
	if now > at {
		drained := mulU(uint64(now-max(at, 0)), rate)
		if !drained.less(held) {
			return s, 0
		}
		held = held.sub(drained)
	}
	q, _ := held.div(period)
	k := min(uint64(want), q.lo)
	if q.hi != 0 {
		k = uint64(want)
	}
	if lvl, _ := x.div(period); lvl.hi == 0 && lvl.lo < k {
		k = lvl.lo
	}
	if k == 0 {
		return s, 0
	}
	x = x.sub(mulU(k, period))
	if x == (u128{}) {
		return State{}, -int64(k)
	}
	t := x.divCeil(rate)
	return State{A: now + int64(t.lo), B: int64(mulU(t.lo, rate).sub(x).lo)}, -int64(k)
}

// refundDiscrete takes up to want hits off a discrete bucket's deficit,
// and no more than what of reserved it still holds: reserved less the
// refill of every step since at.
func refundDiscrete(p *Params, s State, now, at, reserved, want int64) (State, int64) {
	d, a, tick, ok := discreteDeficit(p, s, now)
	if !ok || d == (u128{}) {
		return s, 0
	}
	iv := p.Interval
	steps := uint64(tick-alignDown(max(at, 0), iv)) / uint64(iv)
	refilled := mulU(steps, a)
	held := u64(uint64(reserved))
	if !refilled.less(held) {
		return s, 0
	}
	held = held.sub(refilled)
	k := min(uint64(want), held.lo)
	if d.hi == 0 && d.lo < k {
		k = d.lo
	}
	if k == 0 {
		return s, 0
	}
	d = d.sub(u64(k))
	if d == (u128{}) {
		return State{}, -int64(k)
	}
	q := d.divCeil(a)
	span := mulU(q.lo, uint64(iv))
	if q.hi != 0 || span.hi != 0 || span.lo > uint64(math.MaxInt64-tick) {
		return State{A: math.MaxInt64}, -int64(k) // cut as discreteForce cuts
	}
	return State{A: tick + int64(span.lo), B: int64(mulU(q.lo, a).sub(d).lo)}, -int64(k)
}
