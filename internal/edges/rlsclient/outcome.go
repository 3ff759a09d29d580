package rlsclient

import (
	"fmt"
	"math"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/edges/rls"
	"github.com/sluicehq/sluice/rules"
)

// fill writes into o, reset, the outcome of r that the remote answered
// with resp (see the package documentation).
func (c *Client) fill(r *decide.Request, resp *rlsv3.RateLimitResponse, o *decide.Outcome) error {
	sts := resp.GetStatuses()
	descs := r.Descriptors
	if len(sts) != len(descs) {
		return fmt.Errorf("rlsclient: %s answered %d descriptor statuses for %d descriptors", c.target, len(sts), len(descs))
	}
	limited := 0
	for _, st := range sts {
		if st.GetCurrentLimit() != nil {
			limited++
		}
	}
	o.Descriptors = grow(o.Descriptors, len(sts))
	o.Limits = grow(o.Limits, limited)
	j := 0
	for i, st := range sts {
		do := &o.Descriptors[i]
		do.Cost = descs[i].Cost
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
		if descs[i].Override != nil {
			do.Status = rules.Overridden
		}
		do.Limited, do.Decision, do.Limit = true, d, lim
		d.Index = j
		o.Limits[j] = decide.LimitOutcome{Limit: lim, Decision: d, Cost: do.Cost, Descriptor: i}
		j++
	}
	o.Overall = overall(resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT, o.Limits)
	o.PermitToken = rls.PermitToken(resp)
	return nil
}

// overall is the decision of a request whose limits are ls, allowed or
// not as the remote's overall code says, reported as sluice.Overall does:
// against the denying limit with the longest wait, else the limit with the
// least remaining. A request denied by no limit of its own (the remote's
// domain capacity) is reported against the latter, with a wait of a
// second: the remote says nothing of when its capacity frees up.
func overall(allowed bool, ls []decide.LimitOutcome) sluice.Decision {
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

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// failClosedWait is the wait of a denial the remote's response describes
// no limit of: the remote says nothing of when its capacity frees up.
const failClosedWait = time.Second

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
