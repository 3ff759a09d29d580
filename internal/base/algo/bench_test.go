package algo

import "testing"

var sinkResult Result

// BenchmarkStep measures one Step per algorithm on a busy key: most requests
// are admitted, some denied, and the state is committed when allowed.
func BenchmarkStep(b *testing.B) {
	for _, p := range []Params{
		{Kind: FixedWindow, Rate: 1000, Period: sec, Capacity: 1000},
		{Kind: TokenBucket, Rate: 1000, Period: sec, Capacity: 100},
		{Kind: TokenBucket, Rate: 10, Period: sec, Capacity: 100, Interval: 100 * ms},
		{Kind: LeakyBucket, Rate: 3, Period: sec, Capacity: 50},
		{Kind: GCRA, Rate: 1000, Period: sec, Capacity: 100},
		{Kind: SlidingWindow, Rate: 1000, Period: sec, Capacity: 1000},
	} {
		name := p.Kind.String()
		if p.Interval > 0 {
			name += "_discrete"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			var s State
			now := base
			for b.Loop() {
				now += 997 * 1000 // ~1000 requests per second
				next, r := Step(&p, s, now, 1)
				if r.Allowed {
					s = next
				}
				sinkResult = r
			}
		})
	}
}

func BenchmarkLogStep(b *testing.B) {
	for _, c := range []int64{10, 100, 1000} {
		b.Run(fmtInt(c), func(b *testing.B) {
			p := Params{Kind: SlidingLog, Rate: c, Period: sec, Capacity: c}
			log := Log{Entries: make([]LogEntry, 0, c+1)}
			now := base
			b.ReportAllocs()
			for b.Loop() {
				now += sec / (c + c/10) // slightly over the limit
				expired, r := LogStep(&p, &log, now, 1)
				n := int64(0)
				if r.Allowed {
					n = 1
				}
				log.Commit(expired, now, n)
				sinkResult = r
			}
		})
	}
}

func BenchmarkSketch(b *testing.B) {
	for _, dims := range [][2]int{{2048, 4}, {65536, 8}} {
		b.Run(fmtInt(int64(dims[0]))+"x"+fmtInt(int64(dims[1])), func(b *testing.B) {
			p := Params{Kind: Sketch, Rate: 100, Period: sec, Capacity: 100}
			sk := NewSketch(dims[0], dims[1])
			now := base
			var h uint64
			b.ReportAllocs()
			for b.Loop() {
				now += 1000
				h++
				k := mix64(h % 10000)
				r := sk.Check(&p, k, now, 1)
				if r.Allowed {
					sk.Add(k, now, 1)
				}
				sinkResult = r
			}
		})
	}
}

// TestNoAllocs checks the hot paths allocate nothing.
func TestNoAllocs(t *testing.T) {
	p := Params{Kind: GCRA, Rate: 3, Period: sec, Capacity: 5}
	lp := Params{Kind: SlidingLog, Rate: 3, Period: sec, Capacity: 5}
	sp := Params{Kind: Sketch, Rate: 3, Period: sec, Capacity: 5}
	sk := NewSketch(64, 4)
	log := Log{Entries: make([]LogEntry, 0, 8)}
	now := base
	for _, k := range []Kind{FixedWindow, TokenBucket, LeakyBucket, GCRA, SlidingWindow} {
		p.Kind = k
		var s State
		if n := testing.AllocsPerRun(200, func() {
			now += sec / 7
			next, r := Step(&p, s, now, 1)
			if r.Allowed {
				s = next
			}
		}); n != 0 {
			t.Errorf("Step %s: %v allocs", k, n)
		}
	}
	if n := testing.AllocsPerRun(200, func() {
		now += sec / 7
		expired, r := LogStep(&lp, &log, now, 1)
		if r.Allowed {
			log.Commit(expired, now, 1)
		}
		if r := sk.Check(&sp, 99, now, 1); r.Allowed {
			sk.Add(99, now, 1)
		}
	}); n != 0 {
		t.Errorf("log and sketch: %v allocs", n)
	}
}

// BenchmarkOverdraw measures Overdraw, Step as sluice serve decides by
// default (each limit on its own), on the same busy keys as BenchmarkStep:
// most hits admitted, a few denied, and those that find the limit
// exhausted charged when it may be (ChargesExhausted).
func BenchmarkOverdraw(b *testing.B) {
	for _, p := range []Params{
		{Kind: FixedWindow, Rate: 1000, Period: sec, Capacity: 1000},
		{Kind: GCRA, Rate: 1000, Period: sec, Capacity: 100, Debit: true},
		{Kind: SlidingWindow, Rate: 1000, Period: sec, Capacity: 1000},
	} {
		b.Run(p.Kind.String(), func(b *testing.B) {
			b.ReportAllocs()
			var s State
			now := base
			for b.Loop() {
				now += 997 * 1000
				next, r := Overdraw(&p, s, now, 1)
				if r.Allowed || r.Overdrawn {
					s = next
				}
				sinkResult = r
			}
		})
	}
}
