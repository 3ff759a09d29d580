package sluice

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/base/algo"
)

// Algorithm names a rate limiting algorithm. The zero value is FixedWindow,
// the default of envoyproxy/ratelimit.
type Algorithm uint8

// The seven algorithms. docs/concepts.md says when to choose which.
const (
	FixedWindow   = Algorithm(algo.FixedWindow)
	TokenBucket   = Algorithm(algo.TokenBucket)
	LeakyBucket   = Algorithm(algo.LeakyBucket)
	GCRA          = Algorithm(algo.GCRA)
	SlidingWindow = Algorithm(algo.SlidingWindow)
	SlidingLog    = Algorithm(algo.SlidingLog)
	Sketch        = Algorithm(algo.Sketch)
)

// Concurrency is not a rate but a cap on what is in flight: a key holds at
// most Rate permits at once, each of which lives Period after it was
// acquired or last renewed, unless released first. A hit of cost 1
// acquires its Hit.Permit; most callers want Limiter.Acquire or
// Limiter.Hold, which make the permit's ID and release it. Burst, the
// refill interval, soft and elastic margins, block_for, debit, global,
// window offsets, sketch settings and leases do not apply (Validate
// refuses them); Shadow does. A store shared by many nodes (Redis) caps
// the permits of a key across all of them; docs/internals/concurrency.md
// has the bound and its argument. Its String is "concurrency".
const Concurrency = Algorithm(algo.Concurrency)

// String returns the algorithm's name as the rules spell it:
// "fixed_window", "token_bucket", ...
func (a Algorithm) String() string { return algo.Kind(a).String() }

// Bounds on input. Anything outside them is rejected with an error before a
// store sees it.
const (
	MaxKeyLen = 4096    // bytes in a key
	MaxCost   = 1 << 40 // hits in one request
	MaxHits   = 64      // limits decided together in one request
)

// Never is the RetryAfter of a request that can never be allowed, such as a
// cost above the burst or any request against a zero limit.
const Never = time.Duration(algo.Never)

// Limit says what to enforce: Rate requests per Period with the given
// algorithm. The zero value of every optional field means "off" or
// "default", as its comment says.
type Limit struct {
	// Name identifies the limit in decisions, metrics and traces. Optional.
	Name string

	// Algorithm defaults to FixedWindow.
	Algorithm Algorithm

	// Rate is the number of requests per Period. Zero blocks everything.
	// For Concurrency, the most permits a key holds at once (at most
	// 1<<20).
	Rate int64

	// Period is the length of the window, or the time over which a bucket
	// refills Rate tokens. Required. For Concurrency, how long a permit
	// lives after it is acquired or renewed (rounded up to a whole
	// millisecond).
	Period time.Duration

	// Burst is the capacity of a TokenBucket, LeakyBucket or GCRA.
	// Zero means equal to Rate. Ignored by the window algorithms.
	Burst int64

	// WindowOffset shifts the windows of a FixedWindow or SlidingWindow
	// from the Unix epoch: they start WindowOffset past a multiple of
	// Period (0 <= WindowOffset < Period). Zero means aligned to the
	// epoch, as Envoy's. Calendar periods (a month from its anchor day in
	// a time zone) are limits whose Period is the period's length and
	// whose offset puts a window's start on the period's. A limit with an
	// offset keeps its state under its key whatever its Period and offset,
	// so that a sliding window weighs the period before although months
	// differ in length: give limits of different periods different keys.
	WindowOffset time.Duration

	// RefillInterval switches a TokenBucket from smooth refill to discrete
	// refill: every RefillInterval, Rate*RefillInterval/Period tokens are
	// added at once (which must be a whole number). Refill steps are aligned
	// to the Unix epoch. Zero means smooth refill.
	RefillInterval time.Duration

	// SoftPercent admits up to this percentage over the limit. Decisions
	// still report the configured limit, and Remaining never goes below 0.
	SoftPercent int

	// ElasticCeiling lets a key exceed its limit up to this many requests
	// per period (burst, for the bucket algorithms) provided the domain-wide
	// capacity limit decided in the same request admits it. Zero means off.
	ElasticCeiling int64

	// BlockFor, after this limit denies a key, denies that key for this long
	// whatever the algorithm says. Zero means off.
	BlockFor time.Duration

	// Shadow evaluates and reports the limit but never lets it deny the
	// request. A shadow limit that would deny consumes nothing.
	Shadow bool

	// Debit marks a limit charged after the fact (Envoy's
	// apply_on_stream_done: checked with a cost of 0, charged the real cost
	// when the response ends). Decided one by one (Limiter.TakeEach), every
	// charge is counted, past the limit and into a debt too, since it is
	// what was spent, so that the next check denies until the debt is paid
	// (algo.Params.Debit). Without Debit, a fixed window counts a charge
	// that finds it exhausted but not one that finds it in debt, and a
	// bucket or sliding limit counts neither, so that a denied client
	// digs no hole.
	Debit bool

	// Global marks a FixedWindow shared by every region of a deployment:
	// a store wrapped by the region tier (sluice serve --region) decides
	// it from this region's allocation of Rate, granted by the regions'
	// coordinator, instead of from all of it. Other stores ignore it.
	Global bool

	// Sketch configures the count-min sketch of a Sketch limit.
	Sketch SketchConfig

	// LeaseOvershoot lets a lease store (package lease) decide this limit
	// from local leases, trading exactness for Redis calls within this
	// bound, in hits: on a bucket algorithm, no interval admits more than
	// this many hits beyond what the limit alone admits; on a window, none
	// is admitted beyond the limit, and at most this many sit unspent in
	// leases (and so may be denied early). Zero means no lease: every
	// decision asks the store. Not for sliding_log and sketch.
	LeaseOvershoot int64
}

// SketchConfig sizes the count-min sketch of a Sketch limit. With width w and
// depth d, an estimate exceeds the true count by more than (e/w)·N (N: all
// hits of the limit in the window) with probability at most e^-d. It never
// under-estimates, so it never admits more than the limit.
type SketchConfig struct {
	Width int // counters per row; zero means 2048
	Depth int // rows; zero means 4
}

// Validate reports every problem with l, or nil.
func (l *Limit) Validate() error {
	var p problems
	l.checkCounts(&p)
	l.checkExtras(&p)
	if len(p) == 0 {
		params := l.params()
		if err := params.Validate(); err != nil {
			p = append(p, err)
		}
	}
	return errors.Join(p...)
}

// problems gathers the problems of a limit.
type problems []error

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Errorf(format, args...)) }

// checkCounts checks the algorithm, rate, period and burst.
func (l *Limit) checkCounts(p *problems) {
	if l.Algorithm > Concurrency {
		p.add("unknown algorithm %d", l.Algorithm)
	}
	if l.Rate < 0 {
		p.add("rate must not be negative, got %d", l.Rate)
	}
	if l.Rate > MaxCost {
		p.add("rate %d is too large (at most %d)", l.Rate, int64(MaxCost))
	}
	if l.Period <= 0 {
		p.add("period must be positive, got %s", l.Period)
	}
	if l.Burst < 0 || l.Burst > MaxCost {
		p.add("burst must be between 0 and %d, got %d", int64(MaxCost), l.Burst)
	}
	if l.Burst != 0 && !l.isBucket() {
		p.add("burst applies only to token_bucket, leaky_bucket and gcra, not %s", l.Algorithm)
	}
	if l.RefillInterval < 0 {
		p.add("refill interval must not be negative, got %s", l.RefillInterval)
	}
	if l.RefillInterval > 0 && l.Algorithm != TokenBucket {
		p.add("refill interval applies only to token_bucket, not %s", l.Algorithm)
	}
}

// checkExtras checks the optional settings: soft and elastic margins,
// block_for, leases and the sketch.
func (l *Limit) checkExtras(p *problems) {
	if l.SoftPercent < 0 || l.SoftPercent > algo.MaxSoftPercent {
		p.add("soft percent must be between 0 and %d, got %d", algo.MaxSoftPercent, l.SoftPercent)
	}
	if l.ElasticCeiling < 0 || l.ElasticCeiling > MaxCost {
		p.add("elastic ceiling must be between 0 and %d, got %d", int64(MaxCost), l.ElasticCeiling)
	} else if l.ElasticCeiling > 0 && l.ElasticCeiling < l.nominal() {
		p.add("elastic ceiling %d is below the limit %d", l.ElasticCeiling, l.nominal())
	}
	if l.BlockFor < 0 {
		p.add("block_for must not be negative, got %s", l.BlockFor)
	}
	if l.LeaseOvershoot < 0 || l.LeaseOvershoot > MaxCost {
		p.add("lease overshoot must be between 0 and %d, got %d", int64(MaxCost), l.LeaseOvershoot)
	} else if l.LeaseOvershoot > 0 && (l.Algorithm == SlidingLog || l.Algorithm == Sketch) {
		p.add("%s cannot be decided from leases", l.Algorithm)
	}
	if l.Algorithm == Concurrency {
		l.checkConcurrency(p)
	}
	if l.Sketch != (SketchConfig{}) {
		if l.Algorithm != Sketch {
			p.add("sketch settings apply only to the sketch algorithm, not %s", l.Algorithm)
		}
		w, d := l.sketchDims()
		if w < 1 || d < 1 || w*d > algo.MaxSketchCells {
			p.add("sketch width and depth must be positive with width*depth at most %d, got %dx%d", algo.MaxSketchCells, w, d)
		}
	}
}

// checkConcurrency checks what a Concurrency limit refuses: every
// setting of a rate's.
func (l *Limit) checkConcurrency(p *problems) {
	if l.Rate > algo.MaxPermits {
		p.add("a concurrency limit holds at most %d permits a key, got %d", algo.MaxPermits, l.Rate)
	}
	for _, x := range []struct {
		set  bool
		what string
	}{
		{l.SoftPercent != 0, "a soft percent"},
		{l.ElasticCeiling != 0, "an elastic ceiling"},
		{l.BlockFor != 0, "block_for"},
		{l.LeaseOvershoot != 0, "leases (a lease overshoot)"},
		{l.Debit, "debit"},
		{l.Global, "global"},
		{l.WindowOffset != 0, "a window offset"},
	} {
		if x.set {
			p.add("a concurrency limit takes no %s: it counts permits held, not a rate", x.what)
		}
	}
}

// plain reports, cheaply and without building errors, that l is a valid
// limit without extras: it implies Validate() == nil. Limiter checks it on
// every call and runs the full Validate only when it is false.
func (l *Limit) plain() bool {
	if l.Algorithm == Concurrency {
		return l.plainConcurrency()
	}
	return l.Algorithm <= Sketch && l.Period > 0 &&
		l.Rate >= 0 && l.Rate <= algo.MaxSlidingWindowCapacity &&
		l.Burst >= 0 && l.Burst <= algo.MaxSlidingWindowCapacity && (l.Burst == 0 || l.isBucket()) &&
		l.RefillInterval == 0 && l.SoftPercent == 0 && l.ElasticCeiling == 0 &&
		l.BlockFor >= 0 && l.Sketch == SketchConfig{} && l.LeaseOvershoot == 0 && l.WindowOffset == 0
}

// plainConcurrency is plain for a Concurrency limit, which takes none of
// a rate's settings.
func (l *Limit) plainConcurrency() bool {
	return l.Period > 0 && l.Rate >= 0 && l.Rate <= algo.MaxPermits && l.Burst == 0 &&
		l.RefillInterval == 0 && l.SoftPercent == 0 && l.ElasticCeiling == 0 && l.BlockFor == 0 &&
		!l.Debit && !l.Global && l.WindowOffset == 0 && l.Sketch == SketchConfig{} && l.LeaseOvershoot == 0
}

func (l *Limit) isBucket() bool {
	return l.Algorithm == TokenBucket || l.Algorithm == LeakyBucket || l.Algorithm == GCRA
}

// nominal is the capacity the limit reports: the burst for bucket
// algorithms, the rate for window algorithms.
func (l *Limit) nominal() int64 { return algo.Nominal(algo.Kind(l.Algorithm), l.Rate, l.Burst) }

func (l *Limit) sketchDims() (w, d int) {
	return algo.SketchDims(l.Sketch.Width, l.Sketch.Depth)
}

// params compiles l for the algo package: the enforced capacity includes
// the soft or elastic margin (algo.Capacity). Package internal/vocab/limits gives
// the stores the same (TestParamsAgree holds the two equal).
func (l *Limit) params() algo.Params {
	return algo.LimitParams(algo.Kind(l.Algorithm), l.Rate, int64(l.Period), l.nominal(), l.SoftPercent, l.ElasticCeiling, int64(l.RefillInterval), int64(l.WindowOffset), l.Debit)
}
