// Command regionsim runs the region tier (internal/stores/regions: one
// limit across regions, docs/internals/regions.md) on a virtual clock and
// checks its bound at every event: a coordinator's ledger hands out
// allocations of a global limit L per fixed window, with each region's
// safe share as the default of a region it has not heard from; each
// region decides exactly from its allocation (a request of cost 1 is
// admitted iff c_r + 1 <= a_r) and every τ asks for more or, having spent
// it first, gives back what it will not use.
//
// It writes none of the protocol: each node is the real regions.Store,
// over a memstore per region (the region's Redis), run on the virtual
// clock (its Now, Sleep and Manual rounds), and the ledger is kept in
// memory with the real grant (regions.Grantable). What the simulation
// adds is the world: demand, -nodes nodes a region, the round trips to
// the coordinator, faults, and the checks.
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
//	go run ./cmd/regionsim -nodes 3 -mix hot
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
	"os"
	"slices"
	"strings"
	"time"
)

// config is one simulation.
type config struct {
	regions   int
	nodes     int           // a region's nodes
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
	// first (the region's store takes nothing for a give-back), "nocap"
	// grants what is asked, without the cap.
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
	if r.Overshoot > 0 || r.LedgerOver > 0 || r.AboveLedger > 0 || r.Errors > 0 {
		os.Exit(1)
	}
}

func parse(args []string, stderr io.Writer) (config, bool, error) {
	fs := flag.NewFlagSet("regionsim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config
	var rtt string
	var sweep bool
	c.flags(fs)
	fs.StringVar(&rtt, "rtt", "50ms", "round trip to the coordinator: one duration for all regions, or one per region, comma-separated")
	fs.BoolVar(&sweep, "sweep", false, "run the sweep (regions 2, 3, 5 x rtt 50ms, 150ms x -mixes x fault) and print one row each")
	if err := fs.Parse(args); err != nil {
		return c, false, err
	}
	probs := c.parseRTT(rtt)
	probs = append(probs, c.check()...)
	if len(probs) > 0 {
		for _, p := range probs {
			fmt.Fprintln(stderr, "regionsim:", p)
		}
		return c, false, fmt.Errorf("bad flags")
	}
	return c, sweep, nil
}

// flags defines c's flags on fs.
func (c *config) flags(fs *flag.FlagSet) {
	fs.IntVar(&c.regions, "regions", 3, "regions sharing the global limit")
	fs.IntVar(&c.nodes, "nodes", 1, "nodes in each region, each deciding and running its rounds")
	fs.Int64Var(&c.limit, "limit", 10000, "the global limit L, a window")
	fs.DurationVar(&c.window, "window", time.Minute, "the fixed window")
	fs.IntVar(&c.windows, "windows", 5, "windows simulated")
	fs.Float64Var(&c.demand, "demand", 1.5, "all regions' demand together, in multiples of L a window")
	fs.StringVar(&c.mix, "mix", "even", "how the demand splits: even, hot (region 0 has -hotshare), shift (even, the last region quiet from half time) or one (region 0 only)")
	fs.Float64Var(&c.hotShare, "hotshare", 0.9, "region 0's share of the demand under -mix hot")
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
	fs.StringVar(&c.mixes, "mixes", "even,hot,shift,one", "-sweep: the mixes swept, comma-separated")
}

// parseRTT reads -rtt into c.rtt.
func (c *config) parseRTT(rtt string) (probs []string) {
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
	return probs
}

// check lists what is wrong with c's flags.
func (c *config) check() (probs []string) {
	probs = c.checkRanges()
	if !slices.Contains(mixes, c.mix) {
		probs = append(probs, fmt.Sprintf("-mix %q: want even, hot, shift or one", c.mix))
	}
	for _, m := range strings.Split(c.mixes, ",") {
		if !slices.Contains(mixes, m) {
			probs = append(probs, fmt.Sprintf("-mixes: %q: want even, hot, shift or one", m))
		}
	}
	for _, e := range []struct {
		flag, v string
		ok      []string
	}{{"grant", c.grant, []string{"half", "all"}}, {"loop", c.loop, []string{"built", "design"}}, {"fault", c.fault, []string{"none", "cut", "crash"}}} {
		if !slices.Contains(e.ok, e.v) {
			probs = append(probs, fmt.Sprintf("-%s %q: want %s", e.flag, e.v, strings.Join(e.ok, " or ")))
		}
	}
	return probs
}

// checkRanges lists c's numbers out of their ranges.
func (c *config) checkRanges() (probs []string) {
	if c.regions < 1 || c.nodes < 1 || c.limit < int64(c.regions) || c.window <= 0 || c.windows < 1 || c.demand < 0 || c.tau <= 0 || c.estimate < 1 || c.timeout <= 0 {
		probs = append(probs, "-regions, -nodes, -window, -windows, -tau, -estimate and -timeout must be positive, -limit at least -regions, -demand not negative")
	}
	if c.hotShare < 0 || c.hotShare > 1 || c.jitter < 0 || c.jitter >= 1 || c.headroom < 0 || c.minHead < 0 || c.threshold < 0 {
		probs = append(probs, "-hotshare between 0 and 1, -jitter in [0, 1), -headroom, -minheadroom and -threshold not negative")
	}
	return probs
}

var mixes = []string{"even", "hot", "shift", "one"}

// defaults fills what zero means.
func (c config) defaults() config {
	if c.nodes == 0 {
		c.nodes = 1
	}
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
