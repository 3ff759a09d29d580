package rlsclient

import (
	"math"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
)

func rateLimit(name string, rate uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit, mult uint32) *rlsv3.RateLimitResponse_RateLimit {
	rl := &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: rate, Unit: unit}
	if mult != 0 {
		rl.UnitMultiplier = wrapperspb.UInt32(mult)
	}
	return rl
}

func TestPeriod(t *testing.T) {
	for _, tc := range []struct {
		rl   *rlsv3.RateLimitResponse_RateLimit
		want time.Duration
	}{
		{rateLimit("", 1, rlsv3.RateLimitResponse_RateLimit_MINUTE, 0), time.Minute},
		{rateLimit("", 1, rlsv3.RateLimitResponse_RateLimit_SECOND, 90), 90 * time.Second},
		{rateLimit("", 1, rlsv3.RateLimitResponse_RateLimit_WEEK, 2), 14 * 24 * time.Hour},
		{rateLimit("", 1, rlsv3.RateLimitResponse_RateLimit_UNKNOWN, 3), 0},
		{rateLimit("", 1, rlsv3.RateLimitResponse_RateLimit_YEAR, math.MaxUint32), math.MaxInt64},
	} {
		if got := period(tc.rl); got != tc.want {
			t.Errorf("period(%v) = %v, want %v", tc.rl, got, tc.want)
		}
	}
}

// The cache keeps one Limit per remote limit, up to its bound; beyond,
// limits are still right, only new.
func TestLimitCache(t *testing.T) {
	var lc limitCache
	a := lc.get(rateLimit("a", 10, rlsv3.RateLimitResponse_RateLimit_MINUTE, 0))
	// The same period spelled otherwise is the same limit.
	for _, rl := range []*rlsv3.RateLimitResponse_RateLimit{
		rateLimit("a", 10, rlsv3.RateLimitResponse_RateLimit_MINUTE, 1),
		rateLimit("a", 10, rlsv3.RateLimitResponse_RateLimit_SECOND, 60),
	} {
		if lc.get(rl) != a {
			t.Errorf("%v is another limit", rl)
		}
	}
	for _, rl := range []*rlsv3.RateLimitResponse_RateLimit{
		rateLimit("b", 10, rlsv3.RateLimitResponse_RateLimit_MINUTE, 0),
		rateLimit("a", 11, rlsv3.RateLimitResponse_RateLimit_MINUTE, 0),
		rateLimit("a", 10, rlsv3.RateLimitResponse_RateLimit_MINUTE, 2),
	} {
		if l := lc.get(rl); l == a || l.Name != rl.Name || l.Rate != int64(rl.RequestsPerUnit) || l.Period != period(rl) {
			t.Errorf("%v: %+v", rl, l)
		}
	}
	for i := range maxLimits + 10 {
		lc.get(rateLimit("", uint32(i), rlsv3.RateLimitResponse_RateLimit_SECOND, 0))
	}
	if len(lc.m) != maxLimits {
		t.Errorf("%d limits kept, want %d", len(lc.m), maxLimits)
	}
	over := rateLimit("", maxLimits+5, rlsv3.RateLimitResponse_RateLimit_SECOND, 0)
	if l := lc.get(over); l.Rate != maxLimits+5 || l == lc.get(over) {
		t.Errorf("beyond the bound: %+v", l)
	}
}

// Responses that sluice's own server does not send but a remote may.
func TestFillEdges(t *testing.T) {
	c := &Client{target: "test"}
	reqOf := func(n int) *decide.Request {
		r := &decide.Request{Domain: "api"}
		for range n {
			r.Descriptors = append(r.Descriptors, rules.Descriptor{Entries: []rules.Entry{{Key: "k", Value: "v"}}, Cost: 2})
		}
		return r
	}
	status := func(code rlsv3.RateLimitResponse_Code, rl *rlsv3.RateLimitResponse_RateLimit, remaining uint32, reset time.Duration) *rlsv3.RateLimitResponse_DescriptorStatus {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: code, CurrentLimit: rl, LimitRemaining: remaining}
		if reset != 0 {
			st.DurationUntilReset = durationpb.New(reset)
		}
		return st
	}
	minute := rateLimit("m", 10, rlsv3.RateLimitResponse_RateLimit_MINUTE, 0)
	hour := rateLimit("h", 100, rlsv3.RateLimitResponse_RateLimit_HOUR, 0)

	// Denied by none of its descriptors' limits (the remote's domain
	// capacity): reported against the least remaining, with a second's
	// wait, the remote naming none.
	var o decide.Outcome
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
		status(rlsv3.RateLimitResponse_OK, hour, 50, time.Hour),
		status(rlsv3.RateLimitResponse_OK, minute, 5, time.Minute),
	}}
	if err := c.fill(reqOf(2), resp, &o); err != nil {
		t.Fatal(err)
	}
	if o.Overall.Allowed || o.Overall.Index != 1 || o.Overall.Remaining != 5 || o.Overall.RetryAfter != time.Second || o.Descriptors[0].Cost != 2 {
		t.Errorf("capacity denial: %+v", o.Overall)
	}

	// Two denying limits: the longer wait decides; an OVER_LIMIT status
	// without a limit is over, unlimited; a negative reset is none.
	o.Reset()
	resp = &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
		status(rlsv3.RateLimitResponse_OVER_LIMIT, minute, 0, 30*time.Second),
		status(rlsv3.RateLimitResponse_OVER_LIMIT, nil, 0, 0),
		status(rlsv3.RateLimitResponse_OVER_LIMIT, hour, 0, 20*time.Minute),
		status(rlsv3.RateLimitResponse_OK, minute, 3, -time.Second),
	}}
	if err := c.fill(reqOf(4), resp, &o); err != nil {
		t.Fatal(err)
	}
	if len(o.Limits) != 3 || o.Overall.Index != 1 || o.Overall.RetryAfter != 20*time.Minute || o.Overall.Limit != 100 || o.Limits[1].Descriptor != 2 {
		t.Errorf("longest wait: %+v, limits %+v", o.Overall, o.Limits)
	}
	if do := o.Descriptors[1]; do.Limited || !do.Over || do.Decision.Allowed || do.Status != rules.NoMatch {
		t.Errorf("over without a limit: %+v", do)
	}
	if d := o.Limits[2].Decision; d.ResetAfter != 0 || !d.Allowed || d.RetryAfter != 0 {
		t.Errorf("negative reset: %+v", d)
	}

	// Allowed overall: the least remaining, no wait.
	o.Reset()
	resp = &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
		status(rlsv3.RateLimitResponse_OK, hour, 7, time.Hour),
		status(rlsv3.RateLimitResponse_OK, minute, 7, time.Minute),
	}}
	if err := c.fill(reqOf(2), resp, &o); err != nil {
		t.Fatal(err)
	}
	if !o.Overall.Allowed || o.Overall.Index != 0 || o.Overall.Remaining != 7 {
		t.Errorf("allowed: %+v", o.Overall)
	}

	// Fewer statuses than descriptors, none at all.
	for _, n := range []int{0, 1} {
		o.Reset()
		resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: resp.Statuses[:n]}
		if err := c.fill(reqOf(3), resp, &o); err == nil {
			t.Errorf("%d statuses for 3 descriptors passed", n)
		}
	}
}
