package algo

import (
	"bytes"
	"math"
	"slices"
	"testing"
)

type logTest struct {
	name  string
	p     Params
	start int64
	reqs  []req
	want  []LogEntry // the final log, times relative to start
}

func TestSlidingLog(t *testing.T) {
	perMin := Params{Kind: SlidingLog, Rate: 3, Period: minute, Capacity: 3}
	tests := []logTest{
		{name: "3 per minute", p: perMin, reqs: []req{
			{0, 1, true, 2, 60 * sec, 0},
			{10 * sec, 1, true, 1, 60 * sec, 0},
			{35 * sec, 1, true, 0, 60 * sec, 0},
			{45 * sec, 1, false, 0, 50 * sec, 15 * sec}, // 10:00:00 leaves at 10:01:00
			{60 * sec, 1, true, 0, 60 * sec, 0},
			{61 * sec, 1, false, 0, 59 * sec, 9 * sec},
			{61 * sec, 2, false, 0, 59 * sec, 34 * sec},
			{61 * sec, 4, false, 0, 59 * sec, Never},
			{61 * sec, 0, true, 0, 59 * sec, 0},
			{70 * sec, 1, true, 0, 60 * sec, 0},
		}, want: []LogEntry{{35 * sec, 1}, {60 * sec, 1}, {70 * sec, 1}}},
		{name: "time going backwards", p: perMin, reqs: []req{
			{60 * sec, 2, true, 1, 60 * sec, 0},
			// logged at 10:01:00, not 10:00:30: it leaves with the others
			{30 * sec, 1, true, 0, 90 * sec, 0},
			{90 * sec, 1, false, 0, 30 * sec, 30 * sec},
			{120 * sec, 3, true, 0, 60 * sec, 0},
		}, want: []LogEntry{{120 * sec, 3}}},
		{name: "costs", p: Params{Kind: SlidingLog, Rate: 10, Period: sec, Capacity: 10}, reqs: []req{
			{0, 4, true, 6, sec, 0},
			{100 * ms, 4, true, 2, sec, 0},
			{100 * ms, 1, true, 1, sec, 0},
			{200 * ms, 5, false, 1, 900 * ms, 800 * ms},
			{999 * ms, 3, false, 1, 101 * ms, 1 * ms},
			{sec, 3, true, 2, sec, 0},
		}, want: []LogEntry{{100 * ms, 5}, {sec, 3}}},
		{name: "rate 0 blocks", p: Params{Kind: SlidingLog, Period: sec, Capacity: 3}, reqs: []req{
			{0, 1, false, 0, 0, Never},
			{0, 0, true, 0, 0, 0},
		}},
		{name: "1 per day", p: Params{Kind: SlidingLog, Rate: 1, Period: day, Capacity: 1}, reqs: []req{
			{0, 1, true, 0, day, 0},
			{23 * hour, 1, false, 0, hour, hour},
			{day, 1, true, 0, day, 0},
		}, want: []LogEntry{{day, 1}}},
		{name: "large", start: 1 << 62, p: Params{Kind: SlidingLog, Rate: 1 << 40, Period: 100 * year, Capacity: 1 << 40}, reqs: []req{
			{0, 1 << 39, true, 1 << 39, 100 * year, 0},
			{1, 1 << 39, true, 0, 100 * year, 0},
			{2, 1, false, 0, 100*year - 1, 100*year - 2},
			// The first entry has left; ResetAfter is cut at math.MaxInt64.
			{100 * year, 1, true, 1<<39 - 1, math.MaxInt64 - (1<<62 + 100*year), 0},
		}, want: []LogEntry{{1, 1 << 39}, {100 * year, 1}}},
		{name: "end of time", start: math.MaxInt64 - hour, p: Params{Kind: SlidingLog, Rate: 1, Period: day, Capacity: 1}, reqs: []req{
			{0, 1, true, 0, hour, 0},      // ResetAfter is cut at math.MaxInt64
			{hour, 1, false, 0, 1, Never}, // now is at most math.MaxInt64-1
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := tt.start
			if start == 0 {
				start = base
			}
			var log Log
			for i, r := range tt.reqs {
				before := Log{Entries: slices.Clone(log.Entries), Sum: log.Sum, Seen: log.Seen}
				expired, got := LogStep(&tt.p, &log, start+r.at, r.n)
				check(t, i, r, got)
				if !slices.Equal(log.Entries, before.Entries) || log.Sum != before.Sum || log.Seen != before.Seen {
					t.Fatalf("#%d: LogStep modified the log", i)
				}
				n := int64(0)
				if got.Allowed {
					n = r.n
				}
				log.Commit(expired, start+r.at, n)
			}
			if tt.want != nil {
				es := slices.Clone(log.Entries)
				for i := range es {
					es[i].At -= start
				}
				if !slices.Equal(es, tt.want) {
					t.Errorf("log %v, want %v", es, tt.want)
				}
			}
		})
	}
}

func TestLogCommit(t *testing.T) {
	var log Log
	log.Entries = make([]LogEntry, 0, 4)
	log.Commit(0, 10, 1)
	log.Commit(0, 10, 2)
	log.Commit(0, 20, 1)
	log.Commit(0, 15, 1) // backwards: logged at Seen, 20
	if want := []LogEntry{{10, 3}, {20, 2}}; !slices.Equal(log.Entries, want) || log.Sum != 5 || log.Seen != 20 {
		t.Fatalf("got %+v, want %v, Sum 5, Seen 20", log, want)
	}
	if log.Commit(0, 40, 0) {
		t.Error("a peek with nothing expired changed the log")
	}
	if !log.Commit(1, 30, 0) || log.Seen != 30 || log.Sum != 2 {
		t.Fatalf("dropping one entry: %+v", log)
	}
	log.Commit(0, 30, 1)
	if want := []LogEntry{{20, 2}, {30, 1}}; !slices.Equal(log.Entries, want) || log.Sum != 3 {
		t.Fatalf("got %+v, want %v", log, want)
	}
	if !log.Commit(2, 40, 0) || len(log.Entries) != 0 || log.Seen != 0 || log.Sum != 0 {
		t.Fatalf("dropping every entry: %+v, want a fresh log", log)
	}
	log.Commit(0, 20, 2)
	log.Commit(0, 30, 1)
	log.Commit(5, 50, 1) // expired beyond the length: drops all
	if want := []LogEntry{{50, 1}}; !slices.Equal(log.Entries, want) || log.Sum != 1 || log.Seen != 50 {
		t.Fatalf("got %+v, want %v", log, want)
	}
	if n := testing.AllocsPerRun(100, func() {
		log.Commit(len(log.Entries), log.Seen+1, 1)
		log.Commit(0, log.Seen+1, 1)
	}); n != 0 {
		t.Errorf("Commit allocates %v times", n)
	}
}

// TestLogConstantWork checks a request on a log of 10,000 entries: an
// admission drops the one entry that left and appends one; a denial finds
// its wait in the oldest entry.
func TestLogConstantWork(t *testing.T) {
	p := Params{Kind: SlidingLog, Rate: 10000, Period: 10000 * sec, Capacity: 10000}
	var log Log
	for i := range int64(10000) {
		exp, r := LogStep(&p, &log, base+i*sec, 1)
		if !r.Allowed || exp != 0 {
			t.Fatalf("#%d: %s, %d expired", i, fmtResult(r), exp)
		}
		log.Commit(exp, base+i*sec, 1)
	}
	exp, r := LogStep(&p, &log, base+10000*sec-1, 1)
	if r.Allowed || exp != 0 || r.RetryAfter != 1 {
		t.Fatalf("full log: %s, %d expired", fmtResult(r), exp)
	}
	for i := range int64(100) {
		now := base + (10000+i)*sec
		exp, r := LogStep(&p, &log, now, 1)
		if !r.Allowed || exp != 1 {
			t.Fatalf("#%d: %s, %d expired", i, fmtResult(r), exp)
		}
		log.Commit(exp, now, 1)
	}
	if len(log.Entries) != 10000 || log.Sum != 10000 {
		t.Fatalf("%d entries, sum %d", len(log.Entries), log.Sum)
	}
}

func TestSketchSingleKey(t *testing.T) {
	// With one key the sketch is exact: it decides like the sliding
	// window counter.
	perMin := Params{Kind: Sketch, Rate: 3, Period: minute, Capacity: 3}
	sw := perMin
	sw.Kind = SlidingWindow
	sk := NewSketch(64, 4)
	var s State
	for _, at := range []int64{0, 10, 35, 45, 60, 79, 80, 90, 100, 180, 181, 240, 300, 301, 302, 500} {
		now := base + at*sec
		next, want := Step(&sw, s, now, 1)
		got := sk.Check(&perMin, 42, now, 1)
		if got != want {
			t.Errorf("at %ds: sketch %s, sliding window %s", at, fmtResult(got), fmtResult(want))
		}
		if got.Allowed {
			sk.Add(42, now, 1)
			s = next
		}
	}
}

func TestSketchEdges(t *testing.T) {
	p := Params{Kind: Sketch, Rate: 2, Period: minute, Capacity: 2}
	sk := NewSketch(8, 2)
	const h = 7
	tests := []req{
		{0, 0, true, 2, 60 * sec, 0},
		{0, 3, false, 2, 60 * sec, Never},
		{0, 2, true, 0, 60 * sec, 0},
		{60 * sec, 1, false, 0, 60 * sec, 30 * sec},
		// backwards: counted in the current window, at its start
		{50 * sec, 1, false, 0, 70 * sec, 40 * sec},
		{90 * sec, 1, true, 0, 30 * sec, 0},
		{200 * sec, 2, true, 0, 40 * sec, 0},
	}
	for i, r := range tests {
		got := sk.Check(&p, h, base+r.at, r.n)
		check(t, i, r, got)
		if got.Allowed {
			sk.Add(h, base+r.at, r.n)
		}
	}
	zero := Params{Kind: Sketch, Rate: 0, Period: minute, Capacity: 2}
	if r := sk.Check(&zero, h, base, 1); r.Allowed || r.RetryAfter != Never {
		t.Errorf("rate 0: %s", fmtResult(r))
	}
}

func TestSketchMarshal(t *testing.T) {
	p := Params{Kind: Sketch, Rate: 100, Period: minute, Capacity: 100}
	sk := NewSketch(16, 3)
	for i := range uint64(50) {
		now := base + int64(i)*sec*2
		if sk.Check(&p, i%7, now, 3).Allowed {
			sk.Add(i%7, now, 3)
		}
	}
	b, err := sk.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var got CMSketch
	if err := got.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	b2, _ := got.MarshalBinary()
	if !bytes.Equal(b, b2) || got.Width() != 16 || got.Depth() != 3 || got.Bytes() != sk.Bytes() {
		t.Fatal("round trip changed the sketch")
	}
	for i := range uint64(7) {
		now := base + 101*sec
		if a, b := sk.Check(&p, i, now, 1), got.Check(&p, i, now, 1); a != b {
			t.Errorf("key %d: %v after the round trip, %v before", i, b, a)
		}
	}
	for _, bad := range [][]byte{nil, b[:len(b)-1], append(slices.Clone(b), 0), []byte("sluice-cms-2\n" + string(b[13:]))} {
		keep := got
		if err := got.UnmarshalBinary(bad); err == nil {
			t.Errorf("accepted %d bytes", len(bad))
		}
		if got.width != keep.width || &got.cur[0] != &keep.cur[0] {
			t.Error("a failed UnmarshalBinary changed the sketch")
		}
	}
	if n := NewSketch(2048, 4).Bytes(); n < 2*2048*4*4 || n > 2*2048*4*4+200 {
		t.Errorf("Bytes of 2048x4 = %d", n)
	}
	if sk := NewSketch(0, -1); sk.Width() != 1 || sk.Depth() != 1 {
		t.Error("NewSketch(0, -1) is not 1x1")
	}
}
