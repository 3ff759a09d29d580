package luasrc_test

import (
	"cmp"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/base/algo"
)

// Differential tests: random traces run through package algo and, in one
// EVAL per batch, through algo.lua on a real redis-server; every result and
// every state must be identical.

const (
	maxI    = math.MaxInt64
	batch   = 100 // traces per EVAL
	stepsLo = 8
	stepsHi = 40
)

// specials are the int64 values around which arithmetic changes form.
var specials = []int64{0, 1, 2, 3, 1 << 24, 1<<32 - 2, 1<<32 - 1, 1 << 32, 1 << 40, 1<<53 - 1, 1 << 53, 1<<53 + 1, 1 << 62, maxI - 2, maxI - 1, maxI}

// anyBits returns a value of random bit length up to bits (<= 63).
func anyBits(r *rand.Rand, bits int) int64 {
	k := r.IntN(bits + 1)
	if k == 0 {
		return 0
	}
	return int64(r.Uint64() >> (64 - k))
}

func between(r *rand.Rand, lo, hi int64) int64 {
	if hi <= lo {
		return lo
	}
	return lo + int64(r.Uint64N(uint64(hi-lo)+1)) // lo >= 0: no overflow
}

func addSat(a, b int64) int64 {
	if a > maxI-b {
		return maxI
	}
	return a + b
}

func subSat(a, b int64) int64 {
	if a < b {
		return 0
	}
	return a - b
}

// count returns a count (rate, capacity or cost) around x, or an extreme.
func count(r *rand.Rand, x int64) int64 {
	switch r.IntN(10) {
	case 0:
		return 0
	case 1:
		return specials[r.IntN(len(specials))]
	case 2:
		return anyBits(r, 40)
	case 3:
		return anyBits(r, 63)
	default:
		return max(1, between(r, x/2, min(x, maxI/3)*3))
	}
}

// genParams returns random valid Params of the kind; realistic magnitudes
// most of the time, and the extremes of the valid domain otherwise.
func genParams(r *rand.Rand, kind algo.Kind) algo.Params {
	for {
		p := algo.Params{Kind: kind}
		if r.IntN(3) != 0 {
			p.Period = between(r, 1e6, 86400e9)
			if r.IntN(2) == 0 {
				p.Period = []int64{1e6, 1e9, 60e9, 3600e9, 86400e9}[r.IntN(5)]
			}
			p.Rate = between(r, 1, 1e6)
			p.Capacity = max(1, between(r, p.Rate/2, p.Rate*2))
			if r.IntN(8) == 0 {
				p.Rate = 0
			}
		} else {
			switch r.IntN(4) {
			case 0:
				p.Period = specials[r.IntN(len(specials))]
			case 1:
				p.Period = between(r, 1, 1000)
			default:
				p.Period = anyBits(r, 63)
			}
			p.Rate = count(r, 1e3)
			p.Capacity = count(r, p.Rate)
		}
		if kind == algo.TokenBucket && r.IntN(2) == 0 {
			p.Interval, p.Rate = discrete(r, p.Period)
		}
		if (kind == algo.FixedWindow || kind == algo.SlidingWindow) && r.IntN(3) == 0 {
			p.Offset = between(r, 0, p.Period-1)
		}
		if kind == algo.SlidingWindow && p.Capacity > algo.MaxSlidingWindowCapacity {
			p.Capacity = between(r, 0, algo.MaxSlidingWindowCapacity)
		}
		if p.Validate() == nil {
			return p
		}
	}
}

// discrete returns a refill interval and a rate that add a whole number of
// tokens every interval.
func discrete(r *rand.Rand, period int64) (interval, rate int64) {
	switch r.IntN(3) {
	case 0:
		interval = max(1, period/[]int64{1, 2, 10, 100, 1000}[r.IntN(5)])
	case 1:
		interval = between(r, 1, period)
	default:
		interval = max(1, anyBits(r, 63))
	}
	g := gcd(period, interval)
	base := period / g // rate = k*base makes rate*interval = k*(interval/g)*period
	k := []int64{1, 1, 2, 10, between(r, 1, 1000), anyBits(r, 40)}[r.IntN(6)]
	hi, lo := bits.Mul64(uint64(k), uint64(base))
	if hi != 0 || lo > maxI {
		return interval, 0 // not valid: genParams draws again
	}
	return interval, int64(lo)
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// genStart returns a first now: today, near the epoch or near the end of
// int64 time.
func genStart(r *rand.Rand, per int64) int64 {
	switch r.IntN(6) {
	case 0:
		return between(r, 0, min(3*min(per, maxI/3), 1e12))
	case 1:
		return maxI - between(r, 0, 3*min(per, maxI/3))
	case 2:
		return anyBits(r, 63)
	default:
		return 1.8e18 + anyBits(r, 56)
	}
}

// genNext returns the now of the next request: the same instant, a little
// later, about a period later, much later, or earlier.
func genNext(r *rand.Rand, now, per, rate int64) int64 {
	gap := per / max(rate, 1)
	switch r.IntN(10) {
	case 0:
		return now
	case 1, 2, 3:
		return addSat(now, between(r, 0, 2*max(gap, 1)))
	case 4, 5:
		return addSat(now, between(r, 0, 2*min(per, maxI/2)))
	case 6:
		return addSat(now, anyBits(r, 63))
	case 7:
		return subSat(now, between(r, 0, min(per, maxI/2)))
	case 8:
		return subSat(now, anyBits(r, 63))
	default:
		return addSat(now, per)
	}
}

// genN returns a cost: 0, 1, up to or just above the capacity, or huge.
func genN(r *rand.Rand, c int64) int64 {
	switch r.IntN(10) {
	case 0:
		return 0
	case 1, 2, 3:
		return 1
	case 4:
		return c
	case 5:
		return addSat(c, 1)
	case 6:
		return anyBits(r, 40)
	case 7:
		return specials[r.IntN(len(specials))]
	default:
		return between(r, 1, max(1, c/2))
	}
}

// genState returns a first state: fresh, or one Step could have written
// (and some it could not) around now.
func genState(r *rand.Rand, p algo.Params, now int64) algo.State {
	if r.IntN(3) == 0 {
		return algo.State{}
	}
	var s algo.State
	switch r.IntN(6) {
	case 0:
		s.A = maxI
	case 1:
		s.A = between(r, 0, p.Period+1)
	case 2:
		s.A = anyBits(r, 63)
	case 3:
		s.A = subSat(now, between(r, 0, p.Period))
	default:
		s.A = addSat(now, between(r, 0, 2*min(p.Period, maxI/2)))
	}
	if p.Kind == algo.SlidingWindow {
		word := func() uint64 {
			switch r.IntN(4) {
			case 0:
				return 0
			case 1:
				return uint64(r.Uint32())
			}
			return uint64(between(r, 0, min(p.Capacity+1, math.MaxUint32)))
		}
		s.B = int64(word()<<32 | word())
		return s
	}
	switch r.IntN(4) {
	case 0:
		s.B = 0
	case 1:
		s.B = anyBits(r, 63)
	default:
		s.B = between(r, 0, min(max(p.Rate, p.Capacity), maxI-1))
	}
	return s
}

// ints formats xs in decimal, separated by spaces, as fmt.Sprint would
// ints: the differential tests format some two million numbers, and fmt
// took a third of their Go side's time under the race detector.
func ints(xs ...int64) string {
	var buf [128]byte
	return string(appendInts(buf[:0], xs...))
}

func appendInts(b []byte, xs ...int64) []byte {
	for i, x := range xs {
		if i > 0 {
			b = append(b, ' ')
		}
		b = strconv.AppendInt(b, x, 10)
	}
	return b
}

// writeInts writes each of xs to w in decimal, after a space.
func writeInts(w *strings.Builder, xs ...int64) {
	var buf [24]byte
	for _, x := range xs {
		w.WriteByte(' ')
		w.Write(strconv.AppendInt(buf[:0], x, 10))
	}
}

func fmtResult(r algo.Result) string {
	a := int64(0)
	if r.Allowed {
		a = 1
	}
	return ints(a, r.Remaining, r.ResetAfter, r.RetryAfter)
}

func fmtState(kind algo.Kind, s algo.State) string {
	if kind == algo.SlidingWindow {
		return ints(s.A, int64(uint32(s.B>>32)), int64(uint32(s.B)))
	}
	return ints(s.A, s.B)
}

// fmtParams writes "kind rate period capacity x", x being the refill
// interval of a token bucket or the window offset of a fixed or sliding window (the
// other is zero: Params.Validate), as the driver's params reads it.
func fmtParams(p algo.Params) string {
	return ints(int64(p.Kind), p.Rate, p.Period, p.Capacity, p.Interval+p.Offset)
}

// trace is one random case: the driver's input, the lines Go expects, and
// a description of each step for failure messages.
type trace struct {
	in    string
	want  []string
	steps []func() string // described only on failure
}

// step records the line a step must print and how to describe it.
func (tr *trace) step(want string, desc func() string) {
	tr.want = append(tr.want, want)
	tr.steps = append(tr.steps, desc)
}

func (tr *trace) check(t *testing.T, i int, got string) {
	t.Helper()
	lines := strings.Split(got, "\n")
	if len(lines) != len(tr.want) {
		t.Fatalf("trace %d: %d lines from Lua, want %d\ninput: %s\nlua: %s", i, len(lines), len(tr.want), tr.in, got)
	}
	for j := range lines {
		if lines[j] != tr.want[j] {
			t.Fatalf("trace %d step %d: %s\n lua %s\n  go %s\ninput: %s", i, j, tr.steps[j](), lines[j], tr.want[j], tr.in)
		}
	}
}

// runRandom generates the -traces traces with gen and runs them.
func runRandom(t *testing.T, d *driver, seed uint64, mode string, gen func(*rand.Rand) *trace) {
	t.Helper()
	r, _ := newRand(t, seed)
	trs := make([]*trace, *tracesFlag)
	for j := range trs {
		trs[j] = gen(r)
	}
	runTraces(t, d, mode, trs)
}

func runTraces(t *testing.T, d *driver, mode string, trs []*trace) {
	t.Helper()
	in := make([]string, len(trs))
	for i, tr := range trs {
		in[i] = tr.in
	}
	got := d.batches(mode, in, batch)
	steps := 0
	for i, tr := range trs {
		tr.check(t, i, got[i])
		steps += len(tr.want)
	}
	t.Logf("%d traces, %d steps", len(trs), steps)
}

// stepTrace generates a trace of algo.Step and its expected output.
func stepTrace(r *rand.Rand, kind algo.Kind) *trace {
	p := genParams(r, kind)
	now := genStart(r, p.Period)
	s := genState(r, p, now)
	var in strings.Builder
	in.WriteString(fmtParams(p) + " " + fmtState(kind, s))
	tr := &trace{}
	for range between(r, stepsLo, stepsHi) {
		n := genN(r, p.Capacity)
		s2, res := algo.Step(&p, s, now, n)
		same := "*"
		if !res.Allowed || n == 0 {
			same = "="
		}
		writeInts(&in, now, n)
		s0, now0 := s, now
		tr.step(fmtResult(res)+" "+same+" "+fmtState(kind, s2), func() string {
			return fmt.Sprintf("params %+v state %+v now %d n %d", p, s0, now0, n)
		})
		if res.Allowed {
			s = s2
		}
		now = genNext(r, now, p.Period, p.Rate)
	}
	tr.in = in.String()
	return tr
}

// TestStep runs random traces of the five algorithms with a State (the
// token bucket with and without discrete refill) through algo.Step and
// algo.step.
func TestStep(t *testing.T) {
	t.Parallel()
	d := newDriver(t)
	for i, kind := range []algo.Kind{algo.FixedWindow, algo.TokenBucket, algo.LeakyBucket, algo.GCRA, algo.SlidingWindow} {
		t.Run(kind.String(), func(t *testing.T) {
			runRandom(t, d, uint64(1+i), "step", func(r *rand.Rand) *trace { return stepTrace(r, kind) })
		})
	}
}

// overdrawTrace generates a trace of algo.Overdraw and its expected output.
func overdrawTrace(r *rand.Rand, kind algo.Kind) *trace {
	p := genParams(r, kind)
	debit := r.IntN(2)
	p.Debit = debit == 1
	now := genStart(r, p.Period)
	s := genState(r, p, now)
	var in strings.Builder
	in.WriteString(fmtParams(p) + " " + ints(int64(debit)) + " " + fmtState(kind, s))
	tr := &trace{}
	for range between(r, stepsLo, stepsHi) {
		n := genN(r, p.Capacity)
		s2, res := algo.Overdraw(&p, s, now, n)
		if res.Allowed || res.Overdrawn {
			s = s2
		}
		flag := "-"
		if res.Overdrawn {
			flag = "o"
		}
		writeInts(&in, now, n)
		s0, now0 := s, now
		tr.step(fmtResult(res)+" "+flag+" "+fmtState(kind, s), func() string {
			return fmt.Sprintf("params %+v state after %+v now %d n %d", p, s0, now0, n)
		})
		now = genNext(r, now, p.Period, p.Rate)
	}
	tr.in = in.String()
	return tr
}

// TestOverdraw runs random traces of the five algorithms with a State
// through algo.Overdraw and algo.overdraw: the debts of requests decided
// one by one, and peeks at them, as Redis computes them.
func TestOverdraw(t *testing.T) {
	t.Parallel()
	d := newDriver(t)
	for i, kind := range []algo.Kind{algo.FixedWindow, algo.TokenBucket, algo.LeakyBucket, algo.GCRA, algo.SlidingWindow} {
		t.Run(kind.String(), func(t *testing.T) {
			runRandom(t, d, uint64(101+i), "overdraw", func(r *rand.Rand) *trace { return overdrawTrace(r, kind) })
		})
	}
}

func fmtEntries(es []algo.LogEntry) string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = ints(e.At, e.N)
	}
	return strings.Join(parts, ",")
}

// logBefore keeps a copy of l, and describes it on demand (for a
// failure's message).
func logBefore(l *algo.Log) func() string {
	seen, sum, es := l.Seen, l.Sum, slices.Clone(l.Entries)
	return func() string { return fmt.Sprintf("seen %d sum %d [%s]", seen, sum, fmtEntries(es)) }
}

// logTrace generates a trace of algo.LogStep and Log.Commit.
func logTrace(r *rand.Rand) *trace {
	p := genParams(r, algo.SlidingLog)
	if r.IntN(2) == 0 {
		p.Capacity = between(r, 0, 20) // a log that fills up
	}
	now := genStart(r, p.Period)
	var log algo.Log
	for range r.IntN(6) {
		at := subSat(now, between(r, 0, 2*min(p.Period, maxI/2)))
		if r.IntN(4) == 0 {
			at = addSat(now, between(r, 0, min(p.Period, maxI/2)))
		}
		log.Entries = append(log.Entries, algo.LogEntry{At: at, N: genN(r, p.Capacity)})
	}
	if r.IntN(2) == 0 {
		// Sorted, as Commit keeps it; otherwise as it comes.
		slices.SortFunc(log.Entries, func(a, b algo.LogEntry) int { return cmp.Compare(a.At, b.At) })
	}
	log.Recount()
	if len(log.Entries) > 0 {
		log.Seen = log.Newest()
		if r.IntN(3) == 0 {
			log.Seen = addSat(log.Seen, between(r, 0, min(p.Period, maxI/2)))
		}
	}
	var in strings.Builder
	in.WriteString(fmtParams(p))
	writeInts(&in, log.Seen, int64(len(log.Entries)))
	for _, e := range log.Entries {
		writeInts(&in, e.At, e.N)
	}
	tr := &trace{}
	for range between(r, stepsLo, stepsHi) {
		n := genN(r, p.Capacity)
		before := logBefore(&log)
		expired, res := algo.LogStep(&p, &log, now, n)
		cost := int64(0)
		if res.Allowed {
			cost = n
		}
		log.Commit(expired, now, cost)
		writeInts(&in, now, n)
		now0 := now
		tr.step(ints(int64(expired))+" "+fmtResult(res)+" "+ints(log.Seen, log.Sum)+" "+fmtEntries(log.Entries), func() string {
			return fmt.Sprintf("params %+v log %s now %d n %d", p, before(), now0, n)
		})
		now = genNext(r, now, p.Period, p.Rate)
	}
	tr.in = in.String()
	return tr
}

// TestLog runs random traces of the sliding log through algo.LogStep and
// Log.Commit and through algo.log_step and log_commit.
func TestLog(t *testing.T) {
	t.Parallel()
	runRandom(t, newDriver(t), 10, "log", logTrace)
}

// TestSlideResult drives algo.slide_result with random counts and windows
// against algo.Step on a sliding window whose state holds those counts for
// the window of now (or, time having gone backwards, a later one), where
// Step evaluates exactly slide.result.
func TestSlideResult(t *testing.T) {
	t.Parallel()
	d := newDriver(t)
	r, _ := newRand(t, 11)
	var in, want []string
	type slideCase struct {
		p      algo.Params
		s      algo.State
		now, n int64
	}
	var cases []slideCase // described only on failure
	for len(in) < 20**tracesFlag {
		p := genParams(r, algo.SlidingWindow)
		p.Rate = max(p.Rate, 1)
		p.Offset = 0 // the states below are the epoch's windows
		per, c := p.Period, p.Capacity
		if per > maxI/8 {
			continue
		}
		now := genStart(r, per)
		ws := now - now%per
		e := now - ws
		if r.IntN(4) == 0 { // a later window: time went backwards
			ws, e = addSat(ws, per*between(r, 1, 3)), 0
		}
		// The state's idle-at time must not be cut at MaxInt64.
		if ws > maxI-1-2*per {
			continue
		}
		word := func() uint32 {
			if r.IntN(4) == 0 {
				return r.Uint32()
			}
			return uint32(between(r, 0, c+1))
		}
		prev, curr := word(), word()
		n := genN(r, c)
		s := algo.State{A: ws + 2*per, B: int64(uint64(prev)<<32 | uint64(curr))}
		_, res := algo.Step(&p, s, now, n)
		in = append(in, ints(per, c, now, n, int64(prev), int64(curr), ws, e))
		want = append(want, fmtResult(res))
		cases = append(cases, slideCase{p, s, now, n})
	}
	got := d.batches("slide", in, 5000)
	for i := range got {
		if got[i] != want[i] {
			c := cases[i]
			t.Fatalf("slide_result(%s): params %+v state %+v now %d n %d\n lua %s\n  go %s", in[i], c.p, c.s, c.now, c.n, got[i], want[i])
		}
	}
	t.Logf("%d cases", len(in))
}

// rotate mirrors the evaluation window of CMSketch.rotate for a sketch
// whose current window starts at start (nil: never used).
func rotate(per int64, start *int64, now int64) (ws, e int64, rel string) {
	now = min(now, maxI-1)
	ws = now - now%per
	switch {
	case start == nil:
		return ws, now - ws, "reset"
	case ws == *start:
		return ws, now - ws, "same"
	case ws < *start:
		return *start, 0, "back"
	case ws-*start == per:
		return ws, now - ws, "next"
	}
	return ws, now - ws, "reset"
}

// TestSketchWindow checks algo.sketch_window against rotate.
func TestSketchWindow(t *testing.T) {
	t.Parallel()
	d := newDriver(t)
	r, _ := newRand(t, 12)
	var in, want []string
	for range 10 * *tracesFlag {
		per := genParams(r, algo.Sketch).Period
		now := genStart(r, per)
		ws := min(now, maxI-1)
		ws -= ws % per
		var start *int64
		var st int64
		switch r.IntN(7) {
		case 0:
		case 1:
			st = ws
		case 2:
			st = subSat(ws, per)
		case 3:
			st = subSat(ws, min(per, maxI/4)*between(r, 2, 4))
		case 4:
			st = addSat(ws, min(per, maxI/3)*between(r, 1, 3))
		default:
			st = anyBits(r, 63)
		}
		if st != 0 || r.IntN(2) == 0 {
			start = &st
		}
		s := "-"
		if start != nil {
			s = strconv.FormatInt(*start, 10)
		}
		gws, ge, rel := rotate(per, start, now)
		in = append(in, ints(per)+" "+s+" "+ints(now))
		want = append(want, ints(gws, ge)+" "+rel)
	}
	got := d.batches("window", in, 5000)
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("sketch_window(%s):\n lua %s\n  go %s", in[i], got[i], want[i])
		}
	}
	t.Logf("%d cases", len(in))
}

// TestSketch runs one key through a CMSketch (Check, then Add when
// allowed) and through sketch_window and slide_result with the windows
// kept as the Redis store keeps them. With one key, every counter of the
// key holds its exact count. Now and then the limit's period changes.
func TestSketch(t *testing.T) {
	t.Parallel()
	runRandom(t, newDriver(t), 13, "sketch", sketchTrace)
}

// sketchTrace generates a trace of one key's Check and Add on a CMSketch.
func sketchTrace(r *rand.Rand) *trace {
	p := genParams(r, algo.Sketch)
	per2 := genParams(r, algo.Sketch).Period
	h := r.Uint64()
	width, depth := between(r, 1, 64), between(r, 1, 5)
	sk := algo.NewSketch(int(width), int(depth))
	cells := algo.SketchCells(h, int(width), int(depth), nil)
	now := genStart(r, p.Period)
	var in strings.Builder
	in.WriteString(ints(p.Rate, p.Capacity, p.Period, per2))
	tr := &trace{}
	for range between(r, stepsLo, stepsHi) {
		q := p
		which := 1
		if r.IntN(8) == 0 {
			q.Period, which = per2, 2
		}
		n := genN(r, p.Capacity)
		res := sk.Check(&q, h, now, n)
		if res.Allowed {
			sk.Add(h, now, n)
		}
		writeInts(&in, int64(which), now, n)
		now0 := now
		tr.step(fmtResult(res)+" "+sketchState(sk, cells), func() string { return fmt.Sprintf("params %+v now %d n %d", q, now0, n) })
		now = genNext(r, now, q.Period, q.Rate)
	}
	tr.in = in.String()
	return tr
}

// sketchState returns the sketch's period and window start and the
// estimates of the key with the given cells in the current and previous
// window, from the marshalled sketch.
func sketchState(sk *algo.CMSketch, cells []uint32) string {
	b, _ := sk.MarshalBinary() // never fails
	const header = len("sluice-cms-1\n") + 8
	u64 := func(i int) uint64 {
		var x uint64
		for k := 7; k >= 0; k-- {
			x = x<<8 | uint64(b[i+k])
		}
		return x
	}
	u32 := func(i int) uint32 { return uint32(b[i]) | uint32(b[i+1])<<8 | uint32(b[i+2])<<16 | uint32(b[i+3])<<24 }
	period, start := int64(u64(header)), int64(u64(header+8))
	size := sk.Width() * sk.Depth()
	est := func(w int) uint32 {
		m := uint32(math.MaxUint32)
		for _, c := range cells {
			m = min(m, u32(header+16+4*(w*size+int(c))))
		}
		return m
	}
	return ints(period, start, int64(est(0)), int64(est(1)))
}

// TestSketchCells checks that SketchCells names the counters CMSketch.Add
// raises.
func TestSketchCells(t *testing.T) {
	t.Parallel()
	r, _ := newRand(t, 14)
	for range 200 {
		width, depth := 1+r.IntN(300), 1+r.IntN(8)
		h := r.Uint64()
		sk := algo.NewSketch(width, depth)
		sk.Add(h, 0, 1)
		b, _ := sk.MarshalBinary()
		const header = len("sluice-cms-1\n") + 24
		want := map[uint32]bool{}
		for _, c := range algo.SketchCells(h, width, depth, nil) {
			if c/uint32(width) >= uint32(depth) {
				t.Fatalf("cell %d out of %dx%d", c, width, depth)
			}
			want[c] = true
		}
		for i := range width * depth {
			if set := b[header+4*i] != 0; set != want[uint32(i)] {
				t.Fatalf("width %d depth %d h %#x: counter %d set %v, SketchCells %v", width, depth, h, i, set, want[uint32(i)])
			}
		}
	}
}
