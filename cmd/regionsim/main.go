// Command regionsim runs the protocol of one limit across regions
// (docs/internals/regions.md) on a virtual clock and checks its bound at
// every event: a coordinator's ledger hands out allocations of a global
// limit L per fixed window, with each region's safe share as the default of
// a region it has not heard from; each region decides exactly from its
// allocation (a request of cost 1 is admitted iff c_r + 1 <= a_r) and
// every τ asks for more or, having spent it first, gives back what it will
// not use.
//
// The protocol is internal/stores/regions' by default: a grant gives at most half
// of what no region holds (-grant half); a grant that falls short marks
// the entry wanted, and every τ each region reads the wanted set and gives
// back all but a headroom (L/100) of what it holds of an entry it does not
// use, a key it has not decided in the window included (-wanted); the
// region's round smooths its rate 0.7/0.3 a round, starting a window from
// the window before's if it decided the key in it, asks for rate × (time
// left + 2τ) + 1, and gives nothing back until it has known the key in the
// window for 2τ (-loop built). The design before it was built is -grant
// all -wanted=false -loop design. Either way a region acts only on a key
// it has decided in the window (or given back for the wanted set): a
// region never knows a key it has not seen.
//
//	go run ./cmd/regionsim -regions 3 -rtt 50ms -mix hot
//	go run ./cmd/regionsim -mix one -wanted=false
//	go run ./cmd/regionsim -regions 3 -rtt 150ms -mix shift -fault cut
//	go run ./cmd/regionsim -sweep
//	go run ./cmd/regionsim -sweep -mixes one,hot,shift -grant all -wanted=false -loop design
//
// Demand is a Poisson process per region, -demand times L a window in
// all: even, "hot" (region 0 has -hotshare of it, the others share the
// rest), "shift" (even, and the last region goes quiet at half time) or
// "one" (region 0 only, the others idle).
// Each message to or from the coordinator takes half a round trip, with
// jitter. A fault strikes region 0 in window -at, at the worst moment:
// "cut" cuts its link right after the coordinator applies a large grant to
// it, so that grant's answer is lost (messages in flight and sent while cut
// are lost both ways) and heals after -cutfor; "crash" stops the region
// right after it receives a large grant, for good. Without a large grant
// by the middle of the window, the fault strikes there.
package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/base/fairshare"
)

// config is one simulation.
type config struct {
	regions   int
	limit     int64         // L, a window
	window    time.Duration // the fixed window
	windows   int           // windows simulated
	demand    float64       // all regions' demand, in multiples of L a window
	mix       string        // even, hot, shift or one
	hotShare  float64       // region 0's share of the demand under "hot"
	rtt       []time.Duration
	jitter    float64 // each leg's latency varies by up to this fraction
	tau       time.Duration
	estimate  int     // ticks of history in the demand estimate (the design's k; -loop design)
	headroom  float64 // headroom, in τ's of the estimated demand (-loop design)
	minHead   int64   // and at least this many requests (-loop design)
	threshold int64   // give back only a surplus above this (0: L/100; -loop design)
	timeout   time.Duration
	ttl       time.Duration // a ledger entry lives this long past its window
	fault     string        // none, cut or crash
	at        int           // the window the fault strikes in
	cutFor    time.Duration // how long a cut lasts (0: one window)
	seed      uint64
	mixes     string // the sweep's, comma-separated

	// The protocol: built (internal/stores/regions) by default; the design
	// before it was built is grant "all", wanted false, loop "design".
	grant  string // "half": at most half of what no region holds (at least 1); "all": all of it
	wanted bool   // a short grant marks the entry wanted; regions that hold it unused give it back
	loop   string // "built": the rate smoothed 0.7/0.3 per round, carried from the window before, need = rate × (left + 2τ) + 1; "design": over -estimate ticks

	// broken selects a deliberately wrong protocol, for the tests to
	// show the checks see it: "nospend" gives back without spending
	// first (the region lowers a_r only when the answer comes back),
	// "nocap" grants what is asked, without the cap.
	broken string
}

func main() {
	cfg, sweep, err := parse(os.Args[1:], os.Stderr)
	if err != nil {
		os.Exit(2)
	}
	if sweep {
		runSweep(os.Stdout, cfg)
		return
	}
	r := run(cfg)
	r.print(os.Stdout, cfg)
	if r.Overshoot > 0 || r.LedgerOver > 0 || r.AboveLedger > 0 {
		os.Exit(1)
	}
}

func parse(args []string, stderr io.Writer) (config, bool, error) {
	fs := flag.NewFlagSet("regionsim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config
	var rtt string
	var sweep bool
	fs.IntVar(&c.regions, "regions", 3, "regions sharing the global limit")
	fs.Int64Var(&c.limit, "limit", 10000, "the global limit L, a window")
	fs.DurationVar(&c.window, "window", time.Minute, "the fixed window")
	fs.IntVar(&c.windows, "windows", 5, "windows simulated")
	fs.Float64Var(&c.demand, "demand", 1.5, "all regions' demand together, in multiples of L a window")
	fs.StringVar(&c.mix, "mix", "even", "how the demand splits: even, hot (region 0 has -hotshare), shift (even, the last region quiet from half time) or one (region 0 only)")
	fs.Float64Var(&c.hotShare, "hotshare", 0.9, "region 0's share of the demand under -mix hot")
	fs.StringVar(&rtt, "rtt", "50ms", "round trip to the coordinator: one duration for all regions, or one per region, comma-separated")
	fs.Float64Var(&c.jitter, "jitter", 0.2, "each leg's latency varies uniformly by up to this fraction")
	fs.DurationVar(&c.tau, "tau", 200*time.Millisecond, "how often a region asks or gives back (τ)")
	fs.StringVar(&c.grant, "grant", "half", "what a grant gives: half (at most half of what no region holds, as built) or all (all of it, as designed)")
	fs.BoolVar(&c.wanted, "wanted", true, "a grant that falls short marks the entry wanted, and regions give back what they hold of it unused (as built)")
	fs.StringVar(&c.loop, "loop", "built", "the region's round: built (rate smoothed 0.7/0.3 a round, carried from the window before; need = rate × (time left + 2τ) + 1; give back above need + need/4 + L/100, not in the window's last second nor in the key's first 2τ in it) or design (the flags below)")
	fs.IntVar(&c.estimate, "estimate", 25, "-loop design: ticks of history in the demand estimate")
	fs.Float64Var(&c.headroom, "headroom", 10, "-loop design: headroom over the estimated need, in τ's of estimated demand")
	fs.Int64Var(&c.minHead, "minheadroom", 10, "-loop design: the least headroom, in requests")
	fs.Int64Var(&c.threshold, "threshold", 0, "-loop design: give back only a surplus above this many requests (0: L/100); also the ramp's threshold")
	fs.DurationVar(&c.timeout, "timeout", 2*time.Second, "a call unanswered this long is taken as failed")
	fs.DurationVar(&c.ttl, "ttl", 0, "a ledger entry lives this long past its window (0: one window)")
	fs.StringVar(&c.fault, "fault", "none", "what strikes region 0: none, cut (its link, at the worst moment) or crash")
	fs.IntVar(&c.at, "at", 1, "the window the fault strikes in")
	fs.DurationVar(&c.cutFor, "cutfor", 0, "how long a cut lasts (0: one window)")
	fs.Uint64Var(&c.seed, "seed", 1, "random seed")
	fs.BoolVar(&sweep, "sweep", false, "run the sweep (regions 2, 3, 5 x rtt 50ms, 150ms x -mixes x fault) and print one row each")
	fs.StringVar(&c.mixes, "mixes", "even,hot,shift,one", "-sweep: the mixes swept, comma-separated")
	if err := fs.Parse(args); err != nil {
		return c, false, err
	}
	var probs []string
	for _, s := range strings.Split(rtt, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil || d < 0 {
			probs = append(probs, fmt.Sprintf("-rtt %q: not a duration", s))
			continue
		}
		c.rtt = append(c.rtt, d)
	}
	if len(c.rtt) != 1 && len(c.rtt) != c.regions {
		probs = append(probs, "-rtt: one duration, or one per region")
	}
	if c.regions < 1 || c.limit < int64(c.regions) || c.window <= 0 || c.windows < 1 || c.demand < 0 || c.tau <= 0 || c.estimate < 1 || c.timeout <= 0 {
		probs = append(probs, "-regions, -window, -windows, -tau, -estimate and -timeout must be positive, -limit at least -regions, -demand not negative")
	}
	if !slices.Contains(mixes, c.mix) {
		probs = append(probs, fmt.Sprintf("-mix %q: want even, hot, shift or one", c.mix))
	}
	for _, m := range strings.Split(c.mixes, ",") {
		if !slices.Contains(mixes, m) {
			probs = append(probs, fmt.Sprintf("-mixes: %q: want even, hot, shift or one", m))
		}
	}
	if c.grant != "half" && c.grant != "all" {
		probs = append(probs, fmt.Sprintf("-grant %q: want half or all", c.grant))
	}
	if c.loop != "built" && c.loop != "design" {
		probs = append(probs, fmt.Sprintf("-loop %q: want built or design", c.loop))
	}
	if c.fault != "none" && c.fault != "cut" && c.fault != "crash" {
		probs = append(probs, fmt.Sprintf("-fault %q: want none, cut or crash", c.fault))
	}
	if c.hotShare < 0 || c.hotShare > 1 || c.jitter < 0 || c.jitter >= 1 || c.headroom < 0 || c.minHead < 0 || c.threshold < 0 {
		probs = append(probs, "-hotshare between 0 and 1, -jitter in [0, 1), -headroom, -minheadroom and -threshold not negative")
	}
	if len(probs) > 0 {
		for _, p := range probs {
			fmt.Fprintln(stderr, "regionsim:", p)
		}
		return c, false, fmt.Errorf("bad flags")
	}
	return c, sweep, nil
}

var mixes = []string{"even", "hot", "shift", "one"}

// defaults fills what zero means.
func (c config) defaults() config {
	if c.threshold == 0 {
		c.threshold = c.limit / 100
	}
	if c.ttl == 0 {
		c.ttl = c.window
	}
	if c.cutFor == 0 {
		c.cutFor = c.window
	}
	if c.timeout == 0 {
		c.timeout = 2 * time.Second
	}
	if c.grant == "" {
		c.grant = "half"
	}
	if c.loop == "" {
		c.loop = "built"
	}
	if c.mixes == "" {
		c.mixes = strings.Join(mixes, ",")
	}
	if len(c.rtt) == 0 {
		c.rtt = []time.Duration{50 * time.Millisecond}
	}
	return c
}

// report is what a simulation measured.
type report struct {
	Windows      []windowStat
	Safe         int64 // s_r
	Overshoot    int64 // the most admitted in one window id beyond L (the bound: 0)
	LedgerOver   int64 // the most Σ alloc_r beyond L in one ledger entry (the invariant: 0)
	AboveLedger  int64 // the most a region held (a_r less what it spent to give back) beyond its ledger allocation (the lemma: 0)
	Checks       int64 // events at which the invariants were checked
	FaultAt      time.Duration
	FaultLarge   bool          // the fault struck right after a large grant, not at the fallback
	HealAt       time.Duration // a cut's end; -1: none
	Shift        time.Duration // when the last region went quiet; -1: never
	Calls, Lost  int64         // calls sent; messages lost to the cut
	Applied      int64         // calls applied at the coordinator whose answer was lost
	Reads        int64         // reads of the wanted set
	GrantedTotal int64
	GivenTotal   int64
	Yielded      int64 // of GivenTotal, given back for the wanted set
}

// windowStat is one window id's tally.
type windowStat struct {
	Asked, Admitted []int64 // per region
	LedgerMax       int64   // the most Σ alloc_r seen in its ledger entry
	AEnd, AllocEnd  []int64 // what each region held (a_r less spent) and the ledger's alloc_r at the window's end
	AMin, AMax      []int64 // the least and most each region held during the window
	Cut             []bool  // the region's link was cut at some time in the window
	Down            []bool  // the region was down at the window's end
	From            time.Duration
	Target          []float64       // each region's max-min fair allocation from From
	Held0           []int64         // what each region held at From
	RampR           []time.Duration // from From until the region had 90% of the way from Held0 to its target; -2: target not above Held0 by more than the threshold; -1: never
	Ramp            time.Duration   // the slowest of RampR; -1: some region never
}

func (w *windowStat) asked() (n int64) {
	for _, x := range w.Asked {
		n += x
	}
	return n
}

func (w *windowStat) admitted() (n int64) {
	for _, x := range w.Admitted {
		n += x
	}
	return n
}

// region is one region: its allocation and count for the current window,
// and its loop's state.
type region struct {
	w       int64 // the window id a and c are for
	a, c    int64 // allocation, and count (admitted plus spent to give back)
	burnt   int64 // spent to give back, in this window
	rate    float64
	gen     int // arrival generation: a change of rate or a crash bumps it
	ticks   []tick
	asks    int64         // asks since the last tick
	pending int64         // the call in flight, 0: none
	latency time.Duration // round trip
	cut     bool
	down    bool

	// What the region knows of the key in this window, as a node of
	// internal/stores/regions keeps it: nothing until its first decision (or a
	// give-back for the wanted set).
	seen      bool
	born      time.Duration // when it first knew the key in this window
	yielded   bool          // gave back for the wanted set
	wAsked    int64         // asked in this window
	lastAsked int64         // wAsked at the last round
	est       float64       // the estimated demand, a second

	// The round: a call (grant or give-back) if one is needed, then a
	// read of the wanted set and a give-back for it, one after the
	// other; a tick during a round waits for its end (one at most, as a
	// time.Ticker's).
	inRound, tickWaiting bool
	step                 int
}

// A round's steps: the call in flight.
const (
	stepCall = iota + 1
	stepRead
	stepYield
)

type tick struct {
	at   time.Duration
	asks int64
}

// entry is the ledger's entry of one window: region -> allocated, a
// missing region read as its safe share.
type entry struct {
	w     int64
	alloc []int64 // each region's allocation, its safe share until it calls
	sum   int64
}

type kind int

const (
	windowStart kind = iota
	arrival
	loopTick
	atCoord
	atRegion
	expire
	shift
	heal
	midFault
	timeout
)

// call is one grant or give_back, with the coordinator's answer.
type call struct {
	id     int64
	w      int64
	give   bool
	read   bool  // a read of the wanted set
	yield  bool  // a give-back for the wanted set
	x      int64 // asked (grant) or given back
	g      int64 // granted
	alloc  int64
	wanted []int64 // a read's answer: the windows wanted, not ended
}

type event struct {
	at   time.Duration
	seq  int64
	kind kind
	r    int
	gen  int
	w    int64
	call call
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

// sim is one simulation under way.
type sim struct {
	c       config
	rng     *rand.Rand
	now     time.Duration
	q       queue
	seq     int64
	w       int64 // the current window id
	rs      []*region
	ledger  []*entry // the entries alive, oldest first
	window  int64    // admitted in the current window id
	stats   []windowStat
	calls   int64
	faulted bool
	r       report
	large   int64          // a grant this big is "large"
	wanted  map[int64]bool // the coordinator's wanted set: window ids
}

func run(c config) report {
	c = c.defaults()
	s := &sim{c: c, rng: rand.New(rand.NewPCG(c.seed, 0x5e610)), wanted: map[int64]bool{}}
	s.r = report{Safe: c.limit / int64(c.regions), FaultAt: -1, HealAt: -1, Shift: -1}
	// Large: L/2R when a grant may give all that is free, L/8R when it
	// gives half (the first grant after the others give back their
	// surplus: half of it).
	s.large = max(c.threshold, c.limit/int64(2*c.regions))
	if c.grant == "half" {
		s.large = max(c.threshold, c.limit/int64(8*c.regions))
	}
	end := time.Duration(c.windows) * c.window
	for w := range c.windows {
		s.push(event{at: time.Duration(w) * c.window, kind: windowStart, w: int64(w)})
	}
	s.rs = make([]*region, c.regions)
	for i := range s.rs {
		r := &region{w: -1, latency: c.rtt[min(i, len(c.rtt)-1)]}
		s.rs[i] = r
		r.rate = s.demandRate(i, 0)
		s.push(event{at: time.Duration(s.rng.Int64N(int64(c.tau))), kind: loopTick, r: i})
	}
	if c.mix == "shift" {
		s.push(event{at: end / 2, kind: shift, r: c.regions - 1})
	}
	if c.fault != "none" && c.at < c.windows {
		s.push(event{at: time.Duration(c.at)*c.window + c.window/2, kind: midFault, r: 0})
	}
	for len(s.q) > 0 {
		e := s.q.pop()
		if e.at >= end {
			break
		}
		s.now = e.at
		s.handle(e)
		s.check()
	}
	s.now = end
	s.closeWindow()
	s.r.Windows = s.stats
	return s.r
}

func (s *sim) push(e event) {
	s.seq++
	e.seq = s.seq
	s.q.push(e)
}

// demandRate is region i's demand at time t, requests a second.
func (s *sim) demandRate(i int, t time.Duration) float64 {
	total := s.c.demand * float64(s.c.limit) / s.c.window.Seconds()
	n := float64(s.c.regions)
	switch s.c.mix {
	case "hot":
		if s.c.regions == 1 {
			return total
		}
		if i == 0 {
			return total * s.c.hotShare
		}
		return total * (1 - s.c.hotShare) / (n - 1)
	case "shift":
		if i == s.c.regions-1 && s.r.Shift >= 0 && t >= s.r.Shift {
			return 0
		}
	case "one":
		if i == 0 {
			return total
		}
		return 0
	}
	return total / n
}

// nextArrival schedules region i's next request, Poisson at its rate.
func (s *sim) nextArrival(i int) {
	r := s.rs[i]
	if r.rate <= 0 || r.down {
		return
	}
	d := time.Duration(s.rng.ExpFloat64() / r.rate * float64(time.Second))
	s.push(event{at: s.now + d, kind: arrival, r: i, gen: r.gen})
}

// leg is the latency of one message of region i: half its round trip,
// with jitter.
func (s *sim) leg(i int) time.Duration {
	half := float64(s.rs[i].latency) / 2
	return time.Duration(half * (1 + s.c.jitter*(2*s.rng.Float64()-1)))
}

func (s *sim) handle(e event) {
	switch e.kind {
	case windowStart:
		s.startWindow(e.w)
	case arrival:
		r := s.rs[e.r]
		if e.gen != r.gen || r.down {
			return
		}
		s.decide(e.r)
		s.nextArrival(e.r)
	case loopTick:
		r := s.rs[e.r]
		if r.down {
			return
		}
		s.push(event{at: s.now + s.c.tau, kind: loopTick, r: e.r})
		if r.inRound {
			r.tickWaiting = true
			return
		}
		s.round(e.r)
	case atCoord:
		s.coordinate(e.r, e.call)
	case atRegion:
		s.answer(e.r, e.call)
	case timeout:
		r := s.rs[e.r]
		if r.down || r.pending != e.call.id {
			return
		}
		r.pending = 0
		s.next(e.r, nil)
	case expire:
		s.ledger = slices.DeleteFunc(s.ledger, func(x *entry) bool { return x.w == e.w })
		delete(s.wanted, e.w)
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

// startWindow begins window w: every region starts at its safe share,
// whether it can reach the coordinator or not.
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
		if s.c.loop == "built" && (!r.seen || r.w != w-1) {
			// A node keeps a key's state per window; a new one takes
			// the rate of the window just before, if it had one.
			r.est = 0
		}
		r.w, r.a, r.c, r.burnt = w, s.r.Safe, 0, 0
		r.seen, r.yielded, r.wAsked, r.lastAsked = false, false, 0, 0
		st.AMin[i], st.AMax[i] = r.a, r.a
		st.Cut[i] = r.cut
		if w == 0 {
			s.nextArrival(i)
		}
	}
	s.stats = append(s.stats, st)
	s.rebase()
	s.push(event{at: time.Duration(w+1)*s.c.window + s.c.ttl, kind: expire, w: w})
}

// closeWindow records the window's end: each region's a_r and the
// ledger's alloc_r.
func (s *sim) closeWindow() {
	st := &s.stats[len(s.stats)-1]
	for i, r := range s.rs {
		st.AEnd[i] = r.a - r.burnt
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
	for i, r := range s.rs {
		capLeft -= float64(r.c)
		if !r.down {
			want[i] = s.demandRate(i, s.now) * left
		}
	}
	st.Target = fairshare.MaxMin(want, max(capLeft, 0))
	for i, r := range s.rs {
		st.Target[i] += float64(r.c)
		st.Held0[i] = r.a - r.burnt
		st.RampR[i] = -2
		if st.Target[i]-float64(st.Held0[i]) > float64(s.c.threshold) {
			st.RampR[i] = -1
		}
	}
	s.ramp()
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
		if st.RampR[i] == -1 && float64(r.a-r.burnt) >= h0+0.9*(st.Target[i]-h0) {
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

// decide admits or denies one request of cost 1 at region i, exactly:
// admitted iff c_r + 1 <= a_r.
func (s *sim) decide(i int) {
	r := s.rs[i]
	st := &s.stats[len(s.stats)-1]
	r.asks++
	r.wAsked++
	s.know(i)
	st.Asked[i]++
	if r.c+1 <= r.a {
		r.c++
		st.Admitted[i]++
		s.window++
	}
}

// know notes that region i knows the key in its window from now (a node
// makes the key's state for the window), if it did not already.
func (s *sim) know(i int) {
	r := s.rs[i]
	if !r.seen {
		r.seen, r.born = true, s.now
	}
}

// round is region i's turn every τ: for the key, if it has decided it in
// the window, ask for what it needs beyond what it holds, or give back a
// surplus, having spent it first; then, with the wanted set, read it and
// give back what it holds and does not use of a wanted entry.
func (s *sim) round(i int) {
	r := s.rs[i]
	r.inRound = true
	var c *call
	if s.c.loop == "built" {
		c = s.planBuilt(i)
	} else {
		c = s.planDesign(i)
	}
	if c == nil {
		s.afterCall(i)
		return
	}
	if c.give && s.c.broken != "nospend" {
		r.c += c.x
		r.burnt += c.x
	}
	r.step = stepCall
	s.send(i, *c)
}

// planBuilt is internal/stores/regions' round: the rate smoothed 0.7/0.3 per
// round (a window starting from the window before's, if the region knew
// the key in it; else from the first round's count), need = rate × (left +
// 2τ) + 1; ask for need − remaining, or give back the surplus beyond need
// + need/4 when it exceeds that by more than the headroom (L/100), not in
// the window's last second, and not before the region has known the key
// in the window for 2τ.
func (s *sim) planBuilt(i int) *call {
	r := s.rs[i]
	if !r.seen {
		return nil
	}
	per := float64(r.wAsked-r.lastAsked) / s.c.tau.Seconds()
	r.lastAsked = r.wAsked
	if r.est == 0 {
		r.est = per
	} else {
		r.est = 0.7*r.est + 0.3*per
	}
	left := time.Duration(r.w+1)*s.c.window - s.now
	need := int64(math.Ceil(r.est*(left+2*s.c.tau).Seconds())) + 1
	rem := r.a - r.c
	switch {
	case need > rem:
		return &call{w: r.w, x: need - rem}
	case rem > need+need/4+s.headroom() && left > time.Second && s.now-r.born >= 2*s.c.tau:
		return &call{w: r.w, give: true, x: rem - need - need/4}
	}
	return nil
}

// headroom is what a region keeps beyond its need (built) and of a wanted
// entry it gives back: L/100, at least 1.
func (s *sim) headroom() int64 { return max(s.c.limit/100, 1) }

// planDesign is the design's loop: the rate over the last -estimate ticks,
// need = rate × left + -headroom τ's of it (at least -minheadroom); give
// back a surplus above -threshold.
func (s *sim) planDesign(i int) *call {
	r := s.rs[i]
	r.ticks = append(r.ticks, tick{s.now, r.asks})
	r.asks = 0
	if len(r.ticks) > s.c.estimate+1 {
		r.ticks = r.ticks[1:]
	}
	if len(r.ticks) < 2 {
		return nil
	}
	var asks int64
	for _, t := range r.ticks[1:] {
		asks += t.asks
	}
	r.est = float64(asks) / (s.now - r.ticks[0].at).Seconds()
	if !r.seen {
		return nil // a key with no traffic here this window: the region does not know it
	}
	left := (time.Duration(r.w+1)*s.c.window - s.now).Seconds()
	need := int64(math.Ceil(r.est*left+s.c.headroom*r.est*s.c.tau.Seconds())) + s.c.minHead
	free := r.a - r.c
	switch {
	case need > free:
		return &call{w: r.w, x: need - free}
	case free-need > s.c.threshold:
		return &call{w: r.w, give: true, x: free - need}
	}
	return nil
}

// next moves region i's round on once its call is answered (c) or has
// failed (nil).
func (s *sim) next(i int, c *call) {
	r := s.rs[i]
	switch r.step {
	case stepCall:
		s.afterCall(i)
	case stepRead:
		var wanted []int64
		if c != nil {
			wanted = c.wanted
		}
		s.yield(i, wanted)
	default:
		s.endRound(i)
	}
}

// afterCall reads the wanted set, if the protocol has it.
func (s *sim) afterCall(i int) {
	r := s.rs[i]
	if !s.c.wanted {
		s.endRound(i)
		return
	}
	r.step = stepRead
	s.r.Reads++
	s.send(i, call{w: r.w, read: true})
}

// yield gives back, for the wanted set, all but the headroom of what
// region i holds of its window's entry, unless it decides the key itself
// (its round gives back its surplus) or has already, or the window has
// less than a second left.
func (s *sim) yield(i int, wanted []int64) {
	r := s.rs[i]
	left := time.Duration(r.w+1)*s.c.window - s.now
	busy := r.seen && (r.est > 0 || r.yielded)
	if !slices.Contains(wanted, r.w) || busy || left < time.Second {
		s.endRound(i)
		return
	}
	s.know(i)
	r.yielded = true
	x := r.a - r.c - s.headroom()
	if x <= 0 {
		s.endRound(i)
		return
	}
	if s.c.broken != "nospend" {
		r.c += x
		r.burnt += x
	}
	r.step = stepYield
	s.send(i, call{w: r.w, give: true, yield: true, x: x})
}

func (s *sim) endRound(i int) {
	r := s.rs[i]
	r.inRound, r.step = false, 0
	if r.tickWaiting {
		r.tickWaiting = false
		s.round(i)
	}
}

// send sends a call from region i to the coordinator; a message sent or
// arriving while the link is cut is lost. Unanswered after -timeout, the
// call has failed.
func (s *sim) send(i int, c call) {
	r := s.rs[i]
	s.calls++
	if !c.read {
		s.r.Calls++
	}
	c.id = s.calls
	r.pending = c.id
	s.push(event{at: s.now + s.c.timeout, kind: timeout, r: i, call: call{id: c.id}})
	if r.cut {
		s.r.Lost++
		return
	}
	s.push(event{at: s.now + s.leg(i), kind: atCoord, r: i, call: c})
}

// coordinate runs a call's script on the ledger and sends the answer.
func (s *sim) coordinate(i int, c call) {
	r := s.rs[i]
	if r.cut {
		s.r.Lost++
		return
	}
	switch {
	case c.read:
		for w := range s.wanted {
			if time.Duration(w+1)*s.c.window >= s.now {
				c.wanted = append(c.wanted, w)
			}
		}
	case c.give:
		e := s.entry(c.w)
		x := min(c.x, e.alloc[i])
		e.alloc[i] -= x
		e.sum -= x
		c.alloc = e.alloc[i]
		s.r.GivenTotal += x
		if c.yield {
			s.r.Yielded += x
		}
	default:
		e := s.entry(c.w)
		var g int64
		if free := s.c.limit - e.sum; free > 0 {
			g = min(c.x, free)
			if s.c.grant == "half" {
				g = min(c.x, (free+1)/2)
			}
		}
		if s.c.broken == "nocap" {
			g = c.x
		}
		if g < c.x {
			s.wanted[c.w] = true // short: read by the regions if the protocol has the wanted set
		}
		e.alloc[i] += g
		e.sum += g
		c.g, c.alloc = g, e.alloc[i]
		s.r.GrantedTotal += g
		if c.w < int64(len(s.stats)) {
			st := &s.stats[c.w]
			st.LedgerMax = max(st.LedgerMax, e.sum)
		}
		// The worst moment for a cut: the coordinator has applied a
		// large grant, and its answer is lost.
		if s.c.fault == "cut" && i == 0 && !s.faulted && c.w == int64(s.c.at) && g >= s.large {
			s.strike(i, true)
			s.r.Applied++
			s.r.Lost++
			return
		}
	}
	if r.cut {
		s.r.Lost++
		return
	}
	s.push(event{at: s.now + s.leg(i), kind: atRegion, r: i, call: c})
}

// answer applies the coordinator's answer at region i: a grant raises
// a_r, if still in the call's window.
func (s *sim) answer(i int, c call) {
	r := s.rs[i]
	if r.cut || r.down {
		s.r.Lost++
		if r.cut && c.id == r.pending && !c.read {
			s.r.Applied++
		}
		return
	}
	mine := c.id == r.pending
	if mine {
		r.pending = 0
	}
	if c.w == r.w && !c.read {
		if c.give {
			if s.c.broken == "nospend" {
				r.a -= c.x
			}
		} else {
			r.a += c.g
		}
		s.held(i)
		s.ramp()
	}
	// The worst moment for a crash: right after a large grant.
	if s.c.fault == "crash" && i == 0 && !s.faulted && !c.read && !c.give && c.w == r.w && c.w == int64(s.c.at) && c.g >= s.large {
		s.strike(i, true)
		return
	}
	if mine {
		s.next(i, &c)
	}
}

// strike cuts region i's link or crashes it, now.
func (s *sim) strike(i int, large bool) {
	s.faulted = true
	s.r.FaultAt, s.r.FaultLarge = s.now, large
	r := s.rs[i]
	st := &s.stats[len(s.stats)-1]
	switch s.c.fault {
	case "cut":
		r.cut = true
		st.Cut[i] = true
		s.push(event{at: s.now + s.c.cutFor, kind: heal, r: i})
	case "crash":
		r.down = true
		r.gen++
		r.rate = 0
		s.rebase()
	}
}

// entry is the ledger entry of window w, made on first use: every region
// absent, read as its safe share.
func (s *sim) entry(w int64) *entry {
	for _, e := range s.ledger {
		if e.w == w {
			return e
		}
	}
	n := s.c.regions
	e := &entry{w: w, alloc: make([]int64, n), sum: s.r.Safe * int64(n)}
	for i := range e.alloc {
		e.alloc[i] = s.r.Safe
	}
	s.ledger = append(s.ledger, e)
	return e
}

// alloc is region i's allocation in window w by the ledger: its safe
// share if the ledger has no entry.
func (s *sim) alloc(w int64, i int) int64 {
	for _, e := range s.ledger {
		if e.w == w {
			return e.alloc[i]
		}
	}
	return s.r.Safe
}

// check holds the invariants after an event: Σ alloc_r <= L in every
// ledger entry, Σ admitted_r <= L in the current window id, and no
// region holding more than its ledger allocation (a_r less what it spent
// to give back: the bound's lemma).
func (s *sim) check() {
	s.r.Checks++
	var cur *entry
	for _, e := range s.ledger {
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
	for i, r := range s.rs {
		alloc := s.r.Safe
		if cur != nil {
			alloc = cur.alloc[i]
		}
		s.r.AboveLedger = max(s.r.AboveLedger, r.a-r.burnt-alloc)
		s.held(i)
	}
}

// held records the least and most region i holds: a_r less what it
// spent to give back.
func (s *sim) held(i int) {
	r := s.rs[i]
	st := &s.stats[len(s.stats)-1]
	st.AMin[i] = min(st.AMin[i], r.a-r.burnt)
	st.AMax[i] = max(st.AMax[i], r.a-r.burnt)
}

// summary is a run's figures over the windows from the second on (the
// first starts with no demand estimate) and its bound over all windows.
type summary struct {
	Admitted, Asked int64   // all windows
	HotAdm, HotAsk  float64 // region 0's share of admissions and of asks, windows after the first
	Waste           float64 // capacity left unused although asked for, windows after the first: Σ(min(asked, L) − admitted) / Σ min(asked, L)
	Unused          float64 // L − admitted over L, windows after the first
	Ramp            time.Duration
	RampNever       int           // windows after the first in which some region never reached 90% of its target
	ShiftFirst      time.Duration // after the shift, the first and the last region to hold 90% of its target; -1: never, -2: no shift
	ShiftLast       time.Duration
}

func (r report) summary(c config) summary {
	s := summary{ShiftFirst: -2, ShiftLast: -2}
	var hotAdm, adm, hotAsk, ask, room, waste, unused float64
	for w, st := range r.Windows {
		s.Admitted += st.admitted()
		s.Asked += st.asked()
		if w == 0 {
			continue
		}
		a, k := float64(st.admitted()), float64(st.asked())
		hotAdm += float64(st.Admitted[0])
		hotAsk += float64(st.Asked[0])
		adm += a
		ask += k
		room += math.Min(k, float64(c.limit))
		waste += math.Min(k, float64(c.limit)) - a
		unused += float64(c.limit) - a
		if st.Ramp < 0 {
			s.RampNever++
		}
		s.Ramp = max(s.Ramp, st.Ramp)
		if r.Shift >= 0 && st.From == r.Shift {
			s.ShiftFirst, s.ShiftLast = -1, st.Ramp
			for _, d := range st.RampR {
				if d >= 0 && (s.ShiftFirst < 0 || d < s.ShiftFirst) {
					s.ShiftFirst = d
				}
			}
		}
	}
	s.HotAdm, s.HotAsk = frac(hotAdm, adm), frac(hotAsk, ask)
	s.Waste = frac(waste, room)
	s.Unused = frac(unused, float64(c.limit)*float64(len(r.Windows)-1))
	return s
}

func frac(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func ms(d time.Duration) string {
	switch {
	case d == -2:
		return "-"
	case d < 0:
		return "never"
	}
	return d.Round(time.Millisecond).String()
}

func (r report) print(w io.Writer, c config) {
	c = c.defaults()
	fmt.Fprintf(w, "%d regions, L = %d per %s, safe share %d, round trips %v (jitter %.0f%%), τ %s, estimate over %d τ, headroom %.1f τ (at least %d), give-back threshold %d\n",
		c.regions, c.limit, c.window, r.Safe, c.rtt, 100*c.jitter, c.tau, c.estimate, c.headroom, c.minHead, c.threshold)
	fmt.Fprintf(w, "protocol %s; demand %.2f L a window, mix %s, fault %s, %d windows, seed %d", protocol(c), c.demand, c.mix, c.fault, c.windows, c.seed)
	if c.broken != "" {
		fmt.Fprintf(w, ", BROKEN protocol: %s", c.broken)
	}
	fmt.Fprintln(w)
	if r.FaultAt >= 0 {
		moment := "at the window's middle (no large grant before)"
		if r.FaultLarge {
			moment = "right after a large grant"
		}
		fmt.Fprintf(w, "fault on region 0 at %s, %s", ms(r.FaultAt), moment)
		if r.HealAt >= 0 {
			fmt.Fprintf(w, "; healed at %s", ms(r.HealAt))
		}
		fmt.Fprintln(w)
	}
	if r.Shift >= 0 {
		fmt.Fprintf(w, "region %d went quiet at %s\n", c.regions-1, ms(r.Shift))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-3s %7s %9s %6s %8s %7s  %-*s  %-*s  %s\n", "w", "asked", "admitted", "over", "ledger", "waste",
		11*c.regions, "admitted/asked share % per region", 8*c.regions, "held at end", "ramp to 90% of target, per region")
	for i, st := range r.Windows {
		var shares, ends, ramps strings.Builder
		a, k := float64(st.admitted()), float64(st.asked())
		for j := range st.Asked {
			fmt.Fprintf(&shares, "%4.1f/%4.1f  ", 100*frac(float64(st.Admitted[j]), a), 100*frac(float64(st.Asked[j]), k))
			mark := ""
			switch {
			case st.Down[j]:
				mark = "x"
			case st.Cut[j]:
				mark = "~"
			}
			fmt.Fprintf(&ends, "%6d%-1s ", st.AEnd[j], mark)
			ramps.WriteString(ms(st.RampR[j]) + " ")
		}
		waste := min(st.asked(), c.limit) - st.admitted()
		fmt.Fprintf(w, "%-3d %7d %9d %6d %8d %7d  %-*s  %-*s  %s\n", i, st.asked(), st.admitted(), max(st.admitted()-c.limit, 0),
			st.LedgerMax, waste, 11*c.regions, shares.String(), 8*c.regions, ends.String(), ramps.String())
	}
	s := r.summary(c)
	fmt.Fprintln(w)
	row := func(k, v string) { fmt.Fprintf(w, "%-52s %s\n", k, v) }
	row("admitted, all windows", fmt.Sprintf("%d of %d asked (L x windows = %d)", s.Admitted, s.Asked, c.limit*int64(c.windows)))
	row("max overshoot over L in a window id (bound: 0)", fmt.Sprint(r.Overshoot))
	row("max Σ alloc_r over L in the ledger (invariant: 0)", fmt.Sprint(r.LedgerOver))
	row("max a_r - spent over the ledger's alloc_r (lemma: 0)", fmt.Sprint(r.AboveLedger))
	row("events checked", fmt.Sprint(r.Checks))
	row("region 0: share of admitted, of asked (w >= 1)", fmt.Sprintf("%.1f%%, %.1f%%", 100*s.HotAdm, 100*s.HotAsk))
	row("capacity unused though asked for (w >= 1)", fmt.Sprintf("%.2f%%", 100*s.Waste))
	row("capacity unused (w >= 1)", fmt.Sprintf("%.2f%%", 100*s.Unused))
	row("slowest ramp to 90% of max-min share (w >= 1)", fmt.Sprintf("%s (windows where a region never did: %d)", ms(s.Ramp), s.RampNever))
	if r.Shift >= 0 {
		row("after the shift: first, last region at 90%", fmt.Sprintf("%s, %s", ms(s.ShiftFirst), ms(s.ShiftLast)))
	}
	row("calls; wanted reads; lost; applied, answer lost", fmt.Sprintf("%d; %d; %d; %d", r.Calls, r.Reads, r.Lost, r.Applied))
	row("granted, given back (of it, for the wanted set)", fmt.Sprintf("%d, %d (%d)", r.GrantedTotal, r.GivenTotal, r.Yielded))
	fmt.Fprintln(w, "\n(held: a_r less what was spent to give back; ~ cut during the window, x down at its end; waste: min(asked, L) - admitted;\n ramp: from the window's start, the shift or the crash, until the region came 90% of the way from what it held to its max-min fair share, - if that is within the give-back threshold)")
}

// sweepCases are the sweep's simulations, from base: regions 2, 3, 5 x
// round trip 50, 150 ms x base's mixes x fault none, cut, crash.
func sweepCases(base config) []config {
	var cs []config
	for _, n := range []int{2, 3, 5} {
		for _, rtt := range []time.Duration{50 * time.Millisecond, 150 * time.Millisecond} {
			for _, mix := range strings.Split(base.defaults().mixes, ",") {
				for _, fault := range []string{"none", "cut", "crash"} {
					c := base
					c.regions, c.rtt, c.mix, c.fault = n, []time.Duration{rtt}, mix, fault
					cs = append(cs, c)
				}
			}
		}
	}
	return cs
}

func runSweep(w io.Writer, base config) {
	b := base.defaults()
	fmt.Fprintf(w, "L = %d per %s, %d windows, demand %.2f L, τ %s, estimate %d τ, headroom %.1f τ (>= %d), threshold %s, jitter %.0f%%, seed %d\n",
		b.limit, b.window, b.windows, b.demand, b.tau, b.estimate, b.headroom, b.minHead, thresholdText(base), 100*b.jitter, b.seed)
	fmt.Fprintf(w, "protocol %s; shares, waste, unused and ramp over windows 1 and later; over, ledger and a>alloc over all windows and events\n", protocol(b))
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| R | rtt | mix | fault | admitted / L·windows | over | ledger over | a_r > alloc | r0 admitted / asked | waste | unused | slowest ramp (windows never) | after shift: first, last | fault at |")
	fmt.Fprintln(w, "|---|-----|-----|-------|------|---|---|---|------|---|---|---|---|---|")
	for _, c := range sweepCases(base) {
		r := run(c)
		s := r.summary(c)
		at := "-"
		if r.FaultAt >= 0 {
			at = ms(r.FaultAt)
			if !r.FaultLarge {
				at += " (mid)"
			}
		}
		fmt.Fprintf(w, "| %d | %s | %s | %s | %d / %d | %d | %d | %d | %.1f%% / %.1f%% | %.2f%% | %.2f%% | %s (%d) | %s, %s | %s |\n",
			c.regions, c.rtt[0], c.mix, c.fault, s.Admitted, c.limit*int64(c.windows), r.Overshoot, r.LedgerOver, r.AboveLedger,
			100*s.HotAdm, 100*s.HotAsk, 100*s.Waste, 100*s.Unused, ms(s.Ramp), s.RampNever, ms(s.ShiftFirst), ms(s.ShiftLast), at)
	}
}

// protocol names c's protocol: built, design, or its three choices.
func protocol(c config) string {
	switch {
	case c.grant == "half" && c.wanted && c.loop == "built":
		return "built"
	case c.grant == "all" && !c.wanted && c.loop == "design":
		return "design"
	}
	return fmt.Sprintf("grant %s, wanted %t, loop %s", c.grant, c.wanted, c.loop)
}

func thresholdText(c config) string {
	if c.threshold == 0 {
		return "L/100"
	}
	return fmt.Sprint(c.threshold)
}
