package algo

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// base is 2017-07-12 10:00:00 UTC, a whole hour since the epoch.
var base = time.Date(2017, 7, 12, 10, 0, 0, 0, time.UTC).UnixNano()

const (
	ms     = int64(time.Millisecond)
	sec    = int64(time.Second)
	minute = int64(time.Minute)
	hour   = int64(time.Hour)
	day    = 24 * hour
	year   = 365 * day
)

// req is one request of a table test and what Step must answer. at is
// relative to the test's start. A want field of -1 is not checked.
type req struct {
	at    int64
	n     int64
	ok    bool
	rem   int64
	reset int64
	retry int64
}

type stepTest struct {
	name  string
	p     Params
	start int64 // base when zero
	reqs  []req
}

func runStepTests(t *testing.T, tests []stepTest) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.p.Kind.String()+"/"+tt.name, func(t *testing.T) {
			if err := tt.p.Validate(); err != nil {
				t.Fatalf("invalid params: %v", err)
			}
			start := tt.start
			if start == 0 {
				start = base
			}
			var s State
			for i, r := range tt.reqs {
				next, got := Step(&tt.p, s, start+r.at, r.n)
				check(t, i, r, got)
				if !got.Allowed || r.n == 0 {
					if next != s {
						t.Errorf("#%d: state changed without consuming: %+v -> %+v", i, s, next)
					}
					continue
				}
				s = next
			}
		})
	}
}

func check(t *testing.T, i int, r req, got Result) {
	t.Helper()
	if got.Allowed != r.ok ||
		(r.rem >= 0 && got.Remaining != r.rem) ||
		(r.reset >= 0 && got.ResetAfter != r.reset) ||
		(r.retry >= 0 && got.RetryAfter != r.retry) {
		t.Errorf("#%d at %v n=%d: got %s, want %s", i, time.Duration(r.at), r.n, fmtResult(got),
			fmtResult(Result{Allowed: r.ok, Remaining: r.rem, ResetAfter: r.reset, RetryAfter: r.retry}))
	}
}

func fmtResult(r Result) string {
	d := func(x int64) string {
		switch x {
		case Never:
			return "never"
		case -1:
			return "any"
		}
		return time.Duration(x).String()
	}
	ok := "deny"
	if r.Allowed {
		ok = "allow"
	}
	return ok + " remaining=" + itoa(r.Remaining) + " reset=" + d(r.ResetAfter) + " retry=" + d(r.RetryAfter)
}

func itoa(x int64) string {
	if x == -1 {
		return "any"
	}
	return time.Duration(x).String()[:0] + fmtInt(x)
}

func fmtInt(x int64) string {
	if x == 0 {
		return "0"
	}
	neg := x < 0
	var b [24]byte
	i := len(b)
	for x != 0 {
		d := x % 10
		if d < 0 {
			d = -d
		}
		i--
		b[i] = byte('0' + d)
		x /= 10
	}
	if neg {
		i--
		b[i] = '-'
	}
	return string(b[i:])
}

func TestFixedWindow(t *testing.T) {
	perMin := Params{Kind: FixedWindow, Rate: 3, Period: minute, Capacity: 3}
	runStepTests(t, []stepTest{
		{name: "3 per minute", p: perMin, reqs: []req{
			{0, 1, true, 2, 60 * sec, 0},
			{10 * sec, 1, true, 1, 50 * sec, 0},
			{35 * sec, 1, true, 0, 25 * sec, 0},
			{45 * sec, 1, false, 0, 15 * sec, 15 * sec},
			{60 * sec, 1, true, 2, 60 * sec, 0},
			{60 * sec, 2, true, 0, 60 * sec, 0},
		}},
		{name: "peek", p: perMin, reqs: []req{
			{0, 0, true, 3, 60 * sec, 0},
			{1 * sec, 2, true, 1, 59 * sec, 0},
			{2 * sec, 0, true, 1, 58 * sec, 0},
			{3 * sec, 2, false, 1, 57 * sec, 57 * sec},
			{4 * sec, 0, true, 1, 56 * sec, 0},
		}},
		{name: "cost above capacity", p: perMin, reqs: []req{
			{0, 4, false, 3, 60 * sec, Never},
			{0, 3, true, 0, 60 * sec, 0},
		}},
		{name: "time going backwards counts in the later window", p: perMin, reqs: []req{
			{60 * sec, 2, true, 1, 60 * sec, 0},
			// 10:00:59 is in the window before the state's: counted in
			// 10:01, so the 10:00 window's quota is not handed out again.
			{59 * sec, 1, true, 0, 61 * sec, 0},
			{30 * sec, 1, false, 0, 90 * sec, 90 * sec},
			{120 * sec, 3, true, 0, 60 * sec, 0},
		}},
		{name: "rate 0 blocks", p: Params{Kind: FixedWindow, Rate: 0, Period: minute, Capacity: 5}, reqs: []req{
			{0, 1, false, 0, 60 * sec, Never},
			{0, 0, true, 0, 60 * sec, 0},
		}},
		{name: "capacity 0 blocks", p: Params{Kind: FixedWindow, Rate: 5, Period: minute}, reqs: []req{
			{0, 1, false, 0, 60 * sec, Never},
			{0, 0, true, 0, 60 * sec, 0},
		}},
		{name: "1 per day", p: Params{Kind: FixedWindow, Rate: 1, Period: day, Capacity: 1}, reqs: []req{
			{0, 1, true, 0, 14 * hour, 0},
			{13 * hour, 1, false, 0, hour, hour},
			{14 * hour, 1, true, 0, day, 0},
		}},
		{name: "1 per 90s", p: Params{Kind: FixedWindow, Rate: 1, Period: 90 * sec, Capacity: 1}, reqs: []req{
			// base, 1499853600 s since the epoch, starts a 90 s window.
			{0, 1, true, 0, 90 * sec, 0},
			{59 * sec, 1, false, 0, 31 * sec, 31 * sec},
			{90 * sec, 1, true, 0, 90 * sec, 0},
		}},
	})
}

func TestTokenBucketDiscrete(t *testing.T) {
	runStepTests(t, []stepTest{
		// The classic worked example: 3 per minute, 3 tokens added at
		// every whole minute.
		{name: "3 per minute", p: Params{Kind: TokenBucket, Rate: 3, Period: minute, Capacity: 3, Interval: minute}, reqs: []req{
			{0, 1, true, 2, 60 * sec, 0},
			{10 * sec, 1, true, 1, 50 * sec, 0},
			{35 * sec, 1, true, 0, 25 * sec, 0},
			{45 * sec, 1, false, 0, 15 * sec, 15 * sec},
			{60 * sec, 1, true, 2, 60 * sec, 0},
			// Time going backwards: at 10:00:50 the bucket is read at the
			// 10:00 tick, before the refill it already had.
			{50 * sec, 1, false, 0, 70 * sec, 10 * sec},
			{61 * sec, 0, true, 2, 59 * sec, 0},
			{61 * sec, 4, false, 2, 59 * sec, Never},
			{61 * sec, 3, false, 2, 59 * sec, 59 * sec},
		}},
		// 10 failed logins per hour, refilled 1 per hour.
		{name: "logins", p: Params{Kind: TokenBucket, Rate: 1, Period: hour, Capacity: 10, Interval: hour}, start: base + 30*minute, reqs: []req{
			{0, 1, true, 9, 30 * minute, 0},
			{1, 8, true, 1, 30*minute + 8*hour - 1, 0},
			{2, 1, true, 0, 30*minute + 9*hour - 2, 0},
			{3, 1, false, 0, 30*minute + 9*hour - 3, 30*minute - 3},
			{30 * minute, 1, true, 0, 10 * hour, 0},
			{30*minute + 1, 1, false, 0, 10*hour - 1, hour - 1},
			{10*hour + 30*minute, 0, true, 10, 0, 0},
			{10*hour + 30*minute, 10, true, 0, 10 * hour, 0},
		}},
		{name: "2 every 30s, 1 per 90s", p: Params{Kind: TokenBucket, Rate: 6, Period: 90 * sec, Capacity: 1, Interval: 30 * sec}, reqs: []req{
			{0, 1, true, 0, 30 * sec, 0},
			{29 * sec, 1, false, 0, 1 * sec, 1 * sec},
			{30 * sec, 1, true, 0, 30 * sec, 0},
			{30 * sec, 2, false, 0, 30 * sec, Never},
		}},
	})
}

func TestTokenBucketSmooth(t *testing.T) {
	third := sec / 3 // 333333333ns; a third of a second rounds up to 333333334
	runStepTests(t, []stepTest{
		{name: "burst of 3 at 3 per second", p: Params{Kind: TokenBucket, Rate: 3, Period: sec, Capacity: 3}, reqs: []req{
			{0, 1, true, 2, third + 1, 0},
			{0, 1, true, 1, 2*third + 1, 0},
			{0, 1, true, 0, sec, 0},
			{0, 1, false, 0, sec, third + 1},
			{third, 1, false, 0, sec - third, 1},
			// TAT' = 1⅓ s, 999999999⅓ ns ahead, rounded up.
			{third + 1, 1, true, 0, sec, 0},
			{2 * sec, 3, true, 0, sec, 0},
		}},
		{name: "1 per 90s, burst 2", p: Params{Kind: TokenBucket, Rate: 1, Period: 90 * sec, Capacity: 2}, reqs: []req{
			{0, 2, true, 0, 180 * sec, 0},
			{45 * sec, 1, false, 0, 135 * sec, 45 * sec},
			{90 * sec, 1, true, 0, 180 * sec, 0},
			// time going backwards: the bucket looks fuller
			{0, 0, true, 0, 270 * sec, 0},
			{0, 1, false, 0, 270 * sec, 180 * sec},
		}},
		{name: "rate 0 blocks", p: Params{Kind: TokenBucket, Rate: 0, Period: sec, Capacity: 3}, reqs: []req{
			{0, 1, false, 0, 0, Never},
			{0, 0, true, 0, 0, 0},
		}},
		{name: "capacity 0 blocks", p: Params{Kind: TokenBucket, Rate: 3, Period: sec}, reqs: []req{
			{0, 1, false, 0, 0, Never},
			{0, 0, true, 0, 0, 0},
		}},
	})
}

func TestGCRA(t *testing.T) {
	runStepTests(t, []stepTest{
		{name: "1 per 90s", p: Params{Kind: GCRA, Rate: 1, Period: 90 * sec, Capacity: 1}, reqs: []req{
			{0, 1, true, 0, 90 * sec, 0},
			{45 * sec, 1, false, 0, 45 * sec, 45 * sec},
			{90 * sec, 1, true, 0, 90 * sec, 0},
			// time going backwards: the state is not rolled back
			{-30 * sec, 1, false, 0, 210 * sec, 210 * sec},
			{180 * sec, 1, true, 0, 90 * sec, 0},
		}},
		{name: "1 per day", p: Params{Kind: GCRA, Rate: 1, Period: day, Capacity: 1}, reqs: []req{
			{0, 0, true, 1, 0, 0},
			{0, 1, true, 0, day, 0},
			{23 * hour, 1, false, 0, hour, hour},
			{day, 1, true, 0, day, 0},
			{day, 2, false, 0, day, Never},
		}},
		{name: "10 per second, burst 5", p: Params{Kind: GCRA, Rate: 10, Period: sec, Capacity: 5}, reqs: []req{
			{0, 5, true, 0, 500 * ms, 0},
			{0, 1, false, 0, 500 * ms, 100 * ms},
			{250 * ms, 0, true, 2, 250 * ms, 0},
			{250 * ms, 3, false, 2, 250 * ms, 50 * ms},
			{300 * ms, 3, true, 0, 500 * ms, 0},
		}},
	})
}

func TestLeakyBucket(t *testing.T) {
	runStepTests(t, []stepTest{
		{name: "leaks 2 per second into 4", p: Params{Kind: LeakyBucket, Rate: 2, Period: sec, Capacity: 4}, reqs: []req{
			{0, 3, true, 1, 1500 * ms, 0},
			{0, 2, false, 1, 1500 * ms, 500 * ms},
			{500 * ms, 2, true, 0, 2 * sec, 0},
			{3 * sec, 0, true, 4, 0, 0},
			{3 * sec, 5, false, 4, 0, Never},
		}},
	})
}

func TestSlidingWindow(t *testing.T) {
	perMin := Params{Kind: SlidingWindow, Rate: 3, Period: minute, Capacity: 3}
	runStepTests(t, []stepTest{
		{name: "3 per minute", p: perMin, reqs: []req{
			{0, 1, true, 2, 60 * sec, 0},
			{10 * sec, 1, true, 1, 50 * sec, 0},
			{35 * sec, 1, true, 0, 25 * sec, 0},
			// 3·(60−e)/60 + 1 <= 3 needs e >= 20s in the next window.
			{45 * sec, 1, false, 0, 15 * sec, 35 * sec},
			{60 * sec, 1, false, 0, 60 * sec, 20 * sec},
			{79 * sec, 1, false, 0, 41 * sec, 1 * sec},
			// 3·40/60 = 2, + 1 = 3: fits exactly.
			{80 * sec, 1, true, 0, 40 * sec, 0},
			// 3·(60−e)/60 + 2 <= 3 needs e >= 40s.
			{90 * sec, 0, true, 0, 30 * sec, 0},
			{100 * sec, 1, true, 0, 20 * sec, 0},
			// Time going backwards into the previous window is counted in
			// the state's window, at its start: 3 + 2 + 1 > 3. It fits at
			// 2:00, when prev = 2 and curr = 0.
			{30 * sec, 1, false, 0, 90 * sec, 90 * sec},
			{180 * sec, 3, true, 0, 60 * sec, 0},
			{240 * sec, 3, false, 0, 60 * sec, 60 * sec},
			{240 * sec, 4, false, 0, 60 * sec, Never},
			{300 * sec, 3, true, 0, 60 * sec, 0},
		}},
		{name: "rate 0 blocks", p: Params{Kind: SlidingWindow, Rate: 0, Period: minute, Capacity: 3}, reqs: []req{
			{0, 1, false, 0, 60 * sec, Never},
			{0, 0, true, 0, 60 * sec, 0},
		}},
		{name: "1 per day", p: Params{Kind: SlidingWindow, Rate: 1, Period: day, Capacity: 1}, reqs: []req{
			{0, 1, true, 0, 14 * hour, 0},
			// next day: 1·(24h − e)/24h + 1 <= 1 only when e = 24h
			{13 * hour, 1, false, 0, hour, hour + day},
			{14 * hour, 1, false, 0, day, day},
			{14*hour + day, 1, true, 0, day, 0},
		}},
	})
}

// TestExtremes runs every algorithm at very large rates, capacities and
// periods, and at times near the end of int64, checking the arithmetic
// neither overflows nor panics and that answers stay within bounds.
func TestExtremes(t *testing.T) {
	const big = 1 << 40
	times := []int64{0, 1 << 62, math.MaxInt64 - 100*year, math.MaxInt64 - 1, math.MaxInt64, -5}
	costs := []int64{0, 1, 2, big - 1, big, big + 1, math.MaxInt64, -1}
	var params []Params
	for _, k := range []Kind{FixedWindow, TokenBucket, LeakyBucket, GCRA, SlidingWindow} {
		for _, per := range []int64{1, sec, 100 * year, math.MaxInt64} {
			for _, rate := range []int64{0, 1, 3, big, math.MaxInt64} {
				for _, c := range []int64{0, 1, big, math.MaxInt64} {
					p := Params{Kind: k, Rate: rate, Period: per, Capacity: c}
					if p.Validate() == nil {
						params = append(params, p)
					}
				}
			}
		}
	}
	params = append(params,
		Params{Kind: TokenBucket, Rate: 1 << 20, Period: 100 * year, Capacity: big, Interval: 100 * year >> 18},
		Params{Kind: TokenBucket, Rate: 1 << 61, Period: 1, Capacity: math.MaxInt64, Interval: 3}, // the most tokens a step may add, nearly
		Params{Kind: TokenBucket, Rate: 1, Period: 1, Capacity: 1, Interval: math.MaxInt64},
	)
	for _, p := range params {
		if err := p.Validate(); err != nil {
			t.Fatalf("%+v: %v", p, err)
		}
		for _, start := range times {
			var s State
			for _, n := range costs {
				for _, dt := range []int64{0, 1, -1, p.Period, -p.Period} {
					now := addSat(start, dt)
					next, r := Step(&p, s, now, n)
					checkBounds(t, &p, s, next, now, n, r)
					if r.Allowed {
						s = next
					}
				}
			}
		}
	}
}

// checkBounds checks what holds for every result, whatever the input.
func checkBounds(t *testing.T, p *Params, s, next State, now, n int64, r Result) {
	t.Helper()
	bad := func(why string) {
		t.Helper()
		t.Fatalf("%s: %+v state %+v now %d n %d -> %+v %s", why, *p, s, now, n, next, fmtResult(r))
	}
	if r.Remaining < 0 || r.Remaining > p.Capacity || r.ResetAfter < 0 || r.RetryAfter < 0 {
		bad("out of range")
	}
	if r.Allowed != (r.RetryAfter == 0) {
		bad("RetryAfter must be 0 exactly when allowed")
	}
	if n <= 0 && !r.Allowed {
		bad("peek denied")
	}
	if n > p.Capacity && r.Allowed {
		bad("cost above capacity allowed")
	}
	if (p.Rate == 0 || n > p.Capacity) && n > 0 && r.RetryAfter != Never {
		bad("want Never")
	}
	if !p.Kind.HasState() {
		return
	}
	if !r.Allowed || n <= 0 {
		if next != s {
			bad("state changed")
		}
		return
	}
	if next.A <= clampNow(now) {
		bad("admitted but idle at once")
	}
}

// TestLarge runs rates and capacities of 2^40 over a period of 100 years at
// a time near 2^62 (the year 2116).
func TestLarge(t *testing.T) {
	const (
		big   = 1 << 40
		per   = 100 * year
		start = 1 << 62
		end   = 2 * per // the window [per, 2·per) holds start
		left  = end - start
		tick  = 2868183 // 100 years / 2^40, rounded up
	)
	runStepTests(t, []stepTest{
		{name: "large", start: start, p: Params{Kind: GCRA, Rate: big, Period: per, Capacity: big}, reqs: []req{
			{0, big, true, 0, per, 0},
			{0, 1, false, 0, per, tick},
			{tick, 1, true, 0, per, 0},
			{per, 0, true, big - 1, tick, 0},
			// TAT' would pass math.MaxInt64 (the year 2262): denied.
			{per, big - 1, false, big - 1, tick, Never},
		}},
		{name: "large", start: start, p: Params{Kind: TokenBucket, Rate: big, Period: per, Capacity: big}, reqs: []req{
			{0, big - 1, true, 1, per - tick + 1, 0},
			{0, 2, false, 1, per - tick + 1, tick},
		}},
		{name: "large discrete", start: start, p: Params{Kind: TokenBucket, Rate: 1 << 20, Period: per, Capacity: big, Interval: per >> 18}, reqs: []req{
			// 4 tokens every 3h20m30s: refilling 2^40 would take until
			// long after math.MaxInt64, so that request is never allowed.
			{0, 5, true, big - 5, -1, 0},
			{0, big - 5, false, big - 5, -1, Never},
			{per, 0, true, big, 0, 0},
		}},
		{name: "large", start: start, p: Params{Kind: LeakyBucket, Rate: big, Period: per, Capacity: big}, reqs: []req{
			{0, big, true, 0, per, 0},
			{per / 2, 1000, true, big/2 - 1000, per/2 + 2868182492, 0},
			{per / 2, big / 2, false, big/2 - 1000, per/2 + 2868182492, Never},
		}},
		{name: "large", start: start, p: Params{Kind: FixedWindow, Rate: big, Period: per, Capacity: big}, reqs: []req{
			{0, big, true, 0, left, 0},
			{0, 1, false, 0, left, left},
			{left, big, true, 0, math.MaxInt64 - end, 0}, // the last window ends at math.MaxInt64
		}},
		{name: "large", start: start, p: Params{Kind: SlidingWindow, Rate: big, Period: per, Capacity: MaxSlidingWindowCapacity}, reqs: []req{
			{0, MaxSlidingWindowCapacity, true, 0, left, 0},
			{0, 1, false, 0, left, -1},
			// The idle-at time of this window and the next is cut at
			// math.MaxInt64: the next window keeps counting this one's
			// hits as its own (over-counting, never under-counting).
			{left, 1, false, 0, math.MaxInt64 - end, Never},
		}},
		{name: "near the end of time", start: math.MaxInt64 - hour, p: Params{Kind: GCRA, Rate: 1, Period: day, Capacity: 5}, reqs: []req{
			// TAT would pass math.MaxInt64: denied, forever.
			{0, 1, false, 5, 0, Never},
			{0, 0, true, 5, 0, 0},
		}},
		{name: "near the end of time", start: math.MaxInt64 - hour, p: Params{Kind: FixedWindow, Rate: 1, Period: day, Capacity: 1}, reqs: []req{
			{0, 1, true, 0, hour, 0},
			{hour, 1, false, 0, 1, 1}, // now is at most math.MaxInt64-1
		}},
	})
}

// A fixed window with an offset counts in [Offset + k·Period, Offset +
// (k+1)·Period), after a first window [0, Offset).
func TestFixedWindowOffset(t *testing.T) {
	const s = int64(1e9)
	p := Params{Kind: FixedWindow, Rate: 3, Period: 10 * s, Capacity: 3, Offset: 4 * s}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	var st State
	steps := []struct {
		now     int64
		allowed bool
		reset   int64
	}{
		{1 * s, true, 3 * s}, // [0, 4s)
		{3 * s, true, 1 * s},
		{4 * s, true, 10 * s}, // [4s, 14s): a new window
		{12 * s, true, 2 * s},
		{13 * s, true, 1 * s},
		{13*s + s/2, false, s / 2},
		{14 * s, true, 10 * s}, // [14s, 24s)
	}
	for i, c := range steps {
		var r Result
		st, r = Step(&p, st, c.now, 1)
		if r.Allowed != c.allowed || r.ResetAfter != c.reset {
			t.Errorf("step %d at %v: allowed %v reset %v, want %v %v", i, c.now, r.Allowed, r.ResetAfter, c.allowed, c.reset)
		}
		if !r.Allowed && r.RetryAfter != c.reset {
			t.Errorf("step %d: retry %v, want the window's end in %v", i, r.RetryAfter, c.reset)
		}
	}
	for _, bad := range []Params{
		{Kind: FixedWindow, Rate: 1, Period: 10, Capacity: 1, Offset: 10},
		{Kind: FixedWindow, Rate: 1, Period: 10, Capacity: 1, Offset: -1},
		{Kind: GCRA, Rate: 1, Period: 10, Capacity: 1, Offset: 1},
	} {
		if bad.Validate() == nil {
			t.Errorf("%+v: valid, want an error", bad)
		}
	}
}

// A sliding window offset from the epoch decides as the epoch's does, time
// shifted by the offset: the same answers, on random traces that never go
// back in time (an offset window counts a request from the past in now's
// window, where the epoch's moves to the state's).
func TestSlidingWindowOffsetIsShifted(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 4))
	for trace := range 2000 {
		per := []int64{10, 1000, 60e9, 86400e9, 2419200e9}[rnd.IntN(5)]
		c := 1 + rnd.Int64N(20)
		off := rnd.Int64N(per)
		base := Params{Kind: SlidingWindow, Rate: c, Period: per, Capacity: c}
		shifted := base
		shifted.Offset = off
		var s0, s1 State
		now := per * (1 + rnd.Int64N(1000))
		for step := range 40 {
			now += []int64{0, 1, per / 7, per / 2, per, 2 * per, rnd.Int64N(3 * per)}[rnd.IntN(7)]
			n := rnd.Int64N(c + 2)
			var r0, r1 Result
			s0, r0 = Step(&base, s0, now, n)
			s1, r1 = Step(&shifted, s1, now+off, n)
			if r0 != r1 {
				t.Fatalf("trace %d step %d (period %d, offset %d, n %d at %d): epoch %+v, offset %+v", trace, step, per, off, n, now, r0, r1)
			}
		}
	}
}
