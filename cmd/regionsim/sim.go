package main

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/stores/regions"
	"github.com/sluicehq/sluice/memstore"
)

// key is the global limit's key, the one the simulation drives.
const key = "tenant"

// sim is one simulation under way: the real region tier
// (internal/stores/regions), a Store per node over a memstore per region,
// the ledger in memory, all on one virtual clock.
type sim struct {
	c       config
	rng     *rand.Rand
	start   time.Time     // the virtual clock's origin: a window's start
	now     time.Duration // since start
	q       queue
	seq     int64
	w       int64 // the current window id
	limit   *sluice.Limit
	rs      []*region
	led     ledger
	sched   *sched
	live    map[*park]bool // the procs parked
	window  int64          // admitted in the current window id
	stats   []windowStat
	faulted bool
	r       report
	large   int64 // a grant this big is "large"
	ran     bool  // a proc ran during the event

	closers []func() error // the nodes' and the regions' stores, to close in reverse

	inline context.Context // a decision's, taken inline
	hit    [1]sluice.Hit
	out    [1]sluice.Decision
}

// region is one region: its store, its nodes, its demand and its link.
type region struct {
	store    *regionStore
	nodes    []*node
	rate     float64       // demand, requests a second
	gen      int           // arrival generation: a change of rate or a crash bumps it
	latency  time.Duration // round trip to the coordinator
	cut      bool
	down     bool
	admitted int64 // in the current window
	held     int64 // what it holds (a_r less spent to give back), at the last event
}

// node is one node of a region: the real Store, and its round.
type node struct {
	st *regions.Store
	// inRound: a round runs; a tick meanwhile waits for its end (one at
	// most, as a time.Ticker's). read: the round has read the wanted set,
	// so its give-backs are for it.
	inRound, tickWaiting, read bool
}

func run(c config) report {
	s := newSim(c)
	defer s.close()
	c = s.c
	end := time.Duration(c.windows) * c.window
	for len(s.q) > 0 {
		e := s.q.pop()
		if e.at >= end {
			break
		}
		s.now = e.at
		s.ran = false
		s.handle(e)
		s.settle()
		s.check(s.ran)
	}
	s.now = end
	s.closeWindow()
	var parked []*park
	for p := range s.live {
		parked = append(parked, p)
	}
	s.sched.stop(parked)
	s.r.Windows = s.stats
	return s.r
}

// newSim sets c's world up: its regions, each a memstore with its nodes,
// and the first events.
func newSim(c config) *sim {
	c = c.defaults()
	s := &sim{c: c, rng: rand.New(rand.NewPCG(c.seed, 0x5e610)), sched: newSched(), live: map[*park]bool{}}
	s.inline = context.WithValue(context.Background(), inlineKey{}, true)
	s.led = ledger{wanted: map[string]regions.Wanted{}, ends: map[string]int64{}}
	// 2026-01-01 or so, on a window's start.
	p := int64(c.window)
	s.start = time.Unix(0, 1767225600e9/p*p)
	s.limit = &sluice.Limit{Name: "global", Algorithm: sluice.FixedWindow, Rate: c.limit, Period: c.window, Global: true}
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
	names := make([]string, c.regions)
	for i := range names {
		names[i] = string(rune('a' + i))
	}
	s.rs = make([]*region, c.regions)
	// The nodes started long before the first window (a node started in
	// a window knows nothing of what its region spent of it, and its
	// failure policy admits nothing of it: regions' restart rule); the
	// region's memstore never restarts (Config.Started nil).
	s.now = -uptime
	for i := range s.rs {
		r := &region{latency: c.rtt[min(i, len(c.rtt)-1)]}
		s.rs[i] = r
		mem := memstore.New(memstore.Config{Now: s.clock, SweepInterval: -1, Shards: 1})
		s.closers = append(s.closers, mem.Close)
		r.store = &regionStore{Store: mem, sim: s, limit: s.limit, region: i, w: -1, applied: map[uint64]bool{}, nospend: c.broken == "nospend"}
		for j := range c.nodes {
			st, err := regions.New(regions.Config{Next: r.store, Region: names[i], Regions: names, Ledger: &nodeLedger{s: s, region: i, node: j},
				Now: s.clock, Interval: c.tau, Nodes: func() int { return c.nodes }, Sleep: s.sched.sleep(i, j), Manual: true, Plan: s.plan()})
			if err != nil {
				panic(err) // the configuration is the simulation's own
			}
			s.closers = append(s.closers, st.Close)
			r.nodes = append(r.nodes, &node{st: st})
			s.push(event{at: time.Duration(s.rng.Int64N(int64(c.tau))), kind: loopTick, r: i, n: j})
		}
		r.rate = s.demandRate(i, 0)
	}
	s.now = 0
	if c.mix == "shift" {
		s.push(event{at: end / 2, kind: shift, r: c.regions - 1})
	}
	if c.fault != "none" && c.at < c.windows {
		s.push(event{at: time.Duration(c.at)*c.window + c.window/2, kind: midFault, r: 0})
	}
	return s
}

// close closes the stores, the nodes' before the regions'.
func (s *sim) close() {
	for _, c := range slices.Backward(s.closers) {
		c()
	}
}

// uptime is how long before the first window the nodes started: more
// than the slack regions allows a start time (2 s).
const uptime = time.Hour

// clock is the virtual clock, the real code's Now.
func (s *sim) clock() time.Time { return s.start.Add(s.now) }

// windowOf is the id of the window holding t.
func (s *sim) windowOf(t time.Duration) int64 { return int64(t / s.c.window) }

func (s *sim) push(e event) {
	s.seq++
	e.seq = s.seq
	s.q.push(e)
}

// settle waits for the procs to park or end, and turns their parks into
// events, noting that a proc ran (ran: what a region holds may have
// changed).
func (s *sim) settle() {
	for {
		ps := s.sched.settle()
		if len(ps) == 0 {
			return
		}
		s.ran = true
		for _, p := range ps {
			s.parked(p)
		}
	}
}

// parked schedules what a proc waits for: the end of a sleep, or a
// call's trip to the coordinator (lost while the region's link is cut)
// and its timeout.
func (s *sim) parked(p *park) {
	switch p.kind {
	case parkDone:
		p.then()
		return
	case parkSleep:
		s.live[p] = true
		s.push(event{at: s.now + p.d, kind: wake, p: p})
		return
	}
	s.live[p] = true
	r := s.rs[p.region]
	n := r.nodes[p.node]
	c := p.call
	switch c.op {
	case opWanted:
		s.r.Reads++
	case opGiveBack:
		c.yield = n.read
		s.r.Calls++
	default:
		s.r.Calls++
	}
	s.push(event{at: s.now + s.c.timeout, kind: timeout, p: p})
	if r.cut || r.down {
		s.r.Lost++
		return
	}
	s.push(event{at: s.now + s.leg(p.region), kind: atCoord, p: p})
}

// resume lets p's proc go on with err.
func (s *sim) resume(p *park, err error) {
	delete(s.live, p)
	s.sched.resume(p, err)
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

// decide takes one request of cost 1 at a node of region i, through the
// real Store: inline, or in a proc if it must wait for a window's edge.
func (s *sim) decide(i int) {
	r := s.rs[i]
	j := 0
	if len(r.nodes) > 1 {
		j = s.rng.IntN(len(r.nodes))
	}
	st := r.nodes[j].st
	s.hit[0] = sluice.Hit{Key: key, Limit: s.limit, Cost: 1}
	err := st.Take(s.inline, s.hit[:], s.out[:])
	if !errors.Is(err, errDefer) {
		s.decided(i, s.out[0], err)
		return
	}
	s.deferred(i, j, s.hit[0])
}

// deferred takes h at node j of region i in a proc: the decision waits
// for a window's edge.
func (s *sim) deferred(i, j int, h sluice.Hit) {
	var err error
	hits, out := []sluice.Hit{h}, make([]sluice.Decision, 1)
	st := s.rs[i].nodes[j].st
	s.sched.spawn(i, j, func() { err = st.Take(context.Background(), hits, out) }, func() { s.decided(i, out[0], err) })
}

// decided counts a decision of region i in the current window id.
func (s *sim) decided(i int, d sluice.Decision, err error) {
	r := s.rs[i]
	st := &s.stats[len(s.stats)-1]
	st.Asked[i]++
	switch {
	case err != nil:
		s.r.Errors++
	case d.Allowed:
		r.admitted++
		st.Admitted[i]++
		s.window++
	}
}

// tick is node j of region i's turn every τ: a round of the real Store,
// in a proc, unless one runs.
func (s *sim) tick(i, j int) {
	r := s.rs[i]
	if r.down {
		return
	}
	s.push(event{at: s.now + s.c.tau, kind: loopTick, r: i, n: j})
	n := r.nodes[j]
	if n.inRound {
		n.tickWaiting = true
		return
	}
	s.round(i, j)
}

func (s *sim) round(i, j int) {
	n := s.rs[i].nodes[j]
	n.inRound, n.read = true, false
	s.sched.spawn(i, j, func() { n.st.Round(context.Background()) }, func() {
		n.inRound = false
		if n.tickWaiting && !s.rs[i].down {
			n.tickWaiting = false
			s.round(i, j)
		}
	})
}

// arrive delivers p's call at the coordinator, which applies it and
// answers; the answer is lost if the link is cut meanwhile.
func (s *sim) arrive(p *park) {
	r := s.rs[p.region]
	if r.cut {
		s.r.Lost++
		return
	}
	c := p.call
	s.coordinate(p.region, c)
	// The worst moment for a cut: the coordinator has applied a large
	// grant, and its answer is lost.
	if c.op == opGrant && s.c.fault == "cut" && p.region == 0 && !s.faulted && c.w == int64(s.c.at) && c.g >= s.large {
		s.strike(0, true)
		s.r.Applied++
		s.r.Lost++
		return
	}
	s.push(event{at: s.now + s.leg(p.region), kind: atRegion, p: p})
}

// answer delivers the coordinator's answer to p's proc.
func (s *sim) answer(p *park) {
	r := s.rs[p.region]
	if r.cut || r.down {
		s.r.Lost++
		if r.cut && p.call.op != opWanted && !p.done {
			s.r.Applied++
		}
		return
	}
	if p.done {
		return // timed out
	}
	c := p.call
	if c.op == opWanted {
		r.nodes[p.node].read = true
	}
	s.resume(p, nil)
	s.settle()
	// The worst moment for a crash: right after a large grant.
	if s.c.fault == "crash" && p.region == 0 && !s.faulted && c.op == opGrant && c.w == s.w && c.w == int64(s.c.at) && c.g >= s.large {
		s.strike(0, true)
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

// plan is the nodes' allocation policy: the real one (nil) but for -loop
// design.
func (s *sim) plan() func(*regions.Demand) int64 {
	if s.c.loop != "design" {
		return nil
	}
	return s.planDesign
}

// tick is a round of the design's loop: when, and the hits asked since
// the round before.
type tick struct {
	at   time.Duration
	asks int64
}

// planDesign is the design's loop, in place of the real round's policy:
// the rate over the last -estimate rounds, need = rate × left + -headroom
// τ's of it (at least -minheadroom); give back a surplus above
// -threshold. Its rounds carry over from the window before.
func (s *sim) planDesign(d *regions.Demand) int64 {
	ticks, _ := d.Memo.([]tick)
	ticks = append(ticks, tick{s.now, d.Asked})
	if len(ticks) > s.c.estimate+1 {
		ticks = ticks[1:]
	}
	d.Memo = ticks
	if len(ticks) < 2 {
		return 0
	}
	var asks int64
	for _, t := range ticks[1:] {
		asks += t.asks
	}
	d.Rate = float64(asks) / (s.now - ticks[0].at).Seconds()
	if d.Remaining < 0 {
		return 0
	}
	est := d.Rate * float64(d.Nodes)
	need := int64(math.Ceil(est*d.Left.Seconds()+s.c.headroom*est*s.c.tau.Seconds())) + s.c.minHead
	switch {
	case need > d.Remaining:
		return (need - d.Remaining + d.Nodes - 1) / d.Nodes
	case d.Remaining-need > s.c.threshold:
		return -((d.Remaining - need) / d.Nodes)
	}
	return 0
}
