// Command leasesim replays uneven demand for one key across many nodes that
// decide it from leases (package lease) over one shared store, on a
// virtual clock, and reports what docs/leases.md bounds: the overshoot
// against the lease bound, the store calls per decision, and how fairly
// the admitted hits follow each node's demand.
//
//	go run ./cmd/leasesim -nodes 16 -algorithm gcra -rate 1000 -period 1s -burst 100 -overshoot 400
//	go run ./cmd/leasesim -nodes 64 -algorithm fixed_window -rate 60000 -period 1m -overshoot 1% -demand 1.5
//
// Demand is a Poisson process per node; node i's share of it is
// proportional to 1/(i+1)^skew (skew 0: even; 1: Zipf), so a few nodes
// are hot and many are cold. Every -phase, the demand pauses for a tenth of
// a phase (leases sit while the bucket refills) then comes back at
// -burstx times its rate for another tenth: the pattern that shows the
// overshoot a lease bound allows.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memstore"
)

// config is one simulation.
type config struct {
	nodes     int
	algorithm sluice.Algorithm
	rate      int64
	period    time.Duration
	burst     int64
	overshoot string // hits, or a percentage of rate
	demand    float64
	skew      float64
	duration  time.Duration
	phase     time.Duration
	burstx    float64
	seed      uint64
}

// report is what a simulation measured.
type report struct {
	Asked, Admitted int64
	Calls           int64   // calls to the shared store
	Expired         int64   // hits granted that expired unspent
	Bound           int64   // the lease bound U, in hits
	Excess          float64 // worst admitted beyond the limit's own bound, in any interval (buckets) or window (windows)
	Fairness        float64 // Jain's index of admitted/asked over the nodes that asked
	HotShare        float64 // share of the admitted that went to the hottest node
	HotAsked        float64 // share of the asks that came from it
}

func main() {
	cfg, err := parse(os.Args[1:], os.Stderr)
	if err != nil {
		os.Exit(2)
	}
	r, err := run(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "leasesim:", err)
		os.Exit(1)
	}
	r.print(os.Stdout, cfg)
}

func parse(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("leasesim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config
	var alg string
	fs.IntVar(&c.nodes, "nodes", 16, "nodes deciding the key, each with its own leases")
	fs.StringVar(&alg, "algorithm", "gcra", "the limit's algorithm: gcra, token_bucket, leaky_bucket, fixed_window or sliding_window")
	fs.Int64Var(&c.rate, "rate", 1000, "the limit's rate per period")
	fs.DurationVar(&c.period, "period", time.Second, "the limit's period")
	fs.Int64Var(&c.burst, "burst", 0, "the limit's burst (bucket algorithms; 0: the rate)")
	fs.StringVar(&c.overshoot, "overshoot", "10%", "the lease bound U: hits, or a percentage of the rate per period")
	fs.Float64Var(&c.demand, "demand", 0.8, "total demand, as a multiple of the limit's rate")
	fs.Float64Var(&c.skew, "skew", 1, "unevenness of demand over nodes: node i asks in proportion to 1/(i+1)^skew")
	fs.DurationVar(&c.duration, "duration", time.Minute, "virtual time simulated")
	fs.DurationVar(&c.phase, "phase", 500*time.Millisecond, "length of a demand cycle: steady, a pause, a burst")
	fs.Float64Var(&c.burstx, "burstx", 10, "demand in a burst, as a multiple of the steady demand")
	fs.Uint64Var(&c.seed, "seed", 1, "random seed")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	k, err := parseAlgorithm(alg)
	if err != nil {
		fmt.Fprintln(stderr, "leasesim:", err)
		return c, err
	}
	c.algorithm = k
	if c.nodes < 1 || c.rate < 1 || c.period <= 0 || c.demand <= 0 || c.duration <= 0 || c.phase <= 0 || c.burstx < 1 {
		err := fmt.Errorf("-nodes, -rate, -period, -demand, -duration, -phase must be positive and -burstx at least 1")
		fmt.Fprintln(stderr, "leasesim:", err)
		return c, err
	}
	return c, nil
}

func parseAlgorithm(s string) (sluice.Algorithm, error) {
	for _, k := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyBucket, sluice.FixedWindow, sluice.SlidingWindow} {
		if k.String() == s {
			return k, nil
		}
	}
	return 0, fmt.Errorf("-algorithm %q: want gcra, token_bucket, leaky_bucket, fixed_window or sliding_window", s)
}

// bound reads -overshoot against the rate.
func bound(s string, rate int64) (int64, error) {
	if p, ok := strings.CutSuffix(s, "%"); ok {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil || f < 0 || f > 100 {
			return 0, fmt.Errorf("-overshoot %q: not a percentage", s)
		}
		return int64(math.Ceil(f / 100 * float64(rate))), nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("-overshoot %q: not a count of hits or a percentage", s)
	}
	return n, nil
}

// counting counts the calls to the shared store.
type counting struct {
	sluice.Store
	calls int64
}

func (c *counting) Take(ctx context.Context, h []sluice.Hit, o []sluice.Decision) error {
	c.calls++
	return c.Store.Take(ctx, h, o)
}

func run(c config) (report, error) {
	l, err := c.limit()
	if err != nil {
		return report{}, err
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	mem := memstore.New(memstore.Config{Now: func() time.Time { return now }, SweepInterval: -1})
	defer mem.Close()
	shared := &counting{Store: mem}
	nodes := make([]*lease.Store, c.nodes)
	for i := range nodes {
		nodes[i] = lease.New(shared, lease.Config{Now: func() time.Duration { return now.Sub(start) }, Go: func(f func()) { f() }})
	}
	rng := rand.New(rand.NewPCG(c.seed, 0x1ea5e))
	pick := c.picker(rng)
	steady := c.demand * float64(c.rate) / c.period.Seconds() // asks a second, all nodes
	asked := make([]int64, c.nodes)
	admitted := make([]int64, c.nodes)
	var log admissions
	r := report{Bound: l.LeaseOvershoot}
	out := make([]sluice.Decision, 1)
	for t := time.Duration(0); t < c.duration; {
		pos := t % c.phase
		rate := c.demandAt(pos, steady)
		if rate == 0 {
			t = t - pos + c.phase*9/10
			continue
		}
		t += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		now = start.Add(t)
		i := pick()
		asked[i]++
		if err := nodes[i].Take(context.Background(), []sluice.Hit{{Key: "k", Limit: l, Cost: 1}}, out); err != nil {
			return r, err
		}
		if out[0].Allowed {
			admitted[i]++
			log = append(log, admission{t, 1})
		}
	}
	r.Calls = shared.calls
	for _, n := range nodes {
		r.Expired += n.Stats().Expired
	}
	r.Excess = excess(l, log.all)
	r.tally(asked, admitted)
	return r, nil
}

// limit is the limit the nodes share, with the lease bound -overshoot.
func (c config) limit() (*sluice.Limit, error) {
	u, err := bound(c.overshoot, c.rate)
	if err != nil {
		return nil, err
	}
	l := &sluice.Limit{Name: "sim", Algorithm: c.algorithm, Rate: c.rate, Period: c.period, LeaseOvershoot: u}
	if l.Algorithm == sluice.GCRA || l.Algorithm == sluice.TokenBucket || l.Algorithm == sluice.LeakyBucket {
		l.Burst = c.burst
	}
	if err := l.Validate(); err != nil {
		return nil, err
	}
	return l, nil
}

// picker returns the node of the next arrival. The arrivals of all nodes
// are merged into one Poisson process at the total rate, each arrival
// given to node i with probability w[i]/sum, w[i] = 1/(i+1)^skew.
func (c config) picker(rng *rand.Rand) func() int {
	w := make([]float64, c.nodes)
	var sum float64
	for i := range w {
		w[i] = 1 / math.Pow(float64(i+1), c.skew)
		sum += w[i]
	}
	return func() int {
		x := rng.Float64() * sum
		for i, wi := range w {
			if x < wi {
				return i
			}
			x -= wi
		}
		return len(w) - 1
	}
}

// demandAt is the demand, asks a second of all nodes, at pos into a
// phase: steady, then paused for its ninth tenth, then bursting for its
// last.
func (c config) demandAt(pos time.Duration, steady float64) float64 {
	switch {
	case pos >= c.phase*8/10 && pos < c.phase*9/10:
		return 0
	case pos >= c.phase*9/10:
		return steady * c.burstx
	}
	return steady
}

// admission is a hit admitted, n of them at once.
type admission struct {
	at time.Duration
	n  int64
}

// admissions are the hits admitted, in the order they were.
type admissions []admission

// all yields each admission's time and count.
func (log admissions) all(yield func(time.Duration, int64) bool) {
	for _, a := range log {
		if !yield(a.at, a.n) {
			return
		}
	}
}

// tally sums what each node asked and admitted into r: the totals, the
// fairness, and the hottest node's shares of both.
func (r *report) tally(asked, admitted []int64) {
	for i := range asked {
		r.Asked += asked[i]
		r.Admitted += admitted[i]
	}
	r.Fairness = jain(asked, admitted)
	hot := 0
	for i := range asked {
		if asked[i] > asked[hot] {
			hot = i
		}
	}
	if r.Admitted > 0 {
		r.HotShare = float64(admitted[hot]) / float64(r.Admitted)
	}
	if r.Asked > 0 {
		r.HotAsked = float64(asked[hot]) / float64(r.Asked)
	}
}

// excess is the worst number of hits admitted beyond the limit's own bound:
// for a bucket, over every interval between two admissions (the burst plus
// the rate times its length); for a window, over every window (its limit).
func excess(l *sluice.Limit, adms func(func(time.Duration, int64) bool)) float64 {
	var at []time.Duration
	var n []int64
	adms(func(t time.Duration, c int64) bool { at, n = append(at, t), append(n, c); return true })
	if l.Algorithm == sluice.FixedWindow || l.Algorithm == sluice.SlidingWindow {
		per := map[int64]int64{}
		for i, t := range at {
			per[int64(t/l.Period)] += n[i]
		}
		worst := math.Inf(-1)
		for _, c := range per {
			worst = max(worst, float64(c-l.Rate))
		}
		return worst
	}
	burst := l.Burst
	if burst == 0 {
		burst = l.Rate
	}
	perSec := float64(l.Rate) / l.Period.Seconds()
	worst := math.Inf(-1)
	// Intervals longer than it takes the rate to fill the burst twice
	// cannot hold the worst excess: it needs outstanding leases, which
	// live less than that.
	horizon := 2*float64(burst)/perSec + 1
	for i := range at {
		var sum int64
		for j := i; j < len(at); j++ {
			span := (at[j] - at[i]).Seconds()
			if span > horizon {
				break
			}
			sum += n[j]
			worst = max(worst, float64(sum)-float64(burst)-perSec*span)
		}
	}
	return worst
}

// jain is Jain's fairness index of admitted[i]/asked[i] over the nodes
// that asked: 1 when every node got the same share of what it asked.
func jain(asked, admitted []int64) float64 {
	var s, s2 float64
	var k int
	for i := range asked {
		if asked[i] == 0 {
			continue
		}
		x := float64(admitted[i]) / float64(asked[i])
		s += x
		s2 += x * x
		k++
	}
	if s2 == 0 {
		return 1
	}
	return s * s / (float64(k) * s2)
}

func (r report) print(w io.Writer, c config) {
	fmt.Fprintf(w, "%d nodes, %s %d per %s (burst %d), lease bound U = %d hits\n", c.nodes, c.algorithm, c.rate, c.period, c.burst, r.Bound)
	fmt.Fprintf(w, "demand %.2fx the rate, skew %.2f, bursts %.0fx every %s, %s simulated, seed %d\n\n", c.demand, c.skew, c.burstx, c.phase, c.duration, c.seed)
	rows := [][2]string{
		{"asked", strconv.FormatInt(r.Asked, 10)},
		{"admitted", strconv.FormatInt(r.Admitted, 10)},
		{"store calls", fmt.Sprintf("%d (%.3f a decision)", r.Calls, float64(r.Calls)/math.Max(float64(r.Asked), 1))},
		{"granted, expired unspent", strconv.FormatInt(r.Expired, 10)},
		{"worst excess over the limit's own bound", fmt.Sprintf("%.1f hits (bound: %d; within: %v)", r.Excess, r.Bound, r.Excess <= float64(r.Bound))},
		{"fairness (Jain, admitted/asked per node)", fmt.Sprintf("%.3f", r.Fairness)},
		{"hottest node: share of asks, of admitted", fmt.Sprintf("%.1f%%, %.1f%%", 100*r.HotAsked, 100*r.HotShare)},
	}
	for _, row := range rows {
		fmt.Fprintf(w, "%-44s %s\n", row[0], row[1])
	}
}
