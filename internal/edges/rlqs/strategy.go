package rlqs

import (
	"math"
	"time"

	"github.com/sluicehq/sluice/internal/base/algo"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
)

// WindowStrategy is how a share of a window limit (fixed_window,
// sliding_window) is sent to Envoy.
type WindowStrategy uint8

const (
	// TokenBuckets sends every share as a token bucket (the default):
	// the only strategy besides blanket rules that Envoy's rate_limit_quota
	// filter enforces today.
	TokenBuckets WindowStrategy = iota
	// RequestsPerTimeUnit sends the share of a window whose period is one
	// second, minute, hour or day as requests_per_time_unit. Envoy's
	// filter, as its source reads today, logs such assignments as not yet
	// supported and ignores them: only for clients that enforce it.
	RequestsPerTimeUnit
)

// fillTokens is the number of tokens a limit's whole rate adds per fill
// interval, at least: the granularity of shares. A share smaller than one
// of them is no token bucket at all.
const fillTokens = 100

// fillInterval is the fill interval of a limit's token buckets, the same
// for every share of it: one second when the limit adds fillTokens tokens
// a second or more, else long enough to add that many, at most its period;
// always whole seconds (Envoy reads the interval in seconds) and the same
// for every share (Envoy compares old and new buckets without the
// interval's seconds, so a change must show in the tokens).
func fillInterval(l *sluice.Limit) time.Duration {
	perSec := float64(l.Rate) / l.Period.Seconds()
	if perSec >= fillTokens {
		return time.Second
	}
	secs := math.Ceil(fillTokens / perSec)
	if p := math.Ceil(l.Period.Seconds()); secs > p {
		secs = p
	}
	return time.Duration(secs) * time.Second // at least 1: fillTokens/perSec > 1, and a Period is positive
}

// bucket is a token bucket as Envoy enforces it: at most max tokens,
// perFill added every fill (continuously, in Envoy's AtomicTokenBucket).
type bucket struct {
	max, perFill uint32
	fill         time.Duration
}

// rate is the bucket's tokens a second.
func (b bucket) rate() float64 { return float64(b.perFill) / b.fill.Seconds() }

// bucketOf returns the token bucket of share s of l, ok false when the
// share is less than one token per fill interval (then nothing may pass).
// Rates and sizes round down, so that the buckets of shares summing to at
// most 1 add at most the limit's rate; the size is at most a fill
// interval's tokens, and at least one token (else nothing would pass), so
// they hold at most the smaller of the limit's burst and the tokens its
// rate adds in one fill interval, plus one token for each participant.
func bucketOf(l *sluice.Limit, s float64) (bucket, bool) {
	f := fillInterval(l)
	per := floorNear(s * float64(l.Rate) * f.Seconds() / l.Period.Seconds())
	if per < 1 || s <= 0 {
		return bucket{}, false
	}
	// The size: the share of the limit's burst (a window's count), but
	// no more than one fill interval's tokens. Envoy starts a changed
	// bucket full, so every change of a share lets its Envoy admit its
	// size at once beyond the rate: a window's whole count would be a
	// window's worth of overshoot a change.
	size := math.Max(1, math.Min(floorNear(s*float64(algo.Nominal(algo.Kind(l.Algorithm), l.Rate, l.Burst))), per))
	return bucket{max: clamp32(size), perFill: clamp32(per), fill: f}, true
}

// floorNear rounds down, but up what float arithmetic left a hair below
// an integer (0.1 of 1000 is 99.99999999999999): a relative 1e-9, which
// over shares summing to at most 1 of a count below 1e9 adds less than
// one, so that the floors still sum to at most the count.
func floorNear(x float64) float64 { return math.Floor(x * (1 + 1e-9)) }

func clamp32(f float64) uint32 {
	if f >= math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(f)
}

// unitOf returns Envoy's unit for a period of exactly one unit.
func unitOf(p time.Duration) (typev3.RateLimitUnit, bool) {
	switch p {
	case time.Second:
		return typev3.RateLimitUnit_SECOND, true
	case time.Minute:
		return typev3.RateLimitUnit_MINUTE, true
	case time.Hour:
		return typev3.RateLimitUnit_HOUR, true
	case 24 * time.Hour:
		return typev3.RateLimitUnit_DAY, true
	}
	return 0, false
}

func blanket(r typev3.RateLimitStrategy_BlanketRule) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

// strategyOf returns the strategy of the shares of a bucket's limits:
// DENY_ALL when a share is too small to pass anything, else the tightest
// of their token buckets (the smallest rate, the smallest size), or with
// ws RequestsPerTimeUnit and a single window limit of one unit, its share
// of requests per unit.
func strategyOf(limits []*sluice.Limit, shares []float64, ws WindowStrategy) *typev3.RateLimitStrategy {
	if ws == RequestsPerTimeUnit && len(limits) == 1 {
		l := limits[0]
		if unit, ok := unitOf(l.Period); ok && (l.Algorithm == sluice.FixedWindow || l.Algorithm == sluice.SlidingWindow) {
			n := floorNear(shares[0] * float64(l.Rate))
			if n < 1 {
				return blanket(typev3.RateLimitStrategy_DENY_ALL)
			}
			return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_RequestsPerTimeUnit_{
				RequestsPerTimeUnit: &typev3.RateLimitStrategy_RequestsPerTimeUnit{RequestsPerTimeUnit: uint64(n), TimeUnit: unit},
			}}
		}
	}
	var best bucket
	for i, l := range limits {
		b, ok := bucketOf(l, shares[i])
		if !ok {
			return blanket(typev3.RateLimitStrategy_DENY_ALL)
		}
		if i == 0 {
			best = b
			continue
		}
		if b.rate() < best.rate() {
			best.perFill, best.fill = b.perFill, b.fill
		}
		best.max = min(best.max, b.max)
	}
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     best.max,
		TokensPerFill: wrapperspb.UInt32(best.perFill),
		FillInterval:  durationpb.New(best.fill),
	}}}
}
