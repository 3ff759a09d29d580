package algo

import (
	"math"
	"math/bits"
)

// discreteBucket is the token bucket with discrete refill: a bucket of
// Capacity tokens to which a = Rate·Interval/Period tokens (a whole number,
// Validate checks) are added at once at every tick, the ticks aligned to the
// Unix epoch (tick k at k·Interval). A request of cost n is admitted when the
// bucket holds at least n tokens at the last tick at or before now.
//
// Think of a token clock S counting tokens ever taken, shifted so that the
// deficit at tick k (Capacity minus the tokens in the bucket) is
// max(0, S − k·a); a request sets S' = max(S, k·a) + n and fits when
// S' − k·a <= Capacity. S itself grows without bound, so the state keeps it
// relative to the tick at which the bucket is full again: A is that tick's
// time (the idle-at time), and B = ⌈S/a⌉·a − S, in [0, a), the tokens that
// tick adds beyond full. The deficit at tick k < A/Interval is then
// (A/Interval − k)·a − B, computed in 128 bits.
//
// Remaining is the tokens in the bucket; ResetAfter the time until it is full
// again; RetryAfter on deny the time until the tick at which the same request
// would fit, or Never for n > Capacity. Time going backwards moves to an
// earlier tick, which only makes the deficit larger.
func discreteBucket(p *Params, s State, now, n int64) (State, Result) {
	d, a, tick, ok := discreteDeficit(p, s, now) // d: the deficit at this tick; a: tokens per tick
	if !ok {
		return s, zeroLimit(n, 0) // not valid Params: no refill
	}
	iv := p.Interval
	c := uint64(p.Capacity)
	var reset int64
	if s.A > now {
		reset = s.A - now
	}
	left := int64(0)
	if d.less(u64(c)) {
		left = int64(c - d.lo)
	}
	res := Result{Allowed: true, Remaining: left, ResetAfter: reset}
	if n == 0 {
		return s, res
	}
	res.Allowed = false
	if n > p.Capacity {
		res.RetryAfter = Never
		return s, res
	}
	d2 := d.add(u64(uint64(n)))
	q := d2.divCeil(a) // ticks until full after the request
	span := mulU(q.lo, uint64(iv))
	if q.hi != 0 || span.hi != 0 || span.lo > uint64(math.MaxInt64-tick) {
		// The bucket would be full again only after math.MaxInt64, and
		// that tick does not move while we wait.
		res.RetryAfter = Never
		return s, res
	}
	if u64(c).less(d2) {
		// Each tick takes a off the deficit; wait for enough of them.
		j := d2.sub(u64(c)).divCeil(a).lo // <= q.lo
		res.RetryAfter = tick + int64(j)*iv - now
		return s, res
	}
	b := mulU(q.lo, a).sub(d2).lo // < a
	newA := tick + int64(span.lo)
	return State{A: newA, B: int64(b)}, Result{
		Allowed:    true,
		Remaining:  int64(c - d2.lo),
		ResetAfter: newA - now,
	}
}

// discreteDeficit reads the discrete token bucket's state s at now, as
// discreteBucket does: the deficit d at the tick of now, the tokens a a
// tick adds, and that tick. ok is false for Params with no refill.
func discreteDeficit(p *Params, s State, now int64) (d u128, a uint64, tick int64, ok bool) {
	hi, lo := bits.Mul64(uint64(p.Rate), uint64(p.Interval))
	a = lo / uint64(p.Period)
	if hi != 0 || a == 0 {
		return d, a, 0, false
	}
	iv := p.Interval
	tick = alignDown(now, iv)
	if s.A > now {
		ticks := uint64(s.A-tick) / uint64(iv) // whole ticks until the bucket is full
		if (s.A-tick)%iv != 0 {
			ticks++ // not a state Step wrote; the later tick is the safe reading
		}
		r := uint64(s.B)
		if s.B < 0 || r >= a {
			r = 0
		}
		d = mulU(ticks, a).sub(u64(r))
	}
	return d, a, tick, true
}
