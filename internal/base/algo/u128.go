package algo

import (
	"math"
	"math/bits"
)

// u128 is an unsigned 128-bit integer. The algorithms compare and divide
// products of two int64 values (a count times a duration) exactly with it,
// without floating point.
type u128 struct{ hi, lo uint64 }

var maxU128 = u128{math.MaxUint64, math.MaxUint64}

// u64 returns x as a u128.
func u64(x uint64) u128 { return u128{0, x} }

// mulU returns the full product a*b.
func mulU(a, b uint64) u128 {
	hi, lo := bits.Mul64(a, b)
	return u128{hi, lo}
}

// add returns x+y, saturated at the largest u128.
func (x u128) add(y u128) u128 {
	lo, c := bits.Add64(x.lo, y.lo, 0)
	hi, c := bits.Add64(x.hi, y.hi, c)
	if c != 0 {
		return maxU128
	}
	return u128{hi, lo}
}

// sub returns x-y, or 0 when y > x.
func (x u128) sub(y u128) u128 {
	if x.less(y) {
		return u128{}
	}
	lo, b := bits.Sub64(x.lo, y.lo, 0)
	hi, _ := bits.Sub64(x.hi, y.hi, b)
	return u128{hi, lo}
}

// less reports whether x < y.
func (x u128) less(y u128) bool {
	return x.hi < y.hi || (x.hi == y.hi && x.lo < y.lo)
}

// div returns x/d rounded down and the remainder. d > 0.
func (x u128) div(d uint64) (u128, uint64) {
	qhi, r := x.hi/d, x.hi%d
	qlo, r := bits.Div64(r, x.lo, d)
	return u128{qhi, qlo}, r
}

// divCeil returns x/d rounded up. d > 0.
func (x u128) divCeil(d uint64) u128 {
	q, r := x.div(d)
	if r != 0 {
		q = q.add(u64(1))
	}
	return q
}

// int64 returns x saturated at math.MaxInt64.
func (x u128) int64() int64 {
	if x.hi != 0 || x.lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(x.lo)
}

// clampNow maps now into [0, math.MaxInt64-1]: times before the Unix epoch
// are treated as the epoch, and the last representable nanosecond is kept
// free so that an idle-at time of math.MaxInt64 is always in the future.
func clampNow(now int64) int64 {
	if now < 0 {
		return 0
	}
	if now == math.MaxInt64 {
		return math.MaxInt64 - 1
	}
	return now
}

// alignDown returns the start of the period-long, epoch-aligned window that
// holds t. t >= 0, period > 0.
func alignDown(t, period int64) int64 { return t - t%period }

// alignFrom returns the start of the period-long window, aligned off past
// the epoch (0 <= off < period), that holds t >= 0. The windows [off +
// k·period, off + (k+1)·period) are preceded by a shorter one, [0, off),
// so that no time is negative (no real clock reads one so near the epoch).
func alignFrom(t, period, off int64) int64 {
	if t < off {
		return 0
	}
	return off + alignDown(t-off, period)
}

// windowEnd returns the end of the window of p that starts at ws (see
// alignFrom), cut at math.MaxInt64.
func windowEnd(p *Params, ws int64) int64 {
	if ws == 0 && p.Offset > 0 {
		return p.Offset
	}
	return addSat(ws, p.Period)
}
