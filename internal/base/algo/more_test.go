package algo

import (
	"math"
	"testing"
	"time"
)

// AvailableAfter at fixed times: each limit is spent by requests of cost 1
// at the times given (seconds into a minute of the epoch), then read with
// a peek at the last of them.
func TestAvailableAfter(t *testing.T) {
	const min0 = 1_700_000_000 - 20 // a minute of the epoch
	sec := func(s float64) int64 { return min0*1e9 + int64(s*1e9) }
	for _, tc := range []struct {
		name string
		p    Params
		at   []float64 // request times, the last one is now
		want int64     // the cost asked for
		out  time.Duration
	}{
		// The window ends 39.75 s later.
		{"fixed", Params{Kind: FixedWindow, Rate: 3, Period: 60e9, Capacity: 3}, []float64{20.25, 20.25, 20.25}, 1, 39750 * time.Millisecond},
		{"fixed all", Params{Kind: FixedWindow, Rate: 3, Period: 60e9, Capacity: 3}, []float64{20.25, 20.25, 20.25}, 3, 39750 * time.Millisecond},
		// 5 in the window 51 s into it: 1 fits when they weigh 4, 12 s
		// into the next window.
		{"sliding", Params{Kind: SlidingWindow, Rate: 5, Period: 60e9, Capacity: 5}, []float64{51, 51, 51, 51, 51}, 1, 21 * time.Second},
		// 1 of 5 spent: the whole 5 only once it has left, at the end of
		// the next window.
		{"sliding one", Params{Kind: SlidingWindow, Rate: 5, Period: 60e9, Capacity: 5}, []float64{51}, 5, 69 * time.Second},
		// 5 in the previous window, 1 at 12 s: r does not tell the 5
		// apart from a current count, so the answer is for the worst
		// case, 12 s into the next window (more comes at 24 s, in this
		// one, as the 5 fade).
		{"sliding bound", Params{Kind: SlidingWindow, Rate: 5, Period: 60e9, Capacity: 5}, []float64{51, 51, 51, 51, 51, 72}, 1, 60 * time.Second},
		// The log empties a minute after its newest entry.
		{"log", Params{Kind: SlidingLog, Rate: 3, Period: 60e9, Capacity: 3}, []float64{10, 20, 30}, 1, 60 * time.Second},
		// 10 a minute, burst 3, empty at 20.25: a token every 6 s.
		{"gcra", Params{Kind: GCRA, Rate: 10, Period: 60e9, Capacity: 3}, []float64{20.25, 20.25, 20.25}, 1, 6 * time.Second},
		{"gcra 2", Params{Kind: GCRA, Rate: 10, Period: 60e9, Capacity: 3}, []float64{20.25, 20.25, 20.25}, 2, 12 * time.Second},
		{"token bucket", Params{Kind: TokenBucket, Rate: 10, Period: 60e9, Capacity: 3}, []float64{20.25, 20.25, 20.25}, 1, 6 * time.Second},
		{"leaky bucket", Params{Kind: LeakyBucket, Rate: 10, Period: 60e9, Capacity: 3}, []float64{20.25, 20.25, 20.25}, 3, 18 * time.Second},
		// 3 per second, burst 3: a token every 333333333⅓ ns, rounded up.
		{"gcra thirds", Params{Kind: GCRA, Rate: 3, Period: 1e9, Capacity: 3}, []float64{20, 20, 20}, 1, 333333334},
		// 2 tokens every 30 s into a bucket of 3, on the epoch's 30 s
		// steps: the next at 30 s, 9.75 s after 20.25.
		{"discrete", Params{Kind: TokenBucket, Rate: 4, Period: 60e9, Capacity: 3, Interval: 30e9}, []float64{20.25, 20.25, 20.25}, 1, 9750 * time.Millisecond},
		{"discrete 3", Params{Kind: TokenBucket, Rate: 4, Period: 60e9, Capacity: 3, Interval: 30e9}, []float64{20.25, 20.25, 20.25}, 3, 39750 * time.Millisecond},
		{"fits now", Params{Kind: GCRA, Rate: 10, Period: 60e9, Capacity: 3}, []float64{20.25}, 2, 0},
		{"above capacity", Params{Kind: GCRA, Rate: 10, Period: 60e9, Capacity: 3}, []float64{20.25}, 4, time.Duration(Never)},
		{"zero limit", Params{Kind: FixedWindow, Rate: 0, Period: 60e9, Capacity: 0}, nil, 1, time.Duration(Never)},
	} {
		var s State
		var log Log
		now := sec(0)
		for _, at := range tc.at {
			now = sec(at)
			var r Result
			if tc.p.Kind == SlidingLog {
				var exp int
				exp, r = LogStep(&tc.p, &log, now, 1)
				log.Commit(exp, now, 1)
			} else {
				s, r = Step(&tc.p, s, now, 1)
			}
			if !r.Allowed {
				t.Fatalf("%s: request at %v denied", tc.name, at)
			}
		}
		var r Result
		if tc.p.Kind == SlidingLog {
			_, r = LogStep(&tc.p, &log, now, 0)
		} else {
			_, r = Step(&tc.p, s, now, 0)
		}
		if got := time.Duration(AvailableAfter(&tc.p, r, tc.want)); got != tc.out {
			t.Errorf("%s: AvailableAfter(%s, %d) = %v, want %v", tc.name, fmtResult(r), tc.want, got, tc.out)
		}
	}
}

// FuzzAvailableAfter runs random traces through every algorithm and, after
// each request, asks a peek's AvailableAfter for a little more than the
// quota left. A request of that cost at that time is admitted; for the
// fixed window and the buckets one a moment earlier is not (1 ns of
// rounding aside for the smooth buckets, whose ResetAfter is rounded up;
// the discrete bucket only for the next token, its exact answer).
func FuzzAvailableAfter(f *testing.F) {
	seed(f)
	f.Fuzz(func(t *testing.T, rate uint16, period uint32, capacity uint16, data []byte) {
		for _, k := range Kinds() {
			p := fuzzParams(k, rate, period, capacity)
			if k == TokenBucket && rate&1 == 1 {
				a, m := 1+int64(rate%5), 1+int64(rate>>8%4)
				p.Interval = p.Period
				p.Rate, p.Period = a*m, p.Period*m
			}
			if p.Validate() != nil {
				continue
			}
			checkAvailableAfter(t, p, trace(data, max(p.Interval, p.Period), p.Capacity+1))
		}
	})
}

// nearEnd reports whether the state read at now by r, or the next window,
// or a bucket's tolerance beyond it, nears the end of int64 time, where
// windows are cut and buckets deny what they cannot store.
func nearEnd(p *Params, now int64, r Result) bool {
	end := addSat(addSat(addSat(now, r.ResetAfter), p.Period), p.Period)
	if p.Rate > 0 {
		end = addSat(end, mulDiv(p.Capacity+1, p.Period, p.Rate))
	}
	return end == math.MaxInt64
}

func checkAvailableAfter(t *testing.T, p Params, events []event) {
	var s State
	var log Log
	sk := NewSketch(16, 2)
	const h = 0x9e3779b97f4a7c15
	// ask peeks (n = 0) or requests of cost n at now, on copies of the
	// state, so that nothing is consumed.
	ask := func(now, n int64) Result {
		switch p.Kind {
		case SlidingLog:
			l := Log{Entries: append([]LogEntry(nil), log.Entries...), Sum: log.Sum, Seen: log.Seen}
			_, r := LogStep(&p, &l, now, n)
			return r
		case Sketch:
			b, err := sk.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			var c CMSketch
			if err := c.UnmarshalBinary(b); err != nil {
				t.Fatal(err)
			}
			return c.Check(&p, h, now, n)
		}
		_, r := Step(&p, s, now, n)
		return r
	}
	last := int64(-1)
	for _, ev := range events {
		var r Result
		switch p.Kind {
		case SlidingLog:
			var exp int
			exp, r = LogStep(&p, &log, ev.at, ev.n)
			if r.Allowed {
				log.Commit(exp, ev.at, ev.n)
			}
		case Sketch:
			r = sk.Check(&p, h, ev.at, ev.n)
			if r.Allowed && ev.n > 0 {
				sk.Add(h, ev.at, ev.n)
			}
		default:
			var next State
			next, r = Step(&p, s, ev.at, ev.n)
			if r.Allowed {
				s = next
			}
		}
		if ev.at < last {
			continue // time went backwards: durations are read from the later time
		}
		last = ev.at
		peek := ask(ev.at, 0)
		for want := peek.Remaining + 1; want <= peek.Remaining+3; want++ {
			d := AvailableAfter(&p, peek, want)
			if d != Never && d >= math.MaxInt64-1-ev.at || nearEnd(&p, ev.at, peek) {
				continue
			}
			if d == Never {
				if want <= p.Capacity && p.Rate > 0 {
					t.Fatalf("%+v: %s at %d: want %d never fits", p, fmtResult(peek), ev.at, want)
				}
				continue
			}
			if d <= 0 {
				t.Fatalf("%+v: %s at %d: want %d after %d", p, fmtResult(peek), ev.at, want, d)
			}
			if r := ask(ev.at+d, want); !r.Allowed {
				t.Fatalf("%+v: %s at %d: want %d after %d, still denied: %s", p, fmtResult(peek), ev.at, want, d, fmtResult(r))
			}
			slack := int64(0)
			switch {
			case p.Kind == FixedWindow, p.Interval > 0 && want == peek.Remaining+1:
				slack = 1
			case p.Kind == GCRA, p.Kind == LeakyBucket, p.Kind == TokenBucket && p.Interval == 0:
				slack = 2
			}
			if slack > 0 && d >= slack {
				if r := ask(ev.at+d-slack, want); r.Allowed {
					t.Fatalf("%+v: %s at %d: want %d after %d, but it fits %d ns earlier", p, fmtResult(peek), ev.at, want, d, slack)
				}
			}
		}
	}
}
