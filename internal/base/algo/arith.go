package algo

import (
	"math"
	"math/bits"
)

// mul64 returns the 128-bit product of two non-negative int64s.
func mul64(a, b int64) (hi, lo uint64) {
	return bits.Mul64(uint64(a), uint64(b))
}

// mulDiv returns a*b/c rounded down, saturated at math.MaxInt64.
// a, b >= 0 and c > 0.
func mulDiv(a, b, c int64) int64 {
	hi, lo := mul64(a, b)
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// addSat returns a+b saturated to the int64 range.
func addSat(a, b int64) int64 {
	s := a + b
	if (s > a) == (b > 0) {
		return s
	}
	if b > 0 {
		return math.MaxInt64
	}
	return math.MinInt64
}
