package algo

import (
	"fmt"
	"math"
)

// Kind names an algorithm. The zero value is FixedWindow, the default of
// envoyproxy/ratelimit, so that a rule that names no algorithm keeps the
// meaning it has there.
type Kind uint8

const (
	FixedWindow   Kind = iota // epoch-aligned windows; count per window
	TokenBucket               // capacity Burst; smooth refill, or discrete with Interval
	LeakyBucket               // meter form: level leaks at the rate; fits if level+n <= capacity
	GCRA                      // generic cell rate algorithm: one theoretical arrival time
	SlidingWindow             // weighted two-window counter estimate
	SlidingLog                // exact rolling window of timestamps
	Sketch                    // count-min sketch per limit, sliding over two windows
	numRateKinds

	// Concurrency is not a rate: it caps the permits held at once per
	// key (Capacity of them, each living Period unless renewed; see
	// PermitStep). Kinds, ParseKind and KindNames leave it out: they
	// are the rate algorithms, which the rules name in algorithm:.
	Concurrency = numRateKinds
	numKinds    = Concurrency + 1
)

var kindNames = [numKinds]string{
	FixedWindow:   "fixed_window",
	TokenBucket:   "token_bucket",
	LeakyBucket:   "leaky_bucket",
	GCRA:          "gcra",
	SlidingWindow: "sliding_window",
	SlidingLog:    "sliding_log",
	Sketch:        "sketch",
	Concurrency:   "concurrency",
}

// String returns the name used in rules files, e.g. "token_bucket"
// ("concurrency" for Concurrency).
func (k Kind) String() string {
	if k < numKinds {
		return kindNames[k]
	}
	return fmt.Sprintf("algo.Kind(%d)", uint8(k))
}

// ParseKind returns the rate algorithm with the given rules-file name:
// never Concurrency, which a rule asks for otherwise than by algorithm:.
func ParseKind(s string) (Kind, error) {
	for k, name := range kindNames[:numRateKinds] {
		if name == s {
			return Kind(k), nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (want one of %s)", s, KindNames())
}

// KindNames lists the rate algorithms' names, comma separated, for error
// messages.
func KindNames() string {
	s := ""
	for i, name := range kindNames[:numRateKinds] {
		if i > 0 {
			s += ", "
		}
		s += name
	}
	return s
}

// Kinds returns every rate algorithm, in declaration order: not
// Concurrency.
func Kinds() []Kind {
	ks := make([]Kind, numRateKinds)
	for i := range ks {
		ks[i] = Kind(i)
	}
	return ks
}

// HasState reports whether the algorithm keeps one fixed-size State per key
// and is evaluated by Step.
func (k Kind) HasState() bool { return k <= SlidingWindow }

// Never is the RetryAfter (and ResetAfter) of a request that can never be
// allowed: a cost above the capacity, or a zero limit.
const Never int64 = math.MaxInt64

// Params is a compiled limit, in integers: counts and nanoseconds.
//
// Rate is the number of requests per Period. For the window algorithms
// (fixed window, sliding window, sliding log, sketch) Capacity is the number
// admitted per window; for the bucket algorithms (token bucket, leaky bucket,
// GCRA) Capacity is the burst, the size of the bucket, and Rate/Period its
// refill or leak rate. Capacity may exceed the configured limit when a soft or
// elastic margin applies: the algorithm enforces Capacity and knows nothing of
// margins.
type Params struct {
	Kind     Kind
	Rate     int64 // requests per Period, >= 0
	Period   int64 // nanoseconds, > 0
	Capacity int64 // enforced capacity, >= 0
	Interval int64 // token bucket only: discrete refill every Interval ns; 0 = smooth

	// Offset shifts a fixed or sliding window's windows from the epoch:
	// window w is [Offset + w·Period, Offset + (w+1)·Period), 0 <= Offset
	// < Period. Calendar periods use it: a month of the right length,
	// starting on its anchor day, is the window of its Period that holds
	// its start (a sliding window's state then tells the window before by
	// time, not by alignment: readSlideFrom).
	Offset int64

	// Debit marks a limit charged after the fact (Envoy's
	// apply_on_stream_done: checked with a cost of 0, charged the real
	// cost when the response ends). Under Overdraw, a charge that finds
	// it exhausted is counted too (ChargesExhausted), in debt or not
	// (OverdrawsExhausted): it is what was spent.
	Debit bool
}

// IdentityCounts are the rate and capacity that name a state in a store,
// with the kind, period and interval: a Concurrency limit's count none
// (zeros), so that its permits are one set whatever its N: holders stay
// counted when N changes (a rules reload, the local failure policy's
// share of the slots on one of n nodes). Its period counts none either
// (IdentityPeriod).
func (p *Params) IdentityCounts() (rate, capacity int64) {
	if p.Kind == Concurrency {
		return 0, 0
	}
	return p.Rate, p.Capacity
}

// IdentityPeriod is the period that names a state in a store, with the
// kind, rate, capacity and interval: an offset window's (a calendar
// period's) changes length from period to period and keeps its state, so
// it counts as none; so does a Concurrency limit's, its permits' TTL:
// each permit carries its own expiry, so the permits of a key are one set
// whatever the TTL, and a new TTL applies to the permits acquired or
// renewed with it while those held stay counted.
func (p *Params) IdentityPeriod() int64 {
	if p.Offset != 0 || p.Kind == Concurrency {
		return 0
	}
	return p.Period
}

// Validate reports what is wrong with p, or nil.
func (p *Params) Validate() error {
	switch {
	case p.Kind >= numKinds:
		return fmt.Errorf("unknown algorithm %d", p.Kind)
	case p.Period <= 0:
		return fmt.Errorf("period must be positive, got %dns", p.Period)
	case p.Rate < 0:
		return fmt.Errorf("rate must not be negative, got %d", p.Rate)
	case p.Capacity < 0:
		return fmt.Errorf("capacity must not be negative, got %d", p.Capacity)
	case p.Interval < 0:
		return fmt.Errorf("refill interval must not be negative, got %dns", p.Interval)
	case p.Interval > 0 && p.Kind != TokenBucket:
		return fmt.Errorf("a refill interval applies only to token_bucket, not %s", p.Kind)
	case p.Offset < 0 || p.Offset >= p.Period:
		return fmt.Errorf("window offset must be in [0, period), got %dns for a period of %dns", p.Offset, p.Period)
	case p.Offset != 0 && p.Kind != FixedWindow && p.Kind != SlidingWindow:
		return fmt.Errorf("a window offset applies only to fixed_window and sliding_window, not %s", p.Kind)
	}
	return p.validateCapacity()
}

// validateCapacity is Validate for what a kind allows beyond the common
// bounds: a discrete refill's whole tokens, the windows' and the permits'
// capacities.
func (p *Params) validateCapacity() error {
	if p.Interval > 0 {
		hi, lo := mul64(p.Rate, p.Interval)
		if hi != 0 || lo%uint64(p.Period) != 0 || lo == 0 {
			return fmt.Errorf("discrete refill needs a whole number of tokens per interval: rate %d per %dns over an interval of %dns is not", p.Rate, p.Period, p.Interval)
		}
		if lo/uint64(p.Period) > math.MaxInt64 {
			// A step's remainder is kept in the state's int64.
			return fmt.Errorf("discrete refill adds %d tokens per interval, more than %d", lo/uint64(p.Period), int64(math.MaxInt64))
		}
	}
	switch {
	case (p.Kind == SlidingWindow || p.Kind == Sketch) && p.Capacity > MaxSlidingWindowCapacity:
		return fmt.Errorf("%s counts at most %d requests per window, got %d (use gcra or token_bucket for larger rates)", p.Kind, MaxSlidingWindowCapacity, p.Capacity)
	case p.Kind == Concurrency && p.Debit:
		return fmt.Errorf("a concurrency limit is not charged after the fact (debit)")
	case p.Kind == Concurrency && p.Capacity > MaxPermits:
		return fmt.Errorf("a concurrency limit holds at most %d permits a key, got %d", MaxPermits, p.Capacity)
	}
	return nil
}

// MaxSlidingWindowCapacity is the largest capacity of a sliding window
// counter and of a sketch: the sliding window's state packs the previous and
// current counts into 32 bits each, and the sketch's counters are 32-bit.
const MaxSlidingWindowCapacity = math.MaxUint32 - 1

// State is the fixed-size state of one key for the algorithms evaluated by
// Step. Its zero value is a fresh key.
//
// A is always the idle-at time, in nanoseconds since the Unix epoch: at or
// after A the state is equivalent to the zero State, so a store may forget it.
// The meaning of B depends on the algorithm.
type State struct {
	A, B int64
}

// Result is the outcome of one step. Remaining is counted against Capacity.
// Durations are in nanoseconds; RetryAfter is 0 when Allowed and Never when
// the request can never be allowed.
type Result struct {
	Allowed    bool
	Remaining  int64
	ResetAfter int64 // until the state is fully replenished / the window ends
	RetryAfter int64 // until the same request would be allowed
	// Overdrawn reports a denied hit consumed all the same, past the
	// limit (Overdraw): the state carries a debt.
	Overdrawn bool
}

// LimitParams are the parameters of a limit of algorithm kind, rate per
// period, whose nominal capacity (its burst, or its rate for the windows)
// is nominal, with a soft margin, an elastic ceiling, a refill interval
// and a debit flag: the one compilation of a sluice.Limit, shared by its
// validation and the stores.
func LimitParams(kind Kind, rate, period, nominal int64, softPercent int, elasticCeiling, interval, offset int64, debit bool) Params {
	return Params{
		Kind:     kind,
		Rate:     rate,
		Period:   period,
		Capacity: Capacity(nominal, softPercent, elasticCeiling),
		Interval: interval,
		Offset:   offset,
		Debit:    debit,
	}
}

// Capacity is the enforced capacity of a limit whose nominal capacity (its
// burst, or its rate for the windows) is nominal, with a soft margin of
// softPercent (ceil(nominal·(100+softPercent)/100), saturated) and an
// elastic ceiling (zero: none), whichever is larger.
func Capacity(nominal int64, softPercent int, elasticCeiling int64) int64 {
	capacity := nominal
	if softPercent > 0 {
		c := capacity
		if c <= math.MaxInt64/(100+MaxSoftPercent) {
			c = (c*int64(100+softPercent) + 99) / 100
		}
		capacity = c
	}
	return max(capacity, elasticCeiling)
}

// MaxSoftPercent bounds a limit's soft margin, in percent.
const MaxSoftPercent = 1000

// The count-min sketch's dimensions: the defaults of a sketch limit, and
// the most cells one may have.
const (
	DefaultSketchWidth = 2048
	DefaultSketchDepth = 4
	MaxSketchCells     = 1 << 24
)

// SketchDims is a sketch's width and depth as configured, with the
// defaults for zero.
func SketchDims(width, depth int) (int, int) {
	if width == 0 {
		width = DefaultSketchWidth
	}
	if depth == 0 {
		depth = DefaultSketchDepth
	}
	return width, depth
}

// Nominal is the capacity a limit of kind k reports in decisions and
// headers: its burst for a bucket kind (rate when burst is zero), its rate
// for a window.
func Nominal(k Kind, rate, burst int64) int64 {
	if (k == TokenBucket || k == LeakyBucket || k == GCRA) && burst > 0 {
		return burst
	}
	return rate
}
