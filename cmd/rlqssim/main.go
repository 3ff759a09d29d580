// Command rlqssim replays uneven demand from many Envoys for one quota
// bucket through sluice's Rate Limit Quota Service (package rlqs: the
// server's own matching, demand estimates, shares and token buckets), on a
// virtual clock, with each Envoy enforcing what it is assigned as Envoy's
// filter does (internal/edges/envoyquota), and reports what docs/leases.md
// bounds: the rates the Envoys enforce together against the limit, the
// admitted hits against the bound, how fairly the admitted hits follow
// max-min fair shares of the demand, and how soon the shares of killed
// streams go to the others.
//
//	go run ./cmd/rlqssim -envoys 16 -rate 1000 -period 1s -demand 1.5
//	go run ./cmd/rlqssim -envoys 64 -rate 60000 -period 1m -skew 0.5 -kill 0.25
//
// Envoy i's share of the demand is proportional to 1/(r+1)^skew, where r
// is its rank, and the ranks rotate every -phase, so the hot Envoys
// change. Each Envoy reports every -interval (at its own offset), and each
// answer reaches it after a random delay of up to -delay (at most the
// server's grace). At half time, -kill of the Envoys lose their streams:
// they go on serving with what they were assigned until it expires, then
// deny (their expired_assignment_behavior), and report no more.
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
	"time"

	"github.com/sluicehq/sluice/internal/base/fairshare"

	"github.com/sluicehq/sluice/internal/base/algo"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/edges/envoyquota"
	"github.com/sluicehq/sluice/internal/edges/rlqs"
	"github.com/sluicehq/sluice/rules"
)

// config is one simulation.
type config struct {
	envoys    int
	algorithm string
	rate      int64
	period    time.Duration
	burst     int64
	demand    float64 // all Envoys together, in multiples of the limit's rate
	skew      float64
	phase     time.Duration
	interval  time.Duration
	ttl       time.Duration
	grace     time.Duration
	delay     time.Duration
	kill      float64
	duration  time.Duration
	seed      uint64
}

// report is what a simulation measured.
type report struct {
	Asked, Admitted int64
	Bound           int64   // rate times duration, plus the burst, one token an Envoy, and every bucket started full
	Gifts           int64   // tokens of the buckets Envoys started full
	WorstRate       float64 // the most the Envoys enforced at once, a second
	WorstWindow     int64   // the most admitted in one period (aligned to the start)
	LimitRate       float64
	Fairness        float64       // Jain's index of admitted/fair over the Envoys never killed
	Reclaimed       time.Duration // from the kill until the others enforce 90% of the limit; -1: never
	Killed          int
}

func main() {
	cfg, err := parse(os.Args[1:], os.Stderr)
	if err != nil {
		os.Exit(2)
	}
	r, err := run(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rlqssim:", err)
		os.Exit(1)
	}
	r.print(os.Stdout, cfg)
}

func parse(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("rlqssim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config
	fs.IntVar(&c.envoys, "envoys", 16, "Envoys sharing the bucket")
	fs.StringVar(&c.algorithm, "algorithm", "fixed_window", "the limit's algorithm, as in a rules file")
	fs.Int64Var(&c.rate, "rate", 1000, "the limit: requests per -period")
	fs.DurationVar(&c.period, "period", time.Second, "the limit's period")
	fs.Int64Var(&c.burst, "burst", 0, "the limit's burst (bucket algorithms)")
	fs.Float64Var(&c.demand, "demand", 1.5, "all Envoys' demand together, in multiples of the limit's rate")
	fs.Float64Var(&c.skew, "skew", 1, "unevenness: Envoy of rank r asks in proportion to 1/(r+1)^skew")
	fs.DurationVar(&c.phase, "phase", 10*time.Second, "how often the ranks rotate")
	fs.DurationVar(&c.interval, "interval", time.Second, "Envoy's reporting_interval")
	fs.DurationVar(&c.ttl, "ttl", rlqs.DefaultTTL, "the server's --rlqs-ttl")
	fs.DurationVar(&c.grace, "grace", rlqs.DefaultGrace, "the server's --rlqs-grace")
	fs.DurationVar(&c.delay, "delay", 0, "the longest an answer takes to reach its Envoy (default: the grace)")
	fs.Float64Var(&c.kill, "kill", 0.25, "share of the Envoys whose streams die at half time")
	fs.DurationVar(&c.duration, "duration", time.Minute, "simulated time")
	fs.Uint64Var(&c.seed, "seed", 1, "random seed")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.delay == 0 {
		c.delay = c.grace
	}
	var probs []string
	if c.envoys < 1 || c.rate < 1 || c.period <= 0 || c.demand < 0 || c.interval <= 0 || c.duration <= 0 || c.phase <= 0 {
		probs = append(probs, "-envoys, -rate, -period, -interval, -phase and -duration must be positive, -demand not negative")
	}
	if c.ttl <= c.interval {
		probs = append(probs, "-ttl must exceed -interval, or assignments expire between reports")
	}
	if c.delay > c.grace {
		probs = append(probs, "-delay beyond -grace is outside the bound's assumption")
	}
	if c.kill < 0 || c.kill > 1 {
		probs = append(probs, "-kill is a share, between 0 and 1")
	}
	if len(probs) > 0 {
		for _, p := range probs {
			fmt.Fprintln(stderr, "rlqssim:", p)
		}
		return c, fmt.Errorf("bad flags")
	}
	return c, nil
}

// envoy is one simulated Envoy.
type envoy struct {
	bucket          envoyquota.Bucket
	stream          *rlqs.Stream
	weight          float64
	nextReport      time.Duration
	allowed, denied uint64
	asked, admitted int64
	fair            float64 // what max-min fair shares of the demand would have admitted
	killed          bool
	inbox           []delivery
}

type delivery struct {
	at  time.Duration
	act *rlqsv3.RateLimitQuotaResponse_BucketAction
}

const step = 5 * time.Millisecond

// sim is one simulation under way: the server and its Envoys on a virtual
// clock, and what has been measured so far.
type sim struct {
	c         config
	srv       *rlqs.Server
	limit     *sluice.Limit
	limitRate float64 // the limit's rate, a second
	rng       *rand.Rand
	base      time.Time
	now       time.Duration     // virtual time since base
	bucket    map[string]string // the bucket every Envoy reports
	es        []*envoy
	demands   []float64 // each Envoy's demand at this step, a second
	killAt    time.Duration
	window    int64 // admitted in the current period
	r         report
}

func run(c config) (report, error) {
	s, err := newSim(c)
	if err != nil {
		return report{}, err
	}
	ctx := context.Background()
	for s.now = 0; s.now < c.duration; s.now += step {
		if err := s.step(ctx); err != nil {
			return s.r, err
		}
	}
	return s.finish(), nil
}

// newSim compiles the one rule the Envoys share, starts a server on the
// virtual clock and opens a stream for each Envoy, each reporting at its
// own offset.
func newSim(c config) (*sim, error) {
	burst := ""
	if c.burst > 0 {
		burst = fmt.Sprintf(", burst: %d", c.burst)
	}
	src := fmt.Sprintf("domain: sim\ndescriptors:\n  - key: tenant\n    rate_limit: {algorithm: %s, requests_per_unit: %d, period: %s%s}\n",
		c.algorithm, c.rate, c.period, burst)
	dom, err := rules.Parse("sim.yaml", []byte(src))
	if err != nil {
		return nil, err
	}
	cfg, err := rules.NewConfig(dom)
	if err != nil {
		return nil, err
	}
	s := &sim{c: c, base: time.Unix(1_800_000_000, 0), killAt: c.duration / 2, bucket: map[string]string{"tenant": "acme"}}
	policy := rlqs.PolicyDefaults(rlqs.Policy{TTL: c.ttl, Grace: c.grace})
	s.srv, err = rlqs.New(rlqs.Config{Rules: func() *rules.Config { return cfg }, Policy: policy,
		Pools: rlqs.NewMemPools(policy, s.clock), Now: s.clock})
	if err != nil {
		return nil, err
	}
	s.limit = dom.Rules[0].Limits[0]
	s.limitRate = float64(s.limit.Rate) / s.limit.Period.Seconds()
	s.rng = rand.New(rand.NewPCG(c.seed, 3))
	s.es = make([]*envoy, c.envoys)
	for i := range s.es {
		s.es[i] = &envoy{stream: s.srv.NewStream(), nextReport: time.Duration(s.rng.Int64N(int64(c.interval)))}
	}
	s.demands = make([]float64, len(s.es))
	s.r = report{LimitRate: s.limitRate, Reclaimed: -1}
	s.weigh(0)
	return s, nil
}

// clock is the virtual clock, for the server and the Envoys' buckets.
func (s *sim) clock() time.Time { return s.base.Add(s.now) }

// weigh gives each Envoy its share of the demand for rotation rot: the
// Envoy of rank r asks in proportion to 1/(r+1)^skew.
func (s *sim) weigh(rot int) {
	sum := 0.0
	for i, e := range s.es {
		r := (i + rot) % len(s.es)
		e.weight = 1 / math.Pow(float64(r+1), s.c.skew)
		sum += e.weight
	}
	for _, e := range s.es {
		e.weight /= sum
	}
}

// step advances the simulation by one step: a new period or phase, the
// kill at half time, then the answers that arrive, the requests, the fair
// shares, the reports and what the Envoys enforce, in that order.
func (s *sim) step(ctx context.Context) error {
	if s.now > 0 && s.now%s.limit.Period == 0 {
		s.r.WorstWindow, s.window = max(s.r.WorstWindow, s.window), 0
	}
	if s.now > 0 && s.now%s.c.phase == 0 {
		s.weigh(int(s.now / s.c.phase))
	}
	t := s.clock()
	if s.now == s.killAt {
		s.killStreams()
	}
	s.deliver(t)
	s.ask(t)
	alive := s.accrueFair()
	if err := s.sendReports(ctx); err != nil {
		return err
	}
	s.measureEnforced(t, alive)
	return nil
}

// killStreams ends the streams of the first -kill of the Envoys.
func (s *sim) killStreams() {
	for i := range int(math.Round(s.c.kill * float64(len(s.es)))) {
		s.es[i].killed = true
		s.r.Killed++
	}
}

// deliver applies to each Envoy's bucket the answers that have reached it.
func (s *sim) deliver(t time.Time) {
	for _, e := range s.es {
		for len(e.inbox) > 0 && e.inbox[0].at <= s.now {
			e.bucket.Apply(e.inbox[0].act, t)
			e.inbox = e.inbox[1:]
		}
	}
}

// ask sends each Envoy its requests of this step, Poisson at its demand,
// and lets its bucket admit or deny them.
func (s *sim) ask(t time.Time) {
	for i, e := range s.es {
		d := s.c.demand * s.limitRate * e.weight
		s.demands[i] = d
		for n := poisson(s.rng, d*step.Seconds()); n > 0; n-- {
			e.asked++
			if e.bucket.Allow(t) {
				e.admitted++
				s.window++
				e.allowed++
			} else {
				e.denied++
			}
		}
	}
}

// accrueFair adds to each Envoy still reporting what max-min fair shares
// of the true demand would admit in this step, and returns the demands of
// those Envoys.
func (s *sim) accrueFair() (alive []float64) {
	alive = make([]float64, 0, len(s.es))
	for i, e := range s.es {
		if !e.killed {
			alive = append(alive, s.demands[i])
		}
	}
	fair := fairshare.MaxMin(alive, s.limitRate)
	k := 0
	for _, e := range s.es {
		if !e.killed {
			e.fair += fair[k] * step.Seconds()
			k++
		}
	}
	return alive
}

// sendReports sends the usage of each Envoy whose report is due and queues the
// server's answers for delivery after a random delay.
func (s *sim) sendReports(ctx context.Context) error {
	for _, e := range s.es {
		if e.killed || s.now < e.nextReport {
			continue
		}
		e.nextReport = s.now + s.c.interval
		rep := &rlqsv3.RateLimitQuotaUsageReports{Domain: "sim", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
			BucketId:           &rlqsv3.BucketId{Bucket: s.bucket},
			TimeElapsed:        durationpb.New(s.c.interval.Truncate(time.Second)),
			NumRequestsAllowed: e.allowed, NumRequestsDenied: e.denied,
		}}}
		e.allowed, e.denied = 0, 0
		resp, err := s.srv.Report(ctx, e.stream, rep)
		if err != nil {
			return err
		}
		// A stream delivers in order: an answer never overtakes the
		// one before it.
		at := s.now + time.Duration(s.rng.Int64N(int64(s.c.delay)+1))
		if n := len(e.inbox); n > 0 {
			at = max(at, e.inbox[n-1].at)
		}
		for _, a := range resp.GetBucketAction() {
			e.inbox = append(e.inbox, delivery{at: at, act: a})
		}
	}
	return nil
}

// measureEnforced records the rate the Envoys enforce together, and how
// soon after the kill the others enforce 90% of the limit (when the
// demand of those still reporting reaches it).
func (s *sim) measureEnforced(t time.Time, alive []float64) {
	total, others := 0.0, 0.0
	for _, e := range s.es {
		rt := e.bucket.Rate(t)
		total += rt
		if !e.killed {
			others += rt
		}
	}
	s.r.WorstRate = max(s.r.WorstRate, total)
	if s.r.Killed > 0 && s.now >= s.killAt && s.r.Reclaimed < 0 && others >= 0.9*s.limitRate && sum(alive) >= 0.9*s.limitRate {
		s.r.Reclaimed = s.now - s.killAt
	}
}

// finish closes the last period and sums up the Envoys: the hits asked
// and admitted, the bound, and the fairness over the Envoys never killed.
func (s *sim) finish() report {
	r := s.r
	if s.now%s.limit.Period == 0 {
		r.WorstWindow = max(r.WorstWindow, s.window)
	}
	var xs []float64
	for _, e := range s.es {
		r.Asked += e.asked
		r.Admitted += e.admitted
		r.Gifts += e.bucket.Gifts
		if !e.killed && e.fair > 0 {
			xs = append(xs, float64(e.admitted)/e.fair)
		}
	}
	r.Fairness = jain(xs)
	r.Bound = int64(s.limitRate*s.c.duration.Seconds()) + algo.Nominal(algo.Kind(s.limit.Algorithm), s.limit.Rate, s.limit.Burst) + int64(s.c.envoys) + r.Gifts
	return r
}

func sum(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s
}

// jain is Jain's fairness index: 1 when all xs are equal.
func jain(xs []float64) float64 {
	if len(xs) == 0 {
		return 1
	}
	s, sq := 0.0, 0.0
	for _, x := range xs {
		s += x
		sq += x * x
	}
	if sq == 0 {
		return 1
	}
	return s * s / (float64(len(xs)) * sq)
}

// poisson draws from a Poisson distribution of mean m (Knuth's method for
// small means, a normal approximation above 30).
func poisson(rng *rand.Rand, m float64) int {
	if m <= 0 {
		return 0
	}
	if m > 30 {
		return max(0, int(math.Round(m+math.Sqrt(m)*rng.NormFloat64())))
	}
	l, k, p := math.Exp(-m), 0, 1.0
	for {
		p *= rng.Float64()
		if p <= l {
			return k
		}
		k++
	}
}

func (r report) print(w io.Writer, c config) {
	fmt.Fprintf(w, "%d Envoys, %s %d per %s (burst %d), RLQS ttl %s grace %s, reports every %s, answers delayed up to %s\n",
		c.envoys, c.algorithm, c.rate, c.period, c.burst, c.ttl, c.grace, c.interval, c.delay)
	fmt.Fprintf(w, "demand %.2fx the rate, skew %.2f, ranks rotate every %s, %s simulated, %d streams killed at half time, seed %d\n\n",
		c.demand, c.skew, c.phase, c.duration, r.Killed, c.seed)
	row := func(k, v string) { fmt.Fprintf(w, "%-46s %s\n", k, v) }
	row("asked", strconv.FormatInt(r.Asked, 10))
	row("admitted", fmt.Sprintf("%d (bound %d: within %v)", r.Admitted, r.Bound, r.Admitted <= r.Bound))
	row("admitted a second, of the limit's rate", fmt.Sprintf("%.3f", float64(r.Admitted)/c.duration.Seconds()/r.LimitRate))
	row("most admitted in one period (aligned)", fmt.Sprintf("%d of %d", r.WorstWindow, c.rate))
	row("buckets started full (tokens)", strconv.FormatInt(r.Gifts, 10))
	row("most enforced at once, a second", fmt.Sprintf("%.1f of %.1f (within: %v)", r.WorstRate, r.LimitRate, r.WorstRate <= r.LimitRate*(1+1e-9)))
	row("fairness (Jain, admitted/max-min fair)", fmt.Sprintf("%.3f", r.Fairness))
	reclaimed := "never (or the others ask less than 90%)"
	if r.Reclaimed >= 0 {
		reclaimed = r.Reclaimed.String()
	}
	if r.Killed == 0 {
		reclaimed = "no stream killed"
	}
	row("killed streams' shares reclaimed (90%) after", reclaimed)
}
