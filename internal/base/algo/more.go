package algo

import "math/bits"

// AvailableAfter returns how long after a step (or a peek) that returned
// r a request of cost want would be admitted, if nothing were consumed
// meanwhile, as far as r tells it: r.ResetAfter, and r.Remaining, which
// may be any lower bound of the quota left. It is 0 when want is at most
// r.Remaining, and Never when want exceeds the capacity or the limit is
// zero.
//
// It is the time until want hits of quota are available again:
//
//   - FixedWindow: the end of the window, where the whole quota returns.
//   - TokenBucket, LeakyBucket, GCRA: ResetAfter less the time the bucket
//     takes to refill (drain) the Capacity − want tokens it may still
//     lack then; with the exact Remaining, the time until the next token,
//     at most 1 ns late (ResetAfter is rounded up).
//   - TokenBucket with discrete refill: the tick at which enough tokens
//     have been added; with the exact Remaining, the next tick.
//   - SlidingWindow and Sketch: the time, in the next window, at which
//     the current window's count, however large r allows it to be (at
//     most Capacity − Remaining), weighs little enough. Exact when the
//     previous window is empty; when it is not, more quota comes earlier,
//     as its weight fades, which r does not tell.
//   - SlidingLog: ResetAfter, when the log is empty; r does not tell when
//     its oldest entries leave, which is earlier.
//   - Concurrency: ResetAfter, when the earliest permit held expires (a
//     holder may release one sooner); its costs are 0 and 1.
//
// So a request of cost want made at that time is always admitted (if
// nothing else was consumed; for the sketch, if no other key raised its
// counters), and for the fixed window and the buckets not a moment later
// than needed.
func AvailableAfter(p *Params, r Result, want int64) int64 {
	have := max(r.Remaining, 0)
	if want <= have {
		return 0
	}
	c := p.Capacity
	if p.Period <= 0 || p.Rate <= 0 || want > c {
		return Never
	}
	reset := max(r.ResetAfter, 0)
	switch p.Kind {
	case TokenBucket, LeakyBucket, GCRA:
		if p.Interval > 0 {
			return discreteAfter(p, reset, want)
		}
		// The bucket holds Capacity − x/T tokens, with x = TAT − now <=
		// reset and T = Period/Rate: want fit once x has fallen to
		// (Capacity − want)·T.
		return max(reset-mulDiv(c-want, p.Period, p.Rate), 1)
	case SlidingWindow, Sketch:
		// The current count is at most c − have; in the next window it
		// weighs count·(Period − x)/Period, at most c − want once
		// x >= Period·(want − have)/(c − have).
		x := mulU(uint64(want-have), uint64(p.Period)).divCeil(uint64(c - have)).int64()
		return addSat(reset, x)
	}
	// FixedWindow and SlidingLog: everything is back at reset.
	return max(reset, 1)
}

// discreteAfter is AvailableAfter for the token bucket with discrete
// refill: reset is the time until the tick at which the bucket is full,
// m ticks away, and the deficit then is at most m·a (a tokens a tick), so
// want fit after the first m − ⌊(Capacity − want)/a⌋ ticks.
func discreteAfter(p *Params, reset, want int64) int64 {
	hi, lo := bits.Mul64(uint64(p.Rate), uint64(p.Interval))
	a := lo / uint64(p.Period)
	if hi != 0 || a == 0 {
		return Never // not valid Params: no refill
	}
	iv := p.Interval
	m := reset / iv
	if reset%iv != 0 {
		m++
	}
	if m == 0 {
		return 1 // a full bucket: want > Capacity was answered above
	}
	spare := min(int64(uint64(p.Capacity-want)/a), m-1) // ticks not needed
	return reset - spare*iv
}
