package algo

// Naive reference implementations for the fuzz tests. They are written
// differently from the package on purpose: rational arithmetic with math/big
// instead of scaled 128-bit integers, unbounded token clocks instead of
// states relative to an idle-at time, maps of windows instead of packed
// counters, one timestamp per hit instead of merged entries. They are slow,
// and only meant for times well before math.MaxInt64.

import (
	"math"
	"math/big"
	"slices"
)

func rat(x int64) *big.Rat     { return new(big.Rat).SetInt64(x) }
func frac(a, b int64) *big.Rat { return big.NewRat(a, b) }

func add(a, b *big.Rat) *big.Rat { return new(big.Rat).Add(a, b) }
func sub(a, b *big.Rat) *big.Rat { return new(big.Rat).Sub(a, b) }
func mul(a, b *big.Rat) *big.Rat { return new(big.Rat).Mul(a, b) }
func quo(a, b *big.Rat) *big.Rat { return new(big.Rat).Quo(a, b) }

func ratMax(a, b *big.Rat) *big.Rat {
	if a.Cmp(b) >= 0 {
		return a
	}
	return b
}

// floorRat and ceilRat round to an int64 (the tests keep them in range).
func floorRat(x *big.Rat) int64 {
	q, _ := new(big.Int).DivMod(x.Num(), x.Denom(), new(big.Int))
	return q.Int64()
}

func ceilRat(x *big.Rat) int64 {
	return -floorRat(new(big.Rat).Neg(x))
}

func never(n int64) Result {
	if n == 0 {
		return Result{Allowed: true}
	}
	return Result{RetryAfter: Never}
}

// refGCRA keeps the theoretical arrival time as an exact rational; nil is a
// fresh key. It serves GCRA, the smooth token bucket and the leaky bucket.
type refGCRA struct{ tat *big.Rat }

func (g *refGCRA) step(p *Params, now, n int64) Result {
	if p.Rate == 0 {
		return never(n)
	}
	t := rat(now)
	tat := t
	if g.tat != nil {
		tat = ratMax(g.tat, t)
	}
	emission := frac(p.Period, p.Rate)
	tolerance := mul(rat(p.Capacity), emission)
	level := func(tat *big.Rat) *big.Rat { return quo(sub(tat, t), emission) } // tokens in use
	res := Result{
		Allowed:    true,
		Remaining:  max(floorRat(sub(rat(p.Capacity), level(tat))), 0),
		ResetAfter: ceilRat(sub(tat, t)),
	}
	if n == 0 {
		return res
	}
	res.Allowed = false
	next := add(tat, mul(rat(n), emission))
	if n > p.Capacity || next.Cmp(rat(math.MaxInt64)) > 0 {
		res.RetryAfter = Never
		return res
	}
	if sub(next, t).Cmp(tolerance) > 0 {
		res.RetryAfter = ceilRat(sub(sub(next, tolerance), t))
		return res
	}
	g.tat = next
	return Result{
		Allowed:    true,
		Remaining:  floorRat(sub(rat(p.Capacity), level(next))),
		ResetAfter: ceilRat(sub(next, t)),
	}
}

// refDiscrete is the token clock of the discrete token bucket: S counts
// tokens ever taken, the bucket is short of max(0, S − k·a) tokens at tick
// k; nil is a fresh key (S = −∞).
type refDiscrete struct{ s *big.Int }

func (d *refDiscrete) step(p *Params, now, n int64) Result {
	a := new(big.Int).Mul(big.NewInt(p.Rate), big.NewInt(p.Interval))
	a.Quo(a, big.NewInt(p.Period))
	k := big.NewInt(now / p.Interval)
	ka := new(big.Int).Mul(k, a)
	s := ka
	if d.s != nil && d.s.Cmp(ka) > 0 {
		s = d.s
	}
	short := new(big.Int).Sub(s, ka)
	// fullAt returns the time of the tick at which the bucket is full.
	fullAt := func(s *big.Int) *big.Rat {
		ticks := ceilRat(new(big.Rat).SetFrac(s, a))
		return mul(rat(ticks), rat(p.Interval))
	}
	res := Result{
		Allowed:    true,
		Remaining:  p.Capacity - min(short.Int64(), p.Capacity),
		ResetAfter: max(ceilRat(sub(fullAt(s), rat(now))), 0),
	}
	if n == 0 {
		return res
	}
	res.Allowed = false
	next := new(big.Int).Add(s, big.NewInt(n))
	if n > p.Capacity || fullAt(next).Cmp(rat(math.MaxInt64)) > 0 {
		res.RetryAfter = Never
		return res
	}
	if new(big.Int).Sub(next, ka).Cmp(big.NewInt(p.Capacity)) > 0 {
		// the first tick k' with S − k'·a <= C − n
		need := new(big.Int).Sub(s, big.NewInt(p.Capacity-n))
		ticks := ceilRat(new(big.Rat).SetFrac(need, a))
		res.RetryAfter = ticks*p.Interval - now
		return res
	}
	d.s = next
	return Result{
		Allowed:    true,
		Remaining:  p.Capacity - new(big.Int).Sub(next, ka).Int64(),
		ResetAfter: ceilRat(sub(fullAt(next), rat(now))),
	}
}

// refWindows keeps a count per window index for the fixed and sliding
// window counters. latest is the latest window a request was admitted in;
// an earlier now is evaluated there, at its start.
type refWindows struct {
	count  map[int64]int64
	latest int64
}

func newRefWindows() *refWindows { return &refWindows{count: map[int64]int64{}, latest: -1} }

// at returns the window a request at t is counted in and the time elapsed
// in it.
func (w *refWindows) at(p *Params, t int64) (win, elapsed int64) {
	win = t / p.Period
	if win < w.latest {
		return w.latest, 0
	}
	return win, t - win*p.Period
}

func (w *refWindows) fixed(p *Params, now, n int64) Result {
	win, _ := w.at(p, now)
	end := min((win+1)*p.Period, math.MaxInt64)
	c := w.count[win]
	res := Result{Allowed: true, ResetAfter: end - now}
	if p.Rate == 0 {
		r := never(n)
		r.ResetAfter = end - now
		return r
	}
	res.Remaining = max(p.Capacity-c, 0)
	if n == 0 {
		return res
	}
	res.Allowed = false
	switch {
	case n > p.Capacity:
		res.RetryAfter = Never
	case c+n > p.Capacity:
		res.RetryAfter = end - now
	default:
		w.count[win] += n
		w.latest = win
		return Result{Allowed: true, Remaining: p.Capacity - c - n, ResetAfter: end - now}
	}
	return res
}

// estimate returns the sliding window estimate at t (plus extra hits).
func (w *refWindows) estimate(p *Params, t, extra int64) *big.Rat {
	win, e := w.at(p, t)
	weight := frac(p.Period-e, p.Period)
	return add(mul(rat(w.count[win-1]), weight), rat(w.count[win]+extra))
}

func (w *refWindows) sliding(p *Params, now, n int64) Result {
	win, _ := w.at(p, now)
	end := (win + 1) * p.Period
	c := rat(p.Capacity)
	if p.Rate == 0 {
		r := never(n)
		r.ResetAfter = end - now
		return r
	}
	left := func(extra int64) int64 { return max(floorRat(sub(c, w.estimate(p, now, extra))), 0) }
	res := Result{Allowed: true, ResetAfter: end - now, Remaining: left(0)}
	if n == 0 {
		return res
	}
	res.Allowed = false
	if n > p.Capacity {
		res.RetryAfter = Never
		return res
	}
	fits := func(t int64) bool { return w.estimate(p, t, n).Cmp(c) <= 0 }
	if !fits(now) {
		// The estimate never grows with time: search for the first fit.
		// fits(hi): every admitted hit has left both windows.
		lo, hi := now, max(now+3*p.Period, (w.latest+2)*p.Period)
		for hi-lo > 1 {
			mid := lo + (hi-lo)/2
			if fits(mid) {
				hi = mid
			} else {
				lo = mid
			}
		}
		res.RetryAfter = hi - now
		return res
	}
	res = Result{Allowed: true, ResetAfter: end - now, Remaining: left(n)}
	w.count[win] += n
	w.latest = win
	return res
}

// refLog keeps one timestamp per logged hit, oldest first, and the latest
// time at which it changed (hits appended or expired hits dropped); a
// request before that time is judged at it. Every step drops the expired
// hits, admitted or not, as stores do.
type refLog struct {
	hits []int64
	seen int64
}

func (l *refLog) step(p *Params, now, n int64) Result {
	t := max(now, l.seen)
	var in []int64 // hits in the window, oldest first
	for _, h := range l.hits {
		if h > t-p.Period {
			in = append(in, h)
		}
	}
	if len(in) < len(l.hits) {
		l.hits, l.seen = in, t
		if len(in) == 0 {
			l.seen = 0 // an empty log is a fresh one
		}
	}
	var reset int64
	if len(in) > 0 {
		reset = in[len(in)-1] + p.Period - now
	}
	if p.Rate == 0 {
		r := never(n)
		r.ResetAfter = reset
		return r
	}
	count := int64(len(in))
	res := Result{Allowed: true, Remaining: max(p.Capacity-count, 0), ResetAfter: reset}
	if n == 0 {
		return res
	}
	res.Allowed = false
	switch {
	case n > p.Capacity:
		res.RetryAfter = Never
	case count+n > p.Capacity:
		// the hit that must leave last is the (count − (C − n))-th oldest
		res.RetryAfter = in[count-(p.Capacity-n)-1] + p.Period - now
	default:
		l.hits, l.seen = slices.Clone(in), t
		for range n {
			l.hits = append(l.hits, t)
		}
		return Result{Allowed: true, Remaining: p.Capacity - count - n, ResetAfter: t + p.Period - now}
	}
	return res
}

// expand returns one timestamp per hit of a log.
func expand(entries []LogEntry) []int64 {
	var out []int64
	for _, e := range entries {
		for range e.N {
			out = append(out, e.At)
		}
	}
	return out
}
