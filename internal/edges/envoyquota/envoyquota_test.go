package envoyquota

import (
	"math"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func assign(s *typev3.RateLimitStrategy, ttl time.Duration) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(ttl), RateLimitStrategy: s,
			},
		},
	}
}

func tokenBucket(max, perFill uint32, fill time.Duration) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens: max, TokensPerFill: wrapperspb.UInt32(perFill), FillInterval: durationpb.New(fill),
	}}}
}

func blanket(r typev3.RateLimitStrategy_BlanketRule) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

// count admits as many requests as it can at t.
func count(b *Bucket, t time.Time) int {
	n := 0
	for b.Allow(t) {
		n++
		if n > 1_000_000 {
			return n
		}
	}
	return n
}

// TestBucket: what the model does is what docs/leases.md says Envoy does.
func TestBucket(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	var b Bucket
	if b.Allow(t0) || b.Rate(t0) != 0 {
		t.Fatal("no assignment yet: want DENY_ALL")
	}
	b.Apply(assign(tokenBucket(10, 5, time.Second), 3*time.Second), t0)
	if n := count(&b, t0); n != 10 {
		t.Fatalf("a new bucket: %d admitted at once, want its 10 tokens (it starts full)", n)
	}
	if n := count(&b, t0.Add(time.Second)); n != 5 {
		t.Fatalf("a second later: %d admitted, want the 5 it refilled", n)
	}
	// The same bucket again: carried over, tokens and all (none left).
	b.Apply(assign(tokenBucket(10, 5, time.Second), 3*time.Second), t0.Add(time.Second))
	if n := count(&b, t0.Add(time.Second)); n != 0 || b.Gifts != 10 || b.Changes != 1 {
		t.Fatalf("the same assignment again: %d admitted, %d gifts, %d changes; want 0, 10, 1", n, b.Gifts, b.Changes)
	}
	// A different one: a new bucket, full.
	b.Apply(assign(tokenBucket(4, 2, time.Second), 3*time.Second), t0.Add(time.Second))
	if n := count(&b, t0.Add(time.Second)); n != 4 || b.Gifts != 14 || b.Changes != 2 {
		t.Fatalf("a changed assignment: %d admitted, %d gifts, %d changes; want 4, 14, 2", n, b.Gifts, b.Changes)
	}
	// Expired: DENY_ALL.
	if b.Rate(t0.Add(4*time.Second)) != 0 || b.Allow(t0.Add(4*time.Second)) {
		t.Fatal("after the TTL: want DENY_ALL")
	}
	b.Apply(assign(blanket(typev3.RateLimitStrategy_ALLOW_ALL), time.Second), t0.Add(5*time.Second))
	if !math.IsInf(b.Rate(t0.Add(5*time.Second)), 1) || !b.Allow(t0.Add(5*time.Second)) {
		t.Fatal("ALLOW_ALL: want everything admitted")
	}
	b.Apply(assign(blanket(typev3.RateLimitStrategy_DENY_ALL), time.Second), t0.Add(5*time.Second))
	if b.Allow(t0.Add(5 * time.Second)) {
		t.Fatal("DENY_ALL admitted")
	}
	b.Apply(&rlqsv3.RateLimitQuotaResponse_BucketAction{BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{
		AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}}, t0.Add(5*time.Second))
	if b.Rate(t0.Add(5*time.Second)) != 0 {
		t.Fatal("abandoned: want no assignment")
	}
}
