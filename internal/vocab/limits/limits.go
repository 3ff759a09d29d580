// Package limits is what the stores and the front doors need of a
// sluice.Limit beyond its fields: its parameters for the algorithms
// (Params), an algorithm's result as a Decision (Decision), a block_for
// penalty's decision (Blocked), its sketch's dimensions (SketchDims), and
// the times clients are told (MoreAfter, Window).
//
// It imports the root package and internal/algo; nothing imports it but the
// stores, the codecs and the header writers.
package limits

import (
	"math"
	"math/bits"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
)

// Params compiles l for the algo package: the enforced capacity includes
// the soft or elastic margin (algo.Capacity). l must be valid
// (Limit.Validate): the Params of an invalid limit mean nothing.
func Params(l *sluice.Limit) algo.Params {
	return algo.LimitParams(algo.Kind(l.Algorithm), l.Rate, int64(l.Period), algo.Nominal(algo.Kind(l.Algorithm), l.Rate, l.Burst), l.SoftPercent, l.ElasticCeiling, int64(l.RefillInterval), int64(l.WindowOffset), l.Debit)
}

// Decision turns an algorithm's result r, under l's parameters p, into a
// Decision, reported against the configured limit rather than the enforced
// capacity.
func Decision(l *sluice.Limit, r algo.Result, p *algo.Params) sluice.Decision {
	nominal := algo.Nominal(algo.Kind(l.Algorithm), l.Rate, l.Burst)
	remaining := max(r.Remaining-(p.Capacity-nominal), 0)
	return sluice.Decision{
		Allowed:    r.Allowed,
		Limit:      nominal,
		Remaining:  remaining,
		ResetAfter: time.Duration(r.ResetAfter),
		RetryAfter: time.Duration(r.RetryAfter),
		Over:       r.Allowed && r.Remaining < p.Capacity-nominal,
		Overdrawn:  r.Overdrawn,
	}
}

// Released is the decision of the release of a permit of limit l
// (parameters p): allowed when the store held it and removed it; denied,
// with RetryAfter Never, when it held none by that ID (released before,
// expired, never acquired). It reports no count: Remaining and ResetAfter
// are 0.
func Released(l *sluice.Limit, p *algo.Params, held bool) sluice.Decision {
	r := algo.Result{Allowed: held}
	if !held {
		r.RetryAfter = algo.Never
	}
	return Decision(l, r, p)
}

// Blocked returns d as the decision of a key serving a block_for penalty
// that ends in left: denied, nothing remaining, and RetryAfter and
// ResetAfter no earlier than the end of the block.
func Blocked(d sluice.Decision, left time.Duration) sluice.Decision {
	d.Allowed = false
	d.Remaining = 0
	d.Blocked = true
	d.RetryAfter = max(d.RetryAfter, left)
	d.ResetAfter = max(d.ResetAfter, left)
	return d
}

// SketchDims returns the width and depth of a Sketch limit's count-min
// sketch, defaults applied.
func SketchDims(l *sluice.Limit) (width, depth int) {
	return algo.SketchDims(l.Sketch.Width, l.Sketch.Depth)
}

func isBucket(l *sluice.Limit) bool {
	return l.Algorithm == sluice.TokenBucket || l.Algorithm == sluice.LeakyBucket || l.Algorithm == sluice.GCRA
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
func MoreAfter(l *sluice.Limit, d sluice.Decision) time.Duration {
	if !d.Allowed && d.RetryAfter > 0 && d.RetryAfter < sluice.Never {
		return d.RetryAfter
	}
	if l.Algorithm == sluice.FixedWindow || l.Period <= 0 {
		// The whole quota returns when the window ends (a zero limit's
		// may have changed by then). A limit known only by the answers
		// of a remote, which says when with its reset, is one.
		return d.ResetAfter
	}
	p := Params(l)
	if p.Rate == 0 || p.Capacity == 0 {
		return sluice.Never
	}
	nominal := algo.Nominal(algo.Kind(l.Algorithm), l.Rate, l.Burst)
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
func Window(l *sluice.Limit) time.Duration {
	n := algo.Nominal(algo.Kind(l.Algorithm), l.Rate, l.Burst)
	if !isBucket(l) || l.Rate <= 0 || n == l.Rate {
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
