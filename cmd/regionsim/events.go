package main

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/internal/base/fairshare"
)

type kind int

const (
	windowStart kind = iota
	arrival
	loopTick
	atCoord  // a call reaches the coordinator
	atRegion // its answer reaches the region
	timeout  // a call unanswered this long has failed
	wake     // a sleep ends
	expire   // a window's ledger entry expires
	shift    // the last region goes quiet
	heal     // a cut ends
	midFault // the fault, if no large grant struck it before
)

type event struct {
	at   time.Duration
	seq  int64
	kind kind
	r, n int   // region, node
	gen  int   // arrival: the region's generation
	w    int64 // windowStart, expire
	p    *park // atCoord, atRegion, timeout, wake
}

// queue is a min-heap of events by time, then by the order pushed.
type queue []event

func (q queue) less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}

func (q *queue) push(e event) {
	*q = append(*q, e)
	h := *q
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if !h.less(i, p) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

func (q *queue) pop() event {
	h := *q
	e := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	for i := 0; ; {
		l, m := 2*i+1, i
		if l < n && h.less(l, m) {
			m = l
		}
		if l+1 < n && h.less(l+1, m) {
			m = l + 1
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	*q = h
	return e
}

func (s *sim) handle(e event) {
	switch e.kind {
	case windowStart:
		s.startWindow(e.w)
	case arrival:
		if r := s.rs[e.r]; e.gen == r.gen && !r.down {
			s.decide(e.r)
			s.nextArrival(e.r)
		}
	case loopTick:
		s.tick(e.r, e.n)
	case atCoord:
		s.arrive(e.p)
	case atRegion:
		s.answer(e.p)
	case timeout:
		if !s.rs[e.p.region].down && !e.p.done {
			s.resume(e.p, context.DeadlineExceeded)
		}
	case wake:
		if !s.rs[e.p.region].down {
			s.resume(e.p, nil)
		}
	case expire:
		s.led.expire(e.w)
	case shift:
		s.r.Shift = s.now
		r := s.rs[e.r]
		r.rate = 0
		r.gen++
		s.rebase()
	case heal:
		s.rs[e.r].cut = false
		s.r.HealAt = s.now
	case midFault:
		if !s.faulted {
			s.strike(e.r, false)
		}
	}
}

// startWindow begins window w: every region holds its safe share (until
// its first decision charges the counter, it holds it without knowing).
func (s *sim) startWindow(w int64) {
	if w > 0 {
		s.closeWindow()
	}
	s.w, s.window = w, 0
	n := s.c.regions
	st := windowStat{Asked: make([]int64, n), Admitted: make([]int64, n), AEnd: make([]int64, n), AllocEnd: make([]int64, n),
		AMin: make([]int64, n), AMax: make([]int64, n), Cut: make([]bool, n), Down: make([]bool, n), Ramp: -1,
		LedgerMax: s.r.Safe * int64(n)}
	for i, r := range s.rs {
		r.admitted, r.held = 0, s.r.Safe
		st.AMin[i], st.AMax[i] = r.held, r.held
		st.Cut[i] = r.cut
		if w == 0 {
			s.nextArrival(i)
		}
	}
	s.stats = append(s.stats, st)
	s.rebase()
	s.push(event{at: time.Duration(w+1)*s.c.window + s.c.ttl, kind: expire, w: w})
}

// closeWindow records the window's end: what each region held and the
// ledger's alloc_r.
func (s *sim) closeWindow() {
	st := &s.stats[len(s.stats)-1]
	for i, r := range s.rs {
		st.AEnd[i] = r.held
		st.AllocEnd[i] = s.alloc(s.w, i)
		st.Down[i] = r.down
	}
}

// rebase starts measuring the ramp from now: each region's target is its
// max-min fair share of what is left of the window (by the true demand
// rates), plus what it has counted.
func (s *sim) rebase() {
	st := &s.stats[len(s.stats)-1]
	st.From, st.Ramp = s.now, -1
	st.RampR = make([]time.Duration, s.c.regions)
	st.Held0 = make([]int64, s.c.regions)
	left := (time.Duration(s.w+1)*s.c.window - s.now).Seconds()
	capLeft := float64(s.c.limit)
	want := make([]float64, s.c.regions)
	counted := make([]float64, s.c.regions)
	for i, r := range s.rs {
		counted[i] = float64(r.counted())
		capLeft -= counted[i]
		if !r.down {
			want[i] = s.demandRate(i, s.now) * left
		}
	}
	st.Target = fairshare.MaxMin(want, max(capLeft, 0))
	for i, r := range s.rs {
		st.Target[i] += counted[i]
		st.Held0[i] = r.held
		st.RampR[i] = -2
		if st.Target[i]-float64(st.Held0[i]) > float64(s.c.threshold) {
			st.RampR[i] = -1
		}
	}
	s.ramp()
}

// counted is what region r has counted in the window: admitted, and spent
// to give back.
func (r *region) counted() int64 {
	r.store.window()
	return r.store.spent
}

// ramp notes when each region whose target is above what it held at the
// start (by more than the give-back threshold) has come 90% of the way,
// and when all have.
func (s *sim) ramp() {
	st := &s.stats[len(s.stats)-1]
	if st.Ramp >= 0 {
		return
	}
	for i, r := range s.rs {
		h0 := float64(st.Held0[i])
		if st.RampR[i] == -1 && float64(r.held) >= h0+0.9*(st.Target[i]-h0) {
			st.RampR[i] = s.now - st.From
		}
	}
	var slowest time.Duration
	for _, d := range st.RampR {
		if d == -1 {
			return
		}
		slowest = max(slowest, d)
	}
	st.Ramp = slowest
}

// alloc is region i's allocation in window w by the ledger: its safe
// share if the ledger has no entry.
func (s *sim) alloc(w int64, i int) int64 {
	for _, e := range s.led.entries {
		if e.w == w {
			return e.alloc[i]
		}
	}
	return s.r.Safe
}

// check holds the invariants after an event: Σ alloc_r <= L in every
// ledger entry, Σ admitted_r <= L in the current window id, and no
// region holding more than its ledger allocation (a_r less what it spent
// to give back: the bound's lemma). What a region holds is read from its
// store after every event but a decision (which spends what it holds,
// and so leaves a_r less spent as it was).
func (s *sim) check(read bool) {
	s.r.Checks++
	var cur *entry
	for _, e := range s.led.entries {
		s.r.LedgerOver = max(s.r.LedgerOver, e.sum-s.c.limit)
		if e.w < int64(len(s.stats)) {
			s.stats[e.w].LedgerMax = max(s.stats[e.w].LedgerMax, e.sum)
		}
		if e.w == s.w {
			cur = e
		}
	}
	if len(s.stats) == 0 {
		return
	}
	s.r.Overshoot = max(s.r.Overshoot, s.window-s.c.limit)
	st := &s.stats[len(s.stats)-1]
	for i, r := range s.rs {
		if read {
			r.held = r.store.held(r.admitted, s.r.Safe)
		}
		alloc := s.r.Safe
		if cur != nil {
			alloc = cur.alloc[i]
		}
		s.r.AboveLedger = max(s.r.AboveLedger, r.held-alloc)
		st.AMin[i] = min(st.AMin[i], r.held)
		st.AMax[i] = max(st.AMax[i], r.held)
	}
	if read {
		s.ramp()
	}
}
