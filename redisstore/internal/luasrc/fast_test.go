package luasrc_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/base/algo"
	"github.com/sluicehq/sluice/redisstore/internal/luasrc"
)

// Differential tests of fast.lua: random traces of realistic limits, with
// times of today (to the microsecond, as Redis TIME gives them, or to the
// nanosecond, as a caller's clock may), run through package algo and
// through the fast path, which falls back to algo.lua where it answers nil,
// as take.lua does. Every answer and every state must be identical, and
// most steps of these ordinary traces must take the fast path, or the test
// proves nothing of it.

const e9 = int64(1e9)

// realPeriods are the periods limits have: Envoy's units, and others.
var realPeriods = []int64{1e6, 1e7, 1e8, 250e6, e9, 2 * e9, 7 * e9, 60 * e9, 90 * e9, 3600 * e9, 86400 * e9, 7 * 86400 * e9, 30 * 86400 * e9}

// realParams returns realistic Params of the kind; now and then a period
// the fast path has no class for.
func realParams(r *rand.Rand, kind algo.Kind, discrete bool) algo.Params {
	for {
		p := algo.Params{Kind: kind}
		p.Period = realPeriods[r.IntN(len(realPeriods))]
		if r.IntN(10) == 0 {
			p.Period = between(r, 1e6, 100*e9) // any ns period
		}
		p.Rate = []int64{1, 3, 7, 10, 100, 1000, 10000, 1e6, 1e9, between(r, 1, 1e7)}[r.IntN(10)]
		p.Capacity = p.Rate
		switch r.IntN(4) {
		case 0:
			p.Capacity = between(r, 1, 3*p.Rate)
		case 1:
			p.Capacity = p.Rate * 11 / 10 // a soft margin
		}
		if r.IntN(20) == 0 {
			p.Rate = 0
		}
		if discrete {
			k := []int64{1, 2, 10, 60, 100}[r.IntN(5)]
			p.Interval = p.Period / k
			p.Rate = max(1, p.Rate/k) * k
		}
		if (kind == algo.SlidingWindow || kind == algo.Sketch) && p.Capacity > algo.MaxSlidingWindowCapacity {
			continue
		}
		if p.Validate() == nil {
			return p
		}
	}
}

// realStart returns a now of these years, to the microsecond or to the
// nanosecond.
func realStart(r *rand.Rand) int64 {
	t := 1_750_000_000*e9 + between(r, 0, 200_000_000*e9)
	if r.IntN(2) == 0 {
		t -= t % 1000
	}
	return t
}

// realNext returns the next now: mostly a little later, now and then the
// same, backwards, a window later, or months later (out of the fast
// path's domain).
func realNext(r *rand.Rand, now, per, rate int64, micro bool) int64 {
	gap := per / max(rate, 1)
	var t int64
	switch r.IntN(20) {
	case 0:
		t = now
	case 1:
		t = now - between(r, 0, per)
	case 2:
		t = now + between(r, per, 3*per)
	case 3:
		t = now + 90*86400*e9
	default:
		t = now + between(r, 0, 2*max(gap, 1))
	}
	if micro {
		t -= t % 1000
	}
	return t
}

// realN returns a cost: mostly 1.
func realN(r *rand.Rand, c int64) int64 {
	switch r.IntN(12) {
	case 0:
		return 0
	case 1:
		return c
	case 2:
		return c + 1
	case 3:
		return between(r, 1, max(1, c/3))
	}
	return 1
}

// fastCheck compares the driver's lines, "f|x result state", with Go's
// "result state", and counts the steps the fast path took.
func fastCheck(t *testing.T, i int, in string, got string, want []string, desc []func() string) (fast, steps int) {
	t.Helper()
	lines := strings.Split(got, "\n")
	if len(lines) != len(want) {
		t.Fatalf("trace %d: %d lines from Lua, want %d\ninput: %s\nlua: %s", i, len(lines), len(want), in, got)
	}
	for j, line := range lines {
		tag, rest, _ := strings.Cut(line, " ")
		if tag != "f" && tag != "x" {
			t.Fatalf("trace %d step %d: %s\n lua %s\ninput: %s", i, j, desc[j](), line, in)
		}
		if rest != want[j] {
			t.Fatalf("trace %d step %d (%s path): %s\n lua %s\n  go %s\ninput: %s", i, j, tag, desc[j](), rest, want[j], in)
		}
		if tag == "f" {
			fast++
		}
	}
	return fast, len(lines)
}

// TestFastStep runs realistic traces of the algorithms with a State through
// algo.Step and through fast.lua's fixed, gcra, discrete and sliding.
func TestFastStep(t *testing.T) {
	t.Parallel()
	d := newDriver(t)
	for i, c := range []struct {
		kind     algo.Kind
		discrete bool
	}{
		{algo.FixedWindow, false}, {algo.TokenBucket, false}, {algo.TokenBucket, true},
		{algo.LeakyBucket, false}, {algo.GCRA, false}, {algo.SlidingWindow, false},
	} {
		name := c.kind.String()
		if c.discrete {
			name += "/discrete"
		}
		t.Run(name, func(t *testing.T) {
			r, _ := newRand(t, uint64(40+i))
			var in []string
			var want [][]string
			var desc [][]func() string
			for range *tracesFlag {
				p := realParams(r, c.kind, c.discrete)
				micro := r.IntN(2) == 0
				now := realStart(r)
				if micro {
					now -= now % 1000
				}
				var s algo.State
				written := false
				var b strings.Builder
				b.WriteString(luasrc.Spec(&p, false, 0) + "|-")
				var w []string
				var ds []func() string
				for range between(r, stepsLo, stepsHi) {
					n := realN(r, p.Capacity)
					s2, res := algo.Step(&p, s, now, n)
					s0, now0 := s, now
					if res.Allowed && n > 0 {
						s, written = s2, true
					}
					st := "-"
					if written {
						st = fmtState(c.kind, s)
					}
					b.WriteString("|" + ints(now, n))
					w = append(w, fmtResult(res)+" "+st)
					ds = append(ds, func() string { return fmt.Sprintf("params %+v state %+v now %d n %d", p, s0, now0, n) })
					now = realNext(r, now, p.Period, p.Rate, micro)
				}
				in = append(in, b.String())
				want = append(want, w)
				desc = append(desc, ds)
			}
			got := d.batches("fstep", in, batch)
			fast, steps := 0, 0
			for j := range got {
				f, n := fastCheck(t, j, in[j], got[j], want[j], desc[j])
				fast += f
				steps += n
			}
			t.Logf("%d traces, %d steps, %d (%.0f%%) on the fast path", len(in), steps, fast, 100*float64(fast)/float64(steps))
			if fast < steps*6/10 {
				t.Errorf("only %d of %d steps took the fast path", fast, steps)
			}
		})
	}
}

// TestFastLog runs realistic traces of a sliding log through algo.LogStep
// and Log.Commit and through fast.log_step (algo.log_step where it answers
// nil), committed by algo.log_commit.
func TestFastLog(t *testing.T) {
	t.Parallel()
	d := newDriver(t)
	r, _ := newRand(t, 50)
	var in []string
	var want [][]string
	var desc [][]func() string
	for range *tracesFlag {
		p := realParams(r, algo.SlidingLog, false)
		if r.IntN(2) == 0 {
			p.Rate = between(r, 1, 20)
			p.Capacity = p.Rate // a log that fills up
		}
		micro := r.IntN(2) == 0
		now := realStart(r)
		if micro {
			now -= now % 1000
		}
		var log algo.Log
		var b strings.Builder
		b.WriteString(luasrc.Spec(&p, false, 0) + "|0 0|#")
		var w []string
		var ds []func() string
		for range between(r, stepsLo, 3*stepsHi) {
			n := realN(r, p.Capacity)
			before := logBefore(&log)
			expired, res := algo.LogStep(&p, &log, now, n)
			cost := int64(0)
			if res.Allowed {
				cost = n
			}
			log.Commit(expired, now, cost)
			b.WriteString("|" + ints(now, n))
			w = append(w, ints(int64(expired))+" "+fmtResult(res))
			now0 := now
			ds = append(ds, func() string { return fmt.Sprintf("params %+v log %s now %d n %d", p, before(), now0, n) })
			now = realNext(r, now, p.Period, p.Rate, micro)
		}
		in = append(in, b.String())
		want = append(want, w)
		desc = append(desc, ds)
	}
	got := d.batches("flog", in, batch)
	fast, steps := 0, 0
	for j := range got {
		f, n := fastCheck(t, j, in[j], got[j], want[j], desc[j])
		fast += f
		steps += n
	}
	t.Logf("%d traces, %d steps, %d (%.0f%%) on the fast path", len(in), steps, fast, 100*float64(fast)/float64(steps))
	if fast < steps*6/10 {
		t.Errorf("only %d of %d steps took the fast path", fast, steps)
	}
}

// TestFastCounts holds fast.fixed's reading of a state of the window of
// now (recognised by its prefix, its count memoised) to what algo.lua and
// Go read: a count with leading zeros is its number, and the state written
// after it canonical; a count that is no number is no state (a fresh
// window); and a count read once reads the same again.
func TestFastCounts(t *testing.T) {
	t.Parallel()
	d := newDriver(t)
	p := algo.Params{Kind: algo.FixedWindow, Rate: 100, Period: 60 * e9, Capacity: 100}
	spec := luasrc.Spec(&p, false, 0)
	now := int64(1_800_000_030) * e9 // 30 s into a minute
	end := fmt.Sprint(now + 30*e9)
	for _, c := range []struct{ state, want string }{
		{end + " 007", "f 1 92 30000000000 0 " + end + " 8"},
		{end + " 7", "f 1 92 30000000000 0 " + end + " 8"},
		{end + " 7", "f 1 92 30000000000 0 " + end + " 8"}, // memoised
		{end + " 1e3", "f 1 99 30000000000 0 " + end + " 1"},
		{end + " 0x10", "f 1 99 30000000000 0 " + end + " 1"},
		{end + " 100", "f 0 0 30000000000 30000000000 " + end + " 100"},
	} {
		got := d.run("fstep", []string{spec + "|" + c.state + "|" + ints(now, 1)})[0]
		if got != c.want {
			t.Errorf("state %q: got %q, want %q", c.state, got, c.want)
		}
	}
}
