package algo

import (
	"math"
	"math/big"
	"slices"
	"testing"
)

// The fuzz tests run random traces of (time step, cost) through an algorithm
// and its naive reference (ref_test.go) and compare every Result. The seed
// corpora make `go test` run them as regular tests.

// event is one request of a trace.
type event struct{ at, n int64 }

// scales multiplies the fuzzed period, so that traces cover nanosecond to
// multi-day periods.
var scales = [...]int64{1, 7, 1000, 1e6, 1e9, 3600e9}

// fuzzParams turns fuzz arguments into valid Params of kind k, with
// capacities small enough for the per-hit references.
func fuzzParams(k Kind, rate uint16, period uint32, capacity uint16) Params {
	per := (1 + int64(period>>3)%(1<<22)) * scales[int(period&7)%len(scales)]
	return Params{Kind: k, Rate: int64(rate % 1000), Period: per, Capacity: int64(capacity % 200)}
}

// trace decodes data into requests starting in 2023, three bytes each: a
// time step (mostly forward, sometimes backward, in 256ths of unit) and a
// cost (up to maxN). It stops before 1970 and after the year 2096.
func trace(data []byte, unit, maxN int64) []event {
	now := addSat(1.7e18, mulDiv(int64(len(data)%97), unit, 3))
	var out []event
	for len(data) >= 3 {
		v := int64(data[0])<<8 | int64(data[1])
		step := mulDiv(v>>2, unit, 256) // up to 64 units
		if v&3 == 3 {
			step = -mulDiv(v>>2%1024, unit, 256) // back up to 4 units
		}
		now = addSat(now, step)
		if now < 0 || now > 4e18 {
			break
		}
		out = append(out, event{now, int64(data[2]) % (maxN + 1)})
		data = data[3:]
	}
	return out
}

func seed(f *testing.F) {
	f.Add(uint16(3), uint32(60<<3|4), uint16(3), []byte{0, 0, 1, 10, 0, 1, 35, 0, 1, 45, 0, 1, 60, 0, 1})
	f.Add(uint16(1), uint32(90<<3|4), uint16(1), []byte{0, 0, 1, 1, 0, 1, 255, 255, 1, 0, 7, 2, 3, 3, 1})
	f.Add(uint16(3), uint32(1<<3|4), uint16(3), []byte{0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 1, 0, 1, 0, 3, 1})
	f.Add(uint16(0), uint32(5<<3), uint16(5), []byte{0, 0, 1, 0, 0, 0})
	f.Add(uint16(7), uint32(999<<3|1), uint16(0), []byte{0, 0, 1, 0, 0, 0})
	f.Add(uint16(997), uint32(12345<<3|2), uint16(199), []byte{9, 9, 199, 1, 2, 50, 3, 255, 100, 0, 40, 120, 0, 41, 3})
	f.Add(uint16(2), uint32(24<<3|5), uint16(10), []byte{0, 0, 9, 0, 7, 1, 0, 8, 3, 1, 3, 1, 2, 0, 11, 0, 255, 10})
}

// fuzzStep compares Step with a reference on one trace, and checks the
// backwards-time property after every committed step.
func fuzzStep(t *testing.T, p Params, events []event, ref func(now, n int64) Result) {
	if err := p.Validate(); err != nil {
		t.Skip(err)
	}
	var s State
	var last int64 = -1 // time of the last committed step
	for i, ev := range events {
		next, got := Step(&p, s, ev.at, ev.n)
		want := ref(ev.at, ev.n)
		if got != want {
			t.Fatalf("%+v\n#%d at %d n=%d from %+v:\n got %s\nwant %s", p, i, ev.at, ev.n, s, fmtResult(got), fmtResult(want))
		}
		checkBounds(t, &p, s, next, ev.at, ev.n, got)
		if !got.Allowed || ev.n == 0 {
			continue
		}
		if last >= 0 {
			checkBackwards(t, &p, s, last, ev.at, ev.n)
		}
		s, last = next, max(last, ev.at)
	}
}

// checkBackwards checks that a request whose time is before the last
// committed one (time went backwards) is never admitted where the same
// request at the later time would be denied, and leaves the same state.
func checkBackwards(t *testing.T, p *Params, s State, later, now, n int64) {
	t.Helper()
	for _, early := range []int64{now - 1, now - p.Period, now - 3*p.Period, later - 1} {
		if early >= later || early < 0 {
			continue
		}
		s1, r1 := Step(p, s, early, n)
		s2, r2 := Step(p, s, later, n)
		if r1.Allowed && (!r2.Allowed || s1 != s2) {
			t.Fatalf("%+v from %+v: n=%d at %d (backwards) -> %+v %s; at %d -> %+v %s",
				*p, s, n, early, s1, fmtResult(r1), later, s2, fmtResult(r2))
		}
	}
}

func FuzzGCRA(f *testing.F) {
	seed(f)
	f.Fuzz(func(t *testing.T, rate uint16, period uint32, capacity uint16, data []byte) {
		for _, k := range []Kind{GCRA, TokenBucket, LeakyBucket} {
			p := fuzzParams(k, rate, period, capacity)
			var ref refGCRA
			fuzzStep(t, p, trace(data, p.Period, p.Capacity+1), func(now, n int64) Result { return ref.step(&p, now, n) })
		}
	})
}

func FuzzTokenBucketDiscrete(f *testing.F) {
	seed(f)
	f.Fuzz(func(t *testing.T, rate uint16, period uint32, capacity uint16, data []byte) {
		// a tokens every interval: Rate = a·m per Period = interval·m.
		p := fuzzParams(TokenBucket, rate, period, capacity)
		a, m := 1+int64(rate%5), 1+int64(rate>>8%4)
		p.Interval = p.Period
		p.Rate, p.Period = a*m, p.Period*m
		var ref refDiscrete
		fuzzStep(t, p, trace(data, p.Interval, p.Capacity+1), func(now, n int64) Result { return ref.step(&p, now, n) })
	})
}

func FuzzFixedWindow(f *testing.F) {
	seed(f)
	f.Fuzz(func(t *testing.T, rate uint16, period uint32, capacity uint16, data []byte) {
		p := fuzzParams(FixedWindow, rate, period, capacity)
		ref := newRefWindows()
		fuzzStep(t, p, trace(data, p.Period, p.Capacity+1), func(now, n int64) Result { return ref.fixed(&p, now, n) })
	})
}

func FuzzSlidingWindow(f *testing.F) {
	seed(f)
	f.Fuzz(func(t *testing.T, rate uint16, period uint32, capacity uint16, data []byte) {
		p := fuzzParams(SlidingWindow, rate, period, capacity)
		ref := newRefWindows()
		fuzzStep(t, p, trace(data, p.Period, p.Capacity+1), func(now, n int64) Result { return ref.sliding(&p, now, n) })
	})
}

func FuzzSlidingLog(f *testing.F) {
	seed(f)
	f.Fuzz(func(t *testing.T, rate uint16, period uint32, capacity uint16, data []byte) {
		p := fuzzParams(SlidingLog, rate, period, capacity)
		var ref refLog
		var log Log
		for i, ev := range trace(data, p.Period, p.Capacity+1) {
			expired, got := LogStep(&p, &log, ev.at, ev.n)
			want := ref.step(&p, ev.at, ev.n)
			if got != want {
				t.Fatalf("%+v\n#%d at %d n=%d on %+v:\n got %s\nwant %s", p, i, ev.at, ev.n, log, fmtResult(got), fmtResult(want))
			}
			n := int64(0)
			if got.Allowed {
				n = ev.n
			}
			log.Commit(expired, ev.at, n)
			if !slices.Equal(expand(log.Entries), ref.hits) || log.Seen != ref.seen {
				t.Fatalf("#%d: log %+v, want hits %v seen %d", i, log, ref.hits, ref.seen)
			}
			var sum int64
			for j, e := range log.Entries {
				sum += e.N
				if j > 0 && e.At <= log.Entries[j-1].At {
					t.Fatalf("#%d: log out of order: %v", i, log.Entries)
				}
			}
			if sum != log.Sum {
				t.Fatalf("#%d: Sum %d, entries hold %d", i, log.Sum, sum)
			}
		}
	})
}

// FuzzSketch checks that the sketch never admits a request that the exact
// sliding window counter, given the requests the sketch admitted, would
// deny; and that with a single key it decides exactly like it.
func FuzzSketch(f *testing.F) {
	seed(f)
	f.Fuzz(func(t *testing.T, rate uint16, period uint32, capacity uint16, data []byte) {
		p := fuzzParams(Sketch, rate, period, capacity)
		keys := 1 + int(capacity>>8%8)
		sk := NewSketch(1+int(rate>>10), 1+int(period>>30))
		exact := map[[2]int64]int64{} // (key, window start) -> hits admitted
		latest := int64(-1)           // the sketch's current window
		for i, ev := range trace(data, p.Period, p.Capacity+1) {
			key := int64(i % keys)
			if len(data) > i {
				key = int64(data[i]) % int64(keys)
			}
			h := mix64(uint64(key) * 0x9e3779b97f4a7c15)
			got := sk.Check(&p, h, ev.at, ev.n)

			ws, e := alignDown(ev.at, p.Period), ev.at%p.Period
			if ws < latest {
				ws, e = latest, 0
			}
			latest = ws
			w := slide{prev: uint64(exact[[2]int64{key, ws - p.Period}]), curr: uint64(exact[[2]int64{key, ws}]), ws: ws, e: e}
			limit := new(big.Int).Mul(big.NewInt(p.Capacity), big.NewInt(p.Period))
			est := new(big.Int).Mul(big.NewInt(int64(w.prev)), big.NewInt(p.Period-e))
			est.Add(est, new(big.Int).Mul(big.NewInt(int64(w.curr)+ev.n), big.NewInt(p.Period)))
			exactOK := p.Rate > 0 && est.Cmp(limit) <= 0
			if got.Allowed && ev.n > 0 && !exactOK {
				t.Fatalf("%+v #%d key %d at %d n=%d: sketch admits what the exact counts deny (prev %d curr %d)", p, i, key, ev.at, ev.n, w.prev, w.curr)
			}
			if keys == 1 {
				want := w.result(p.Period, p.Capacity, ev.at, ev.n, false)
				if p.Rate == 0 {
					want = zeroLimit(ev.n, w.end(p.Period)-ev.at)
				}
				if got != want {
					t.Fatalf("%+v #%d at %d n=%d: one key: got %s, want %s", p, i, ev.at, ev.n, fmtResult(got), fmtResult(want))
				}
			}
			if got.Allowed && ev.n > 0 {
				sk.Add(h, ev.at, ev.n)
				exact[[2]int64{key, ws}] += ev.n
			}
		}
	})
}

// FuzzStepBounds feeds Step, LogStep and the sketch arbitrary states, times,
// costs and valid params, including the extremes of int64, and checks
// they never panic and answer within bounds.
func FuzzStepBounds(f *testing.F) {
	f.Add(uint8(2), int64(1), int64(1), int64(1), int64(0), int64(0), int64(0), int64(0), int64(1))
	f.Add(uint8(0), int64(1<<40), int64(100*year), int64(1<<40), int64(0), int64(1<<62+1), int64(5), int64(1<<62), int64(1<<40))
	f.Add(uint8(1), int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64), int64(0), int64(math.MaxInt64), int64(-1), int64(math.MaxInt64), int64(math.MaxInt64))
	f.Add(uint8(4), int64(3), int64(7), int64(MaxSlidingWindowCapacity), int64(0), int64(math.MaxInt64), int64(-1), int64(math.MaxInt64-8), int64(2))
	f.Add(uint8(1), int64(6), int64(90), int64(5), int64(30), int64(120), int64(3), int64(119), int64(2))
	f.Fuzz(func(t *testing.T, kind uint8, rate, period, capacity, interval, a, b, now, n int64) {
		p := Params{Kind: Kind(kind % uint8(numKinds)), Rate: rate, Period: period, Capacity: capacity, Interval: interval}
		if p.Validate() != nil {
			return
		}
		if p.Kind.HasState() {
			s := State{A: a, B: b}
			next, r := Step(&p, s, now, n)
			checkBounds(t, &p, s, next, now, n, r)
			return
		}
		if p.Kind == Concurrency {
			// a, b: the earliest expiry and the hit's own; the set holds
			// capacity permits at most.
			s := PermitSet{Held: min(max(n, 0), p.Capacity), Earliest: a, Old: b}
			r, _ := PermitStep(&p, s, now, n)
			checkBounds(t, &p, State{}, State{}, now, n, r)
			r, _ = PermitRenew(&p, s, now, n > 1)
			if r.Allowed != (r.RetryAfter == 0) || r.Remaining < 0 || r.ResetAfter < 0 {
				t.Fatalf("renew: %+v", r)
			}
			return
		}
		if p.Kind == SlidingLog {
			log := Log{Entries: []LogEntry{{a, b}, {a + 1, 1}, {now - 1, n}}, Seen: a}
			log.Recount()
			_, r := LogStep(&p, &log, now, n)
			checkBounds(t, &p, State{}, State{}, now, n, r)
			log.Commit(int(b), now, n)
			return
		}
		sk := NewSketch(3, 2)
		sk.Add(uint64(a), b, n)
		r := sk.Check(&p, uint64(a), now, n)
		checkBounds(t, &p, State{}, State{}, now, n, r)
	})
}
