// Package envoyquota plays, in tests and simulations, what Envoy's
// rate_limit_quota filter does with the assignments of a Rate Limit Quota
// Service for one bucket, as Envoy's source does it: a token bucket per
// assignment, started full and carried over only when the new
// assignment's bucket is the same; blanket rules; an assignment kept its
// time to live after it arrives, then the expired behaviour; before the
// first, the no-assignment behaviour. Both behaviours are DENY_ALL here,
// as docs/leases.md configures them. It imports go-control-plane's types
// and nothing of sluice.
package envoyquota

import (
	"math"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// Bucket is one quota bucket of one Envoy. The zero value denies all (no
// assignment yet). It is not safe for concurrent use.
type Bucket struct {
	tb       *typev3.TokenBucket // nil: a blanket rule, or none
	allowAll bool
	tokens   float64
	refilled time.Time
	until    time.Time // the assignment's expiry; zero: none yet

	// Gifts counts the tokens of every token bucket Envoy started full;
	// Changes the token buckets installed.
	Gifts   int64
	Changes int
}

// Apply installs an action received at now. An abandon action drops the
// assignment (the bucket starts over).
func (b *Bucket) Apply(a *rlqsv3.RateLimitQuotaResponse_BucketAction, now time.Time) {
	if a.GetAbandonAction() != nil {
		b.tb, b.allowAll, b.until = nil, false, time.Time{}
		return
	}
	qa := a.GetQuotaAssignmentAction()
	if qa == nil {
		return
	}
	b.until = now.Add(qa.GetAssignmentTimeToLive().AsDuration())
	st := qa.GetRateLimitStrategy()
	tb := st.GetTokenBucket()
	if tb == nil {
		b.tb = nil
		b.allowAll = st.GetRequestsPerTimeUnit() == nil && st.GetBlanketRule() == typev3.RateLimitStrategy_ALLOW_ALL
		return
	}
	b.allowAll = false
	if b.tb != nil && b.tb.MaxTokens == tb.MaxTokens && b.tb.GetTokensPerFill().GetValue() == tb.GetTokensPerFill().GetValue() &&
		b.tb.GetFillInterval().AsDuration() == tb.GetFillInterval().AsDuration() {
		return // the same bucket: Envoy carries it over, tokens and all
	}
	b.tb, b.tokens, b.refilled = tb, float64(tb.MaxTokens), now
	b.Gifts += int64(tb.MaxTokens)
	b.Changes++
}

// Rate is what the bucket admits a second at now under its assignment: 0
// without one or after it expired (DENY_ALL), +Inf for ALLOW_ALL.
func (b *Bucket) Rate(now time.Time) float64 {
	if b.until.IsZero() || !now.Before(b.until) {
		return 0
	}
	if b.allowAll {
		return math.Inf(1)
	}
	if b.tb == nil {
		return 0
	}
	return float64(b.tb.GetTokensPerFill().GetValue()) / b.tb.GetFillInterval().AsDuration().Seconds()
}

// Allow decides one request at now.
func (b *Bucket) Allow(now time.Time) bool {
	r := b.Rate(now)
	switch {
	case math.IsInf(r, 1):
		return true
	case r <= 0:
		return false
	}
	b.tokens = math.Min(float64(b.tb.MaxTokens), b.tokens+r*now.Sub(b.refilled).Seconds())
	b.refilled = now
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	return false
}
