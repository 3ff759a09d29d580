package algo

import "math"

// fixedWindow counts requests in windows of one Period aligned to the Unix
// epoch, or Offset past it: window w is [Offset + w·Period, Offset +
// (w+1)·Period). The state is A = the end of
// the window it counts (cut at math.MaxInt64) and B = the count. A request of
// cost n is admitted when count + n <= Capacity.
//
// ResetAfter is the time until the window ends; RetryAfter on deny is the
// same (the next window starts empty), or Never for n > Capacity or a zero
// limit. When now falls in a window before the state's (time went
// backwards), the request is counted in the state's window.
func fixedWindow(p *Params, s State, now, n int64) (State, Result) {
	ws, count := readFixed(p, s, now)
	end := windowEnd(p, ws)
	res := Result{Allowed: true, ResetAfter: end - now}
	if p.Rate == 0 {
		return s, zeroLimit(n, end-now)
	}
	res.Remaining = max(p.Capacity-count, 0)
	if n == 0 {
		return s, res
	}
	res.Allowed = false
	switch {
	case n > p.Capacity:
		res.RetryAfter = Never
		return s, res
	case count > p.Capacity-n:
		res.RetryAfter = end - now
		return s, res
	}
	return State{A: end, B: count + n}, Result{
		Allowed:    true,
		Remaining:  p.Capacity - count - n,
		ResetAfter: end - now,
	}
}

// readFixed reads the fixed window state s at now: the start of the
// window it counts in and its count.
func readFixed(p *Params, s State, now int64) (ws, count int64) {
	per, off := p.Period, p.Offset
	ws = alignFrom(now, per, off)
	if s.A > now {
		// s.A-1 is in the state's window, which is this one or, when the
		// clock went backwards, a later one.
		ws = max(ws, alignFrom(s.A-1, per, off))
		count = max(s.B, 0)
	}
	return ws, count
}

// slidingWindow is the sliding window counter: the counts of the current and
// the previous epoch-aligned window, weighted as if the previous window's
// requests had been spread evenly over it. With e the time elapsed in the
// current window, a request of cost n is admitted when
//
//	prev·(Period − e)/Period + curr + n <= Capacity
//
// evaluated exactly as prev·(Period − e) + (curr + n)·Period <=
// Capacity·Period in 128 bits. The state packs prev (high 32 bits) and curr
// (low 32 bits) into B, which is why Capacity is at most
// MaxSlidingWindowCapacity; A is the idle-at time, the end of the current
// window plus one Period (cut at math.MaxInt64).
//
// Remaining is Capacity minus the estimate (the weighted previous count
// rounded up); ResetAfter the time until the current window ends; RetryAfter
// on deny the exact time until the estimate has fallen enough for the same
// request, in this window or the next, or Never for n > Capacity or a zero
// limit.
//
// When now falls before the state's current window (time went backwards),
// the request is counted in the state's window as if it came at its start,
// with the full weight of the previous window. When the idle-at time of a
// window is cut at math.MaxInt64 (windows ending within one Period of the
// year 2262), the state no longer tells which of the last two windows it
// counts; it is then read as counting the window of now (never as an older
// window whose counts have partly expired), with the full previous weight
// before the last window. Both readings over-count, never under-count.
func slidingWindow(p *Params, s State, now, n int64) (State, Result) {
	per := p.Period
	c := min(p.Capacity, MaxSlidingWindowCapacity)
	w := readSlideOf(p, s, now)
	if p.Rate == 0 {
		return s, zeroLimit(n, w.end(per)-now)
	}
	res := w.result(per, c, now, n, false)
	if !res.Allowed || n == 0 {
		return s, res
	}
	return State{A: slideIdle(p, &w), B: int64(w.prev<<32 | (w.curr + uint64(n)))}, res
}

// readSlideOf reads the state of a sliding window of p: aligned to the
// epoch (readSlide), or offset (readSlideFrom).
func readSlideOf(p *Params, s State, now int64) slide {
	if p.Offset != 0 {
		return readSlideFrom(p, s, now)
	}
	return readSlide(p.Period, s, now)
}

// slideIdle is the idle-at time of a sliding window's state whose current
// window is w's: when the window after it ends, and its count weighs
// nothing. An offset window's (a calendar period's) next one may be longer
// than its Period, by at most an eighth (31 days after 28, a 25-hour day
// after a 23-hour one, 366 days after 365): an eighth more is kept.
func slideIdle(p *Params, w *slide) int64 {
	idle := addSat(w.end(p.Period), p.Period)
	if p.Offset != 0 {
		idle = addSat(idle, p.Period/8)
	}
	return idle
}

// readSlideFrom reads the state s of a sliding window whose windows are
// offset from the epoch (calendar periods: each its own length, so the
// state's window is told by where its idle-at time falls from the start of
// now's window ws, not by alignment). With d = s.A - ws: d >= 1.5 Period,
// the state counts now's window (or, the clock gone backwards, a later
// one: counted in now's); 0.5 Period < d < 1.5 Period, the window before;
// less, an older one, which weighs nothing.
func readSlideFrom(p *Params, s State, now int64) slide {
	per := p.Period
	w := slide{ws: alignFrom(now, per, p.Offset)}
	w.e = now - w.ws
	if s.A > now {
		prev, curr := uint64(uint32(s.B>>32)), uint64(uint32(s.B))
		switch d := s.A - w.ws; {
		case d > per && d-per >= per/2:
			w.prev, w.curr = prev, curr
		case d > per/2:
			w.prev = curr
		}
	}
	return w
}

// readSlide reads the sliding window counter's state s at now: the counts
// of the window of now and the one before (see slidingWindow for the
// clock going backwards and the windows cut at math.MaxInt64).
func readSlide(per int64, s State, now int64) slide {
	w := slide{ws: alignDown(now, per)}
	w.e = now - w.ws
	if s.A > now {
		prev, curr := uint64(uint32(s.B>>32)), uint64(uint32(s.B))
		var sws int64 // start of the state's current window
		switch {
		case s.A == math.MaxInt64:
			last := alignDown(math.MaxInt64-1, per)
			if w.ws == last {
				sws = last
			} else {
				sws = max(w.ws, last-per)
				w.e, w.pinned = 0, true
			}
		case s.A-1-per < 0:
			sws = 0 // not a state Step wrote
		default:
			sws = alignDown(s.A-1-per, per)
		}
		switch {
		case sws >= w.ws:
			if sws > w.ws {
				w.ws, w.e = sws, 0 // clock went backwards
			}
			w.prev, w.curr = prev, curr
		default: // sws is the window before now's
			w.prev = curr
		}
	}
	return w
}

// slide is the weighted two-window estimate shared by the sliding window
// counter and the sketch: prev and curr counts, the current window's start
// ws and the time e elapsed in it (0 <= e < Period).
type slide struct {
	prev, curr uint64
	ws, e      int64
	pinned     bool // e is held at 0 until the window ends (cut idle-at time)
}

func (w *slide) end(per int64) int64 { return addSat(w.ws, per) }

// weighted returns prev·(Period − e) + count·Period.
func (w *slide) weighted(per int64, count uint64) u128 {
	return mulU(w.prev, uint64(per-w.e)).add(mulU(count, uint64(per)))
}

// result decides a request of cost n against capacity c (c <= n is checked
// against the estimate, never the raw counts). curr + n stays within uint64
// because both are at most MaxSlidingWindowCapacity or MaxInt64.
//
// debt: a peek at an estimate above the capacity (a debt, see Overdraw) is
// denied until the estimate is back within it.
func (w *slide) result(per, c int64, now, n int64, debt bool) Result {
	limit := mulU(uint64(c), uint64(per))
	res := Result{Allowed: true, ResetAfter: w.end(per) - now}
	if n == 0 {
		res.Remaining = w.left(per, limit, w.curr)
		if debt && limit.less(w.weighted(per, w.curr)) {
			res.Allowed = false
			if t := w.retryAt(per, c, 0); t == math.MaxInt64 {
				res.RetryAfter = Never
			} else {
				res.RetryAfter = max(t-now, 1)
			}
		}
		return res
	}
	if n > c {
		res.Remaining = w.left(per, limit, w.curr)
		res.RetryAfter = Never
		res.Allowed = false
		return res
	}
	after := w.curr + uint64(n)
	if !limit.less(w.weighted(per, after)) {
		res.Remaining = w.left(per, limit, after)
		return res
	}
	res.Allowed = false
	res.Remaining = w.left(per, limit, w.curr)
	if t := w.retryAt(per, c, n); t == math.MaxInt64 {
		res.RetryAfter = Never
	} else {
		res.RetryAfter = max(t-now, 1)
	}
	return res
}

// left returns Capacity minus the estimate with count as the current count,
// rounded down to whole requests, never negative.
func (w *slide) left(per int64, limit u128, count uint64) int64 {
	x := w.weighted(per, count)
	if limit.less(x) {
		return 0
	}
	q, _ := limit.sub(x).div(uint64(per))
	return q.int64()
}

// retryAt returns the earliest time at which a request of cost n <= c,
// denied now, would be admitted if nothing else happened: when
// prev·(Period − e) <= (c − curr − n)·Period in this window, or else when
// curr·(Period − e) <= (c − n)·Period in the next. It returns
// math.MaxInt64 for never.
func (w *slide) retryAt(per, c, n int64) int64 {
	base := w.ws
	if w.pinned {
		// The estimate is frozen until this window ends; the next one is
		// the last and keeps these counts as its own (see slidingWindow).
		base = w.end(per)
	}
	if w.curr <= uint64(c-n) && w.prev > 0 {
		k := uint64(c-n) - w.curr
		d, _ := mulU(k, uint64(per)).div(w.prev)
		if !d.less(u64(uint64(per))) {
			return base // only when pinned: fits once the window ends
		}
		return addSat(base, per-int64(d.lo))
	}
	if w.pinned {
		return math.MaxInt64
	}
	next := w.end(per)
	if next == math.MaxInt64 {
		return math.MaxInt64 // the last window: its counts never leave
	}
	if w.curr <= uint64(c-n) {
		return next
	}
	d, _ := mulU(uint64(c-n), uint64(per)).div(w.curr) // < per
	return addSat(next, per-int64(d.lo))
}
