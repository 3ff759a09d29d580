package rlsclient

import (
	"fmt"
	"math"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/rls"
	"github.com/sluicehq/sluice/rules"
)

// fill writes into o, reset, the outcome of req that the remote answered
// with resp (see the package documentation).
func (c *Client) fill(req *rlsv3.RateLimitRequest, resp *rlsv3.RateLimitResponse, o *rls.Outcome) error {
	sts := resp.GetStatuses()
	descs := req.GetDescriptors()
	if len(sts) != len(descs) {
		return fmt.Errorf("rlsclient: %s answered %d descriptor statuses for %d descriptors", c.target, len(sts), len(descs))
	}
	limited := 0
	for _, st := range sts {
		if st.GetCurrentLimit() != nil {
			limited++
		}
	}
	o.Response = resp
	o.Descriptors = grow(o.Descriptors, len(sts))
	o.Limits = grow(o.Limits, limited)
	j := 0
	for i, st := range sts {
		do := &o.Descriptors[i]
		do.Cost = cost(req, i)
		over := st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT
		reset := max(0, st.GetDurationUntilReset().AsDuration())
		d := sluice.Decision{Allowed: !over, Remaining: int64(st.GetLimitRemaining()), ResetAfter: reset}
		if over {
			d.RetryAfter = reset
		}
		do.Over = over
		cl := st.GetCurrentLimit()
		if cl == nil {
			do.Decision = d
			continue
		}
		lim := c.limits.get(cl)
		d.Limit = lim.Rate
		do.Status = rules.Limited
		if descs[i].GetLimit() != nil {
			do.Status = rules.Overridden
		}
		do.Limited, do.Decision, do.Limit = true, d, lim
		d.Index = j
		o.Limits[j] = rls.LimitOutcome{Limit: lim, Decision: d, Cost: do.Cost, Descriptor: i}
		j++
	}
	o.Overall = overall(resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT, o.Limits)
	return nil
}

// overall is the decision of a request whose limits are ls, allowed or
// not as the remote's overall code says, reported as sluice.Overall does:
// against the denying limit with the longest wait, else the limit with the
// least remaining. A request denied by no limit of its own (the remote's
// domain capacity) is reported against the latter, with a wait of a
// second: the remote says nothing of when its capacity frees up.
func overall(allowed bool, ls []rls.LimitOutcome) sluice.Decision {
	best := -1
	for i := range ls {
		d := &ls[i].Decision
		switch {
		case !d.Allowed:
			if best < 0 || ls[best].Decision.Allowed || d.RetryAfter > ls[best].Decision.RetryAfter {
				best = i
			}
		case best < 0 || ls[best].Decision.Allowed && d.Remaining < ls[best].Decision.Remaining:
			best = i
		}
	}
	var d sluice.Decision
	if best < 0 {
		d = sluice.Decision{Index: -1}
	} else {
		d = ls[best].Decision
	}
	d.Allowed = allowed
	switch {
	case allowed:
		d.RetryAfter = 0
	case d.RetryAfter <= 0:
		// Denied by nothing the response describes: the wait is unknown,
		// and a denial must still name one, or a caller that waits for it
		// (httplimit's shaping) would ask again at once.
		d.RetryAfter = failClosedWait
	}
	return d
}

// cost is what descriptor i of req applies: its hits_addend if set, else
// the request's, where 0 means 1.
func cost(req *rlsv3.RateLimitRequest, i int) int64 {
	if h := req.GetDescriptors()[i].GetHitsAddend(); h != nil {
		return int64(h.GetValue())
	}
	return max(1, int64(req.GetHitsAddend()))
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// failClosedWait is the reset and retry-after of a fail_closed answer: the
// remote's state is unknown, so the true reset is too, and a client told
// to come back within a second finds out soon after the remote recovers
// (rls.Failover's fail_closed waits the same).
const failClosedWait = time.Second

// answer writes into o, reset, the answer to req of the Client's own
// failure policy, the remote having failed with cause: fail_open allows
// every descriptor, with no limit known; fail_closed denies every
// descriptor (no rules say which are limited), retry after a second.
func (c *Client) answer(req *rlsv3.RateLimitRequest, o *rls.Outcome, cause error) {
	n := len(req.GetDescriptors())
	closed := c.policy == rules.FailClosed
	code := rlsv3.RateLimitResponse_OK
	o.Overall = sluice.Decision{Allowed: true, Index: -1}
	o.Degraded = rules.FailOpen
	if closed {
		code = rlsv3.RateLimitResponse_OVER_LIMIT
		o.Overall = sluice.Decision{ResetAfter: failClosedWait, RetryAfter: failClosedWait, Index: -1}
		o.Degraded = rules.FailClosed
	}
	o.StoreErr = cause
	// One allocation for the statuses and their resets.
	type block struct {
		st    rlsv3.RateLimitResponse_DescriptorStatus
		reset durationpb.Duration
	}
	blocks := make([]block, n)
	o.Response = &rlsv3.RateLimitResponse{OverallCode: code, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
	o.Descriptors = grow(o.Descriptors, n)
	for i := range blocks {
		b := &blocks[i]
		b.st.Code = code
		do := &o.Descriptors[i]
		do.Cost = cost(req, i)
		do.Decision = sluice.Decision{Allowed: true}
		if closed {
			b.reset.Seconds = int64(failClosedWait / time.Second)
			b.st.DurationUntilReset = &b.reset
			do.Over = true
			do.Decision = sluice.Decision{ResetAfter: failClosedWait, RetryAfter: failClosedWait}
		}
		o.Response.Statuses[i] = &b.st
	}
}

// limitKey identifies a remote limit as the remote describes it.
type limitKey struct {
	name   string
	rate   uint32
	period time.Duration
}

// maxLimits bounds the limits a Client keeps: the remote's limits are few
// (its rules'), but a request's own limit (a descriptor's override) can be
// anything. Beyond the bound, new limits are made anew on every request.
const maxLimits = 1 << 12

// limitCache holds the Limits of the remote's limits, so that a steady
// state allocates none per request.
type limitCache struct {
	mu sync.RWMutex
	m  map[limitKey]*sluice.Limit
}

// get returns the Limit of the remote's current limit cl.
func (lc *limitCache) get(cl *rlsv3.RateLimitResponse_RateLimit) *sluice.Limit {
	k := limitKey{name: cl.GetName(), rate: cl.GetRequestsPerUnit(), period: period(cl)}
	lc.mu.RLock()
	l := lc.m[k]
	lc.mu.RUnlock()
	if l != nil {
		return l
	}
	l = &sluice.Limit{Name: k.name, Rate: int64(k.rate), Period: k.period}
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if x := lc.m[k]; x != nil {
		return x
	}
	if lc.m == nil {
		lc.m = make(map[limitKey]*sluice.Limit)
	}
	if len(lc.m) < maxLimits {
		lc.m[k] = l
	}
	return l
}

// period is unit × unit_multiplier (an absent or zero multiplier is 1),
// at most the longest duration; 0 for an unknown unit.
func period(cl *rlsv3.RateLimitResponse_RateLimit) time.Duration {
	u := rules.Unit(cl.GetUnit()).Duration()
	m := time.Duration(max(1, cl.GetUnitMultiplier().GetValue()))
	if u > math.MaxInt64/m {
		return math.MaxInt64
	}
	return u * m
}
