package sluice

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"time"

	"github.com/sluicehq/sluice/internal/algo"
)

// Algorithm names a rate limiting algorithm. The zero value is FixedWindow,
// the default of envoyproxy/ratelimit.
type Algorithm = algo.Kind

// The seven algorithms. docs/algorithms.md says when to choose which.
const (
	FixedWindow   = algo.FixedWindow
	TokenBucket   = algo.TokenBucket
	LeakyBucket   = algo.LeakyBucket
	GCRA          = algo.GCRA
	SlidingWindow = algo.SlidingWindow
	SlidingLog    = algo.SlidingLog
	Sketch        = algo.Sketch
)

// Bounds on input. Anything outside them is rejected with an error before a
// store sees it.
const (
	MaxKeyLen  = 4096    // bytes in a key
	MaxCost    = 1 << 40 // hits in one request
	MaxHits    = 64      // limits decided together in one request
	MaxPercent = 1000    // SoftPercent
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
	Rate int64

	// Period is the length of the window, or the time over which a bucket
	// refills Rate tokens. Required.
	Period time.Duration

	// Burst is the capacity of a TokenBucket, LeakyBucket or GCRA.
	// Zero means equal to Rate. Ignored by the window algorithms.
	Burst int64

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
	// when the response ends). Decided one by one (Limiter.DecideEach), a
	// charge that finds it exhausted, but not in debt, is still counted, so
	// that the next check denies (algo.Params.Debit). A fixed window always
	// does so; without Debit, a bucket or sliding limit counts nothing of
	// a charge that finds it exhausted, so that a denied client digs no
	// hole.
	Debit bool

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

// Default sketch dimensions.
const (
	DefaultSketchWidth = 2048
	DefaultSketchDepth = 4
	MaxSketchCells     = 1 << 24
)

// Validate reports every problem with l, or nil.
func (l *Limit) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if l.Algorithm > Sketch {
		add("unknown algorithm %d", l.Algorithm)
	}
	if l.Rate < 0 {
		add("rate must not be negative, got %d", l.Rate)
	}
	if l.Rate > MaxCost {
		add("rate %d is too large (at most %d)", l.Rate, int64(MaxCost))
	}
	if l.Period <= 0 {
		add("period must be positive, got %s", l.Period)
	}
	if l.Burst < 0 || l.Burst > MaxCost {
		add("burst must be between 0 and %d, got %d", int64(MaxCost), l.Burst)
	}
	if l.Burst != 0 && !l.isBucket() {
		add("burst applies only to token_bucket, leaky_bucket and gcra, not %s", l.Algorithm)
	}
	if l.RefillInterval < 0 {
		add("refill interval must not be negative, got %s", l.RefillInterval)
	}
	if l.RefillInterval > 0 && l.Algorithm != TokenBucket {
		add("refill interval applies only to token_bucket, not %s", l.Algorithm)
	}
	if l.SoftPercent < 0 || l.SoftPercent > MaxPercent {
		add("soft percent must be between 0 and %d, got %d", MaxPercent, l.SoftPercent)
	}
	if l.ElasticCeiling < 0 || l.ElasticCeiling > MaxCost {
		add("elastic ceiling must be between 0 and %d, got %d", int64(MaxCost), l.ElasticCeiling)
	} else if l.ElasticCeiling > 0 && l.ElasticCeiling < l.nominal() {
		add("elastic ceiling %d is below the limit %d", l.ElasticCeiling, l.nominal())
	}
	if l.BlockFor < 0 {
		add("block_for must not be negative, got %s", l.BlockFor)
	}
	if l.LeaseOvershoot < 0 || l.LeaseOvershoot > MaxCost {
		add("lease overshoot must be between 0 and %d, got %d", int64(MaxCost), l.LeaseOvershoot)
	} else if l.LeaseOvershoot > 0 && (l.Algorithm == SlidingLog || l.Algorithm == Sketch) {
		add("%s cannot be decided from leases", l.Algorithm)
	}
	if l.Sketch != (SketchConfig{}) {
		if l.Algorithm != Sketch {
			add("sketch settings apply only to the sketch algorithm, not %s", l.Algorithm)
		}
		w, d := l.sketchDims()
		if w < 1 || d < 1 || w*d > MaxSketchCells {
			add("sketch width and depth must be positive with width*depth at most %d, got %dx%d", MaxSketchCells, w, d)
		}
	}
	if len(errs) == 0 {
		p := l.Params()
		if err := p.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// plain reports, cheaply and without building errors, that l is a valid
// limit without extras: it implies Validate() == nil. Limiter checks it on
// every call and runs the full Validate only when it is false.
func (l *Limit) plain() bool {
	return l.Algorithm <= Sketch && l.Period > 0 &&
		l.Rate >= 0 && l.Rate <= algo.MaxSlidingWindowCapacity &&
		l.Burst >= 0 && l.Burst <= algo.MaxSlidingWindowCapacity && (l.Burst == 0 || l.isBucket()) &&
		l.RefillInterval == 0 && l.SoftPercent == 0 && l.ElasticCeiling == 0 &&
		l.BlockFor >= 0 && l.Sketch == SketchConfig{} && l.LeaseOvershoot == 0
}

func (l *Limit) isBucket() bool {
	return l.Algorithm == TokenBucket || l.Algorithm == LeakyBucket || l.Algorithm == GCRA
}

// nominal is the capacity the limit reports: the burst for bucket
// algorithms, the rate for window algorithms.
func (l *Limit) nominal() int64 {
	if l.isBucket() && l.Burst > 0 {
		return l.Burst
	}
	return l.Rate
}

// Nominal returns the limit reported in decisions and headers: the burst of a
// bucket algorithm (Rate when Burst is zero), the rate of a window algorithm.
func (l *Limit) Nominal() int64 { return l.nominal() }

func (l *Limit) sketchDims() (w, d int) {
	w, d = l.Sketch.Width, l.Sketch.Depth
	if w == 0 {
		w = DefaultSketchWidth
	}
	if d == 0 {
		d = DefaultSketchDepth
	}
	return w, d
}

// SketchDims returns the width and depth of a Sketch limit's count-min
// sketch, defaults applied.
func (l *Limit) SketchDims() (width, depth int) { return l.sketchDims() }

// Params compiles l for the algo package: the enforced capacity includes the
// soft or elastic margin. Call Validate first; Params of an invalid limit is
// meaningless.
func (l *Limit) Params() algo.Params {
	capacity := l.nominal()
	if l.SoftPercent > 0 {
		// ceil(capacity * (100+soft) / 100), saturated.
		c := capacity
		if c <= math.MaxInt64/(100+MaxPercent) {
			c = (c*int64(100+l.SoftPercent) + 99) / 100
		}
		capacity = c
	}
	if l.ElasticCeiling > capacity {
		capacity = l.ElasticCeiling
	}
	return algo.Params{
		Kind:     l.Algorithm,
		Rate:     l.Rate,
		Period:   int64(l.Period),
		Capacity: capacity,
		Interval: int64(l.RefillInterval),
		Debit:    l.Debit,
	}
}

// DecisionOf turns an algorithm's result into a Decision, reporting against
// the configured limit rather than the enforced capacity. Stores call it
// (Limiter.Decide is what callers want).
func (l *Limit) DecisionOf(r algo.Result, p *algo.Params) Decision {
	nominal := l.nominal()
	remaining := r.Remaining - (p.Capacity - nominal)
	if remaining < 0 {
		remaining = 0
	}
	return Decision{
		Allowed:    r.Allowed,
		Limit:      nominal,
		Remaining:  remaining,
		ResetAfter: time.Duration(r.ResetAfter),
		RetryAfter: time.Duration(r.RetryAfter),
		Over:       r.Allowed && r.Remaining < p.Capacity-nominal,
		Overdrawn:  r.Overdrawn,
	}
}

// MoreAfter returns how long after d, a decision of l, l has more quota
// than d.Remaining, if nothing is consumed meanwhile: on a denial, when
// the denied request would be admitted (d.RetryAfter, unless Never);
// otherwise when a request of cost d.Remaining+1 would be (see
// algo.AvailableAfter). It is exact for a fixed window (the end of its
// window, d.ResetAfter), the bucket algorithms and every denial; for an
// admitted request on a sliding window, sliding log or sketch it is a
// time by which more quota has surely come, which may be later than the
// first time it does. Never for a limit other than a fixed window that
// admits nothing; 0 when d's Remaining is already the whole limit. Front
// doors tell it to clients as the RateLimit field's t.
func (l *Limit) MoreAfter(d Decision) time.Duration {
	if !d.Allowed && d.RetryAfter > 0 && d.RetryAfter < Never {
		return d.RetryAfter
	}
	if l.Algorithm == FixedWindow || l.Period <= 0 {
		// The whole quota returns when the window ends (a zero limit's
		// may have changed by then). A limit known only by the answers
		// of a remote, which says when with its reset, is one.
		return d.ResetAfter
	}
	p := l.Params()
	if p.Rate == 0 || p.Capacity == 0 {
		return Never
	}
	nominal := l.nominal()
	if d.Remaining >= nominal {
		return 0
	}
	// A soft or elastic margin lets Remaining be reported below the
	// algorithm's: more is reported once the algorithm's reaches the
	// margin plus one more than d's. At 0 the algorithm's is unknown, at
	// least 0.
	margin := p.Capacity - nominal
	have := int64(0)
	if d.Remaining > 0 {
		have = d.Remaining + margin
	}
	r := algo.Result{Remaining: have, ResetAfter: int64(d.ResetAfter)}
	return time.Duration(algo.AvailableAfter(&p, r, margin+max(d.Remaining, 0)+1))
}

// Window returns the time over which l admits its Nominal quota at its
// sustained rate: Period for the window algorithms, and for the bucket
// algorithms the time to refill a whole burst, Burst·Period/Rate (Period
// when Rate is zero), rounded up. RateLimit-Policy's w is Window in
// seconds.
func (l *Limit) Window() time.Duration {
	n := l.nominal()
	if !l.isBucket() || l.Rate <= 0 || n == l.Rate {
		return l.Period
	}
	hi, lo := bits.Mul64(uint64(n), uint64(l.Period))
	if hi >= uint64(l.Rate) {
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, uint64(l.Rate))
	if r != 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(q)
}
