package algo

import "math"

// Overdraw is Step for a hit decided on its own, as envoyproxy/ratelimit
// counts (sluice.Limiter.TakeEach): a hit that fits is admitted as by
// Step; a hit of cost n > 0 that does not fit, but finds the limit not
// exhausted (Step's Remaining at least 1: a hit of cost 1 would fit), is
// consumed all the same, past the limit. The returned state then carries
// the debt, which later hits see, peeks included (a limit in debt denies
// them), until time repays it. That is what makes a debit after the fact
// limit: Envoy's apply_on_stream_done checks with a cost of 0, then
// charges the real cost when the response ends, and a charge that goes
// over must deny the next check.
//
// The Result of an overdrawn hit is a denial with Overdrawn set,
// Remaining 0, and its times measured on the new state: ResetAfter until
// the state is idle, RetryAfter until a hit of cost 1 would fit again.
//
// A limit in debt already, or zero (but a zero fixed window not in debt
// yet: ChargesExhausted), is left as Step leaves it: a denied hit never
// digs a deeper hole, so a client that keeps asking while
// limited never pushes its own recovery further away. A Debit limit is the
// exception: its charges are what was spent, and every one is counted. A limit exhausted
// exactly (Remaining 0, not in debt) is charged only where that pushes no
// recovery away, or the limit asks for it (ChargesExhausted): a fixed
// window, whose debt ends with its window, and a limit with Debit set. So
// a charge of 1 after the fact that lands on an exhausted limit still
// makes the next check deny, as in envoyproxy/ratelimit. The debt is
// bounded by the cost of one hit (at most MaxCost) beyond the limit.
//
// For the algorithms without a State (SlidingLog, Sketch), a store applies
// the same rule with Overdraws and OverdrawsExhausted: it commits the
// hit's cost (Log.Commit, CMSketch.Add) when one of them says so.
func Overdraw(p *Params, s State, now, n int64) (State, Result) {
	next, r := Step(p, s, now, n)
	now = clampNow(now)
	if n <= 0 && r.Allowed && (p.Rate > 0 || p.Kind == FixedWindow) {
		// A peek at a state in debt is over the limit until the debt is
		// repaid. Time going backwards makes a bucket look fuller, and a
		// sliding window weigh its previous count in full, and so may
		// deny a peek that no debt explains: the safe side.
		if retry, ok := debt(p, s, now); ok {
			r.Allowed, r.RetryAfter = false, retry
		}
		return next, r
	}
	if !Overdraws(r, n) && !OverdrawsExhausted(p, r, n, func() bool { _, d := debt(p, s, now); return d }) {
		return next, r
	}
	var f State
	switch p.Kind {
	case FixedWindow:
		f = fixedForce(p, s, now, n)
	case TokenBucket:
		if p.Interval > 0 {
			f = discreteForce(p, s, now, n)
		} else {
			f = gcraForce(p, s, now, n)
		}
	case LeakyBucket, GCRA:
		f = gcraForce(p, s, now, n)
	case SlidingWindow:
		f = slidingForce(p, s, now, n)
	default:
		return next, r
	}
	_, after := Step(p, f, now, 1)
	return f, Result{
		Remaining:  0,
		ResetAfter: after.ResetAfter,
		RetryAfter: after.RetryAfter,
		Overdrawn:  true,
	}
}

// Overdraws reports whether a hit of cost n that Step, LogStep or
// CMSketch.Check answered with r is consumed under Overdraw's rule: it
// was denied, costs something, and found the limit not exhausted.
func Overdraws(r Result, n int64) bool {
	return !r.Allowed && n > 0 && r.Remaining >= 1
}

// ChargesExhausted reports whether, under Overdraw, a charge that finds
// p's limit exhausted but not in debt is counted: for a limit charged
// after the fact (Debit), and for a fixed window, whose debt ends with its
// window and so never delays a recovery. Not for a zero limit.
func (p *Params) ChargesExhausted() bool {
	if p.Kind == FixedWindow && p.Rate == 0 {
		return true
	}
	return (p.Debit || p.Kind == FixedWindow) && p.Rate > 0 && p.Capacity > 0
}

// OverdrawsExhausted reports whether a hit of cost n answered r, which
// found the limit exhausted (no room left), is consumed all the same:
// when p ChargesExhausted and the limit was not in debt (inDebt: a hit of
// cost 0 would have been denied, as Overdraw denies a peek at a debt), or
// whatever its debt when p is a Debit limit: a charge after the fact is
// what was spent (an LLM answer's tokens), and a key already over its
// limit must not spend more for free. inDebt is asked only for a hit of
// a limit without Debit, so that no other pays for it.
func OverdrawsExhausted(p *Params, r Result, n int64, inDebt func() bool) bool {
	return !r.Allowed && n > 0 && r.Remaining < 1 && p.ChargesExhausted() && (p.Debit || !inDebt())
}

// fixedForce counts n in the window of now (or the state's, when the
// clock went backwards), past the capacity: fixedWindow's admitted state
// without its check.
func fixedForce(p *Params, s State, now, n int64) State {
	ws, count := readFixed(p, s, now)
	return State{A: windowEnd(p, ws), B: addSat(count, n)}
}

// gcraForce sets TAT' = max(TAT, now) + n·T past the tolerance: gcra's
// admitted state without its check. A TAT' beyond math.MaxInt64 is cut
// there (the key then stays limited to the end of representable time).
func gcraForce(p *Params, s State, now, n int64) State {
	rate, period := uint64(p.Rate), uint64(p.Period)
	x, _ := readGCRA(p, s, now)
	x2 := x.add(mulU(uint64(n), period))
	q := x2.divCeil(rate)
	if q.hi != 0 || q.lo > uint64(math.MaxInt64-now) {
		return State{A: math.MaxInt64}
	}
	b := mulU(q.lo, rate).sub(x2).lo
	return State{A: now + int64(q.lo), B: int64(b)}
}

// discreteForce takes n tokens past an empty bucket: discreteBucket's
// admitted state without its check, cut at math.MaxInt64 like gcraForce.
func discreteForce(p *Params, s State, now, n int64) State {
	d, a, tick, ok := discreteDeficit(p, s, now)
	if !ok {
		return s
	}
	iv := p.Interval
	d2 := d.add(u64(uint64(n)))
	q := d2.divCeil(a)
	span := mulU(q.lo, uint64(iv))
	if q.hi != 0 || span.hi != 0 || span.lo > uint64(math.MaxInt64-tick) {
		return State{A: math.MaxInt64}
	}
	b := mulU(q.lo, a).sub(d2).lo
	return State{A: tick + int64(span.lo), B: int64(b)}
}

// slidingForce counts n in the current window past the capacity; the
// count saturates at the 32 bits the state packs it in (above any
// capacity, so a saturated count still denies).
func slidingForce(p *Params, s State, now, n int64) State {
	w := readSlideOf(p, s, now)
	curr := min(w.curr+uint64(n), math.MaxUint32)
	return State{A: slideIdle(p, &w), B: int64(w.prev<<32 | curr)}
}

// debt reports whether the state s is in debt at now (counts more than
// its Capacity: a window's count or estimate above it, a bucket's TAT −
// now beyond Capacity·T or deficit beyond Capacity) and the time until it
// is not.
func debt(p *Params, s State, now int64) (retry int64, inDebt bool) {
	if s.A <= now {
		return 0, false
	}
	switch {
	case p.Kind == FixedWindow:
		ws, count := readFixed(p, s, now)
		if count <= p.Capacity {
			return 0, false
		}
		return windowEnd(p, ws) - now, true
	case p.Kind == SlidingWindow:
		w := readSlideOf(p, s, now)
		r := w.result(p.Period, min(p.Capacity, MaxSlidingWindowCapacity), now, 0, true)
		return r.RetryAfter, !r.Allowed
	case p.Kind == TokenBucket && p.Interval > 0:
		d, a, tick, ok := discreteDeficit(p, s, now)
		c := u64(uint64(p.Capacity))
		if !ok || !c.less(d) {
			return 0, false
		}
		j := d.sub(c).divCeil(a)
		span := mulU(j.lo, uint64(p.Interval))
		if j.hi != 0 || span.hi != 0 || span.lo > uint64(math.MaxInt64-tick) {
			return Never, true
		}
		return tick + int64(span.lo) - now, true
	case p.Kind == TokenBucket || p.Kind == LeakyBucket || p.Kind == GCRA:
		tol := mulU(uint64(p.Capacity), uint64(p.Period))
		x, _ := readGCRA(p, s, now)
		if !tol.less(x) {
			return 0, false
		}
		return x.sub(tol).divCeil(uint64(p.Rate)).int64(), true
	}
	return 0, false
}
