package luasrc

import (
	"math/bits"
	"strconv"

	"github.com/sluicehq/sluice/internal/base/algo"
)

// Spec returns the spec of a limit, how take.lua and fast.lua learn it: one
// string, the same on every call for the same limit, which the script
// parses once and caches:
//
//	kind rate period capacity interval shadow block_for class a b c d debit offset
//
// with the compiled Params p (soft and elastic margins included), shadow
// and debit (Params.Debit) as 0 or 1, block_for in ns, and the quantities
// of the fast path
// (fast.lua), computed here exactly in 128 bits, for the class:
//
//	W  windows (fixed, sliding, sketch): a = the period in whole seconds
//	   (0 if not), b = the period in ns if it divides a second (0 if not),
//	   c = the period in ns, d = 1 if it is whole microseconds
//	G  GCRA, smooth token bucket, leaky bucket, with g = gcd(rate, period):
//	   a = rate/g, b = period/g, c = capacity·b, d = g
//	D  discrete token bucket: a = tokens a tick (0: none), b = the refill
//	   interval in whole seconds, c = in ns if it divides a second, d = the
//	   interval in ns
//	L  sliding log: a = the period in ns
//	-  none: every decision takes the exact path (algo.lua)
//
// A class is given only when its quantities keep the fast path's numbers
// below 2^52 (fast.lua checks the rest at run time).
func Spec(p *algo.Params, shadow bool, blockFor int64) string {
	b := make([]byte, 0, 96)
	num := func(v int64) { b = strconv.AppendInt(b, v, 10); b = append(b, ' ') }
	num(int64(p.Kind))
	num(p.Rate)
	num(p.Period)
	num(p.Capacity)
	num(p.Interval)
	num(int64(boolInt(shadow)))
	num(blockFor)
	cls, f := fastClass(p)
	b = append(b, cls)
	for _, v := range f {
		b = append(b, ' ')
		b = strconv.AppendInt(b, v, 10)
	}
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(boolInt(p.Debit)), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, p.Offset, 10)
	return string(b)
}

// exactOnly, set only in a build with the tag sluice_exactlua
// (exactonly.go), gives every limit the class "-".
var exactOnly = false

// fastMax bounds the static quantities of the fast path: the script adds
// at most a few of them and stays below 2^52.
const fastMax = 1 << 51

func boolInt(v bool) int {
	if v {
		return 1
	}
	return 0
}

// fastClass returns the fast path's class of p and its four quantities:
// "-" and zeros when p has none.
func fastClass(p *algo.Params) (byte, [4]int64) {
	if exactOnly || p.Offset != 0 {
		// The fast path knows only windows aligned to the epoch.
		return noClass()
	}
	switch p.Kind {
	case algo.FixedWindow, algo.SlidingWindow, algo.Sketch:
		return windowClass(p.Period)
	case algo.TokenBucket, algo.LeakyBucket, algo.GCRA:
		if p.Kind == algo.TokenBucket && p.Interval > 0 {
			return discreteClass(p)
		}
		return gcraClass(p)
	case algo.SlidingLog:
		if p.Period <= fastMax {
			return 'L', [4]int64{p.Period, 0, 0, 0}
		}
	}
	return noClass()
}

// noClass is the class of a limit the fast path cannot take: every
// decision takes the exact path (algo.lua).
func noClass() (byte, [4]int64) { return '-', [4]int64{0, 0, 0, 0} }

const e9 = 1_000_000_000

// windowClass is the class W of a window of period per: a period of whole
// seconds, or one that divides a second.
func windowClass(per int64) (byte, [4]int64) {
	var wk, wn int64
	switch {
	case per > fastMax:
	case per%e9 == 0:
		wk = per / e9
	case e9%per == 0:
		wn = per
	}
	if wk == 0 && wn == 0 {
		return noClass() // neither, or a zero period
	}
	return 'W', [4]int64{wk, wn, per, int64(boolInt(per%1000 == 0))}
}

// discreteClass is the class D of a token bucket with discrete refill:
// ticks of whole seconds, or of a period that divides a second, and the
// tokens a tick, Rate·Interval/Period (floored, as algo does).
func discreteClass(p *algo.Params) (byte, [4]int64) {
	iv := p.Interval
	if iv > fastMax || (iv%e9 != 0 && e9%iv != 0) {
		return noClass()
	}
	hi, lo := bits.Mul64(uint64(p.Rate), uint64(iv))
	var a int64
	if hi == 0 {
		a = int64(lo / uint64(p.Period))
	}
	if a > fastMax {
		return noClass()
	}
	var ik, in int64
	if iv%e9 == 0 {
		ik = iv / e9
	} else {
		in = iv
	}
	return 'D', [4]int64{a, ik, in, iv}
}

// gcraClass is the class G of GCRA, the smooth token bucket and the leaky
// bucket: the rate and period divided by their gcd g, and the capacity
// in units of g/Rate ns.
func gcraClass(p *algo.Params) (byte, [4]int64) {
	if p.Rate == 0 {
		return 'G', [4]int64{0, 0, 0, 1}
	}
	g := gcd(p.Rate, p.Period)
	r, pp := p.Rate/g, p.Period/g
	hi, tol := bits.Mul64(uint64(p.Capacity), uint64(pp))
	if hi != 0 || tol > fastMax || pp > fastMax || r > fastMax {
		return noClass()
	}
	return 'G', [4]int64{r, pp, int64(tol), g}
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
