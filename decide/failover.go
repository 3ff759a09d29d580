package decide

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/base/algo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/fault"
	"github.com/sluicehq/sluice/rules"
)

// Failover says how a Decider answers when its store fails: when the
// limiter returns an error that is neither an invalid request
// (sluice.ErrInvalid) nor the end of the caller's own context. The policy is
// the domain's failure_policy, or Default for the domains that set none:
//
//   - fail_open: every descriptor is OK, as if no limit applied. The
//     outcome keeps each descriptor's match (Status, StatKey, Limited), so
//     that stats still count the hits, as admitted; the response carries
//     no current limit, remaining count or reset for them.
//   - fail_closed: every limited descriptor is OVER_LIMIT (shadow-mode
//     limits still never deny), with a remaining count of 0 and a reset
//     and retry-after of one second, or the limit's period if shorter: the
//     store's state is unknown, so the true reset is too, and a client
//     told to come back within a second finds out soon after the store
//     recovers.
//   - local: the same hits are decided on the Local limiter, a store of the
//     node's own, so that each node admits about its share of every limit:
//     each hit weighs its cost times the number of nodes (the larger of
//     Nodes and, as the nodes learn it, NodeCount's) against the
//     configured limit (see localCost), so that N nodes that each count at
//     least N together admit at most N·max(1, floor(x/N)) <= max(x, N)
//     requests of cost 1 where the cluster admits x; they admit that much
//     when the load is spread over them (a node that gets all of a key's
//     traffic admits only its share). The local counters are in
//     the limit's own units, the node's estimate of what the cluster spent,
//     so that a change in the number of nodes never gives back what they
//     hold; they are the node's own, kept across outages (a second outage
//     in the same window starts from the first one's counts) and expire
//     as any key does. Decisions report the configured limit, and as
//     Remaining the requests of cost 1 the node still admits. What the
//     local policy admits is written back to the store when it answers
//     again (writeback.go), so that a store that comes back does not hand
//     out that quota a second time.
//
// Every request tries the store first, so that answers return to the
// store's as soon as it answers again; a store that fails fast while down
// (the Redis store's deadline and circuit breaker) keeps the policies cheap.
type Failover struct {
	// Default is the policy of the domains that set no failure_policy.
	// The zero value, FailDefault, means FailOpen.
	Default rules.FailurePolicy

	// Local is the node-local limiter of the local policy (over a
	// memstore, used for nothing else). It is required when Default is
	// FailLocal; a domain whose failure_policy is local is answered with
	// the store's error while it is nil.
	Local *sluice.Limiter

	// Nodes is the number of nodes that share the limits: the local
	// policy gives each node 1/Nodes of every limit. With NodeCount set it
	// is the least number: the policy divides by the larger of Nodes and
	// NodeCount's. Zero means NodeCount's alone, or 1.
	Nodes int

	// NodeCount returns the number of nodes sharing the limits as the
	// nodes learn it from each other (the Redis store's registry:
	// redisstore.Store.Nodes), asked whenever the local policy answers. A
	// result below Nodes (below 1: not learnt yet) means Nodes, or 1.
	NodeCount func() int

	// Budget, when set, bounds the local policy by less than a limit:
	// for a hit where it returns ok, the nodes together admit at most
	// left of the hit's limit on its key, in the window they decide in,
	// beyond what the store counted when it last answered (so beyond
	// what the policy admitted and has not written back yet). Before a
	// node decides such a hit, its local counter is raised to hold at
	// least the limit less left plus its own hits not written back
	// (counters only rise), so that it admits at most left/nodes more. A
	// store that hands out parts of a limit says what its part has left:
	// the region tier, of a global limit, what the region has left of its
	// allocation (internal/stores/regions). Nil: the configured limits bound the
	// policy.
	Budget func(key string, l *sluice.Limit) (left int64, ok bool)

	// Health, when set, is the store's health check (nil: up). While the
	// local policy holds hits not written back, the Decider asks it every
	// writeBackPoll and writes them back as soon as the store is up,
	// without waiting for a request: a node that gets none after an
	// outage would otherwise leave its share uncounted while the other
	// nodes decide its keys from the store. Nil: the write-back starts
	// with the first request the store decides.
	Health func() error

	// Errors, when set with Health, counts the store's calls that failed
	// (a Redis store's probe PINGs an idle Redis), and the times the store
	// was found to have lost its state (a Redis restarted empty): a rise
	// tells a node that the store failed it, as a request answered by the
	// local policy does, though no request met the failure and Health,
	// whose breaker opens after several, never said down (reserving, and
	// the token permits held again).
	Errors func() int64

	shares     *sync.Map // shareKey -> *sluice.Limit (share)
	shareCount *atomic.Int64
}

// nodes is the number of nodes the local policy shares the limits among:
// the larger of Nodes and NodeCount's, at least 1.
func (f *Failover) nodes() int64 {
	n := max(int64(f.Nodes), 1)
	if f.NodeCount != nil {
		n = max(n, int64(f.NodeCount()))
	}
	return n
}

// withDefaults checks f and returns it with its defaults filled in:
// Default is never FailDefault, and Nodes at least 1 unless NodeCount is
// set.
func (f Failover) withDefaults() (Failover, error) {
	switch {
	case f.Default > rules.FailLocal:
		return f, fmt.Errorf("decide: unknown failure policy %v", f.Default)
	case f.Nodes < 0:
		return f, fmt.Errorf("decide: %d nodes", f.Nodes)
	case f.Default == rules.FailLocal && f.Local == nil:
		return f, errors.New("decide: the local failure policy needs a Local limiter")
	}
	if f.Default == rules.FailDefault {
		f.Default = rules.FailOpen
	}
	if f.Nodes == 0 && f.NodeCount == nil {
		f.Nodes = 1
	}
	f.shares, f.shareCount = new(sync.Map), new(atomic.Int64)
	return f, nil
}

// Failover returns the failure handling in force, its defaults filled in.
func (d *Decider) Failover() Failover { return d.failover }

// FailurePolicy returns the policy that answers domain's requests when the
// store (or the remote) cannot: the domain's failure_policy in the rules
// in force, else Failover.Default; never FailDefault. It is the one place
// the policy is resolved: the decisions, the Rate Limit Quota Service and
// the readiness checks all ask it.
func (d *Decider) FailurePolicy(domain string) rules.FailurePolicy {
	var dom *rules.Domain
	if cfg := d.Rules(); cfg != nil {
		dom = cfg.Domain(domain)
	}
	return d.policyOf(dom)
}

// policyOf is FailurePolicy for a domain of the rules (nil: unknown).
func (d *Decider) policyOf(dom *rules.Domain) rules.FailurePolicy {
	if dom != nil && dom.FailurePolicy != rules.FailDefault {
		return dom.FailurePolicy
	}
	return d.failover.Default
}

// failClosedWait is the reset and retry-after of a fail_closed answer: the
// store's state is unknown, so the true reset is too, and a client told to
// come back within a second finds out soon after the store recovers.
const failClosedWait = time.Second

// fail answers, by the domain's failure policy, the request planned in s
// whose store decision failed with storeErr. It returns the hits as the
// policy decided them, the overall decision, and the policy; or an error
// when no policy applies, writing the per-hit decisions to out. When record
// is set (the store itself failed, not a caller's backend), what the local
// policy admits is recorded for the write-back.
func (d *Decider) fail(ctx context.Context, s *scratch, out []sluice.Decision, storeErr error, record bool) ([]sluice.Hit, sluice.Decision, rules.FailurePolicy, error) {
	p := &s.plan
	if errors.Is(storeErr, sluice.ErrInvalid) || ctx.Err() != nil || p.Domain == nil {
		return nil, sluice.Decision{}, rules.FailDefault, storeErr
	}
	f := &d.failover
	policy := d.policyOf(p.Domain)
	hits := p.Hits
	switch policy {
	case rules.FailClosed:
		for i := range hits {
			l := hits[i].Limit
			wait := min(l.Period, failClosedWait)
			out[i] = sluice.Decision{Limit: algo.Nominal(algo.Kind(l.Algorithm), l.Rate, l.Burst), ResetAfter: wait, RetryAfter: wait}
		}
	case rules.FailLocal:
		if f.Local == nil {
			return nil, sluice.Decision{}, rules.FailDefault, fmt.Errorf("%w (failure_policy local, but no local limiter is set)", storeErr)
		}
		nodes := f.nodes()
		local := f.localHits(s, nodes)
		s.nodes = nodes
		if f.Budget != nil {
			if err := d.budget(ctx, hits, local, nodes); err != nil {
				return nil, sluice.Decision{}, rules.FailDefault, fmt.Errorf("local failure policy: %w (after the store failed: %v)", err, storeErr)
			}
		}
		permits := hasPermits(hits)
		each := !permits && (!d.allOrNothingFor(p.Domain, s.pref) || d.hasQuota(p))
		var overall sluice.Decision
		var err error
		switch {
		case permits:
			// The node holds its share of the slots in its own store:
			// the permit releases and renews there.
			s.permit, overall, err = f.Local.Acquire(ctx, local, out)
		case each:
			overall, err = f.Local.TakeEach(ctx, local, out)
		default:
			overall, err = f.Local.Take(ctx, local, out)
		}
		if err != nil {
			return nil, sluice.Decision{}, rules.FailDefault, fmt.Errorf("local failure policy: %w (after the store failed: %v)", err, storeErr)
		}
		if record {
			// Permits are not written back: a local holder releases
			// where it acquired (docs/internals/concurrency.md).
			d.spent.record(hits, func(i int) bool {
				return out[i].Allowed && (each || overall.Allowed) && hits[i].Limit.Algorithm != sluice.Concurrency
			}, d.now())
			d.watchWriteBack()
		}
		if nodes > 1 {
			// Remaining counts the requests of cost 1 the node still
			// admits, as it does when the store decides (a permit's
			// share already counts slots).
			for i := range hits {
				if hits[i].Limit.Algorithm != sluice.Concurrency {
					out[i].Remaining /= localCost(1, nodes, hits[i].Limit)
				}
			}
			overall = sluice.Overall(hits, out)
		}
		return hits, overall, rules.FailLocal, nil
	default:
		policy = rules.FailOpen
		for i := range hits {
			n := algo.Nominal(algo.Kind(hits[i].Limit.Algorithm), hits[i].Limit.Rate, hits[i].Limit.Burst)
			out[i] = sluice.Decision{Allowed: true, Limit: n, Remaining: n}
		}
	}
	return hits, sluice.Overall(hits, out), policy, nil
}

// budget raises the local counter of each of local, the local policy's
// hits of hits on one of nodes nodes, whose Failover.Budget bounds it, so
// that its key has at most the budget's left, less what this node
// admitted of it and has not written back (the store's last answer did
// not count it), to spend. In the local counters' units, the node's
// estimate of what all nodes spent, left is left/nodes of this node's
// own, and its own hits count nodes times. The charge is a debit, counted
// whatever else the counter took meanwhile; peek and charge are one step
// under budgetMu, so that concurrent requests do not charge it twice.
func (d *Decider) budget(ctx context.Context, hits, local []sluice.Hit, nodes int64) error {
	f := &d.failover
	var out [1]sluice.Decision
	for i := range hits {
		left, ok := f.Budget(hits[i].Key, hits[i].Limit)
		if !ok {
			continue
		}
		h := local[i]
		h.Cost = 0
		d.budgetMu.Lock()
		own := d.spent.unwritten(ledgerKey{hits[i].Key, hits[i].Limit}, d.now())
		if own > sluice.MaxCost/nodes {
			own = sluice.MaxCost
		} else {
			own *= nodes
		}
		_, err := f.Local.Take(ctx, []sluice.Hit{h}, out[:])
		if over := out[0].Remaining - max(left, 0) + own; err == nil && over > 0 {
			debit := *h.Limit
			debit.Debit = true
			h.Limit, h.Cost = &debit, min(over, sluice.MaxCost)
			_, err = f.Local.TakeEach(ctx, []sluice.Hit{h}, out[:])
		}
		d.budgetMu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

// Keys of the local policy: the plan's key after a prefix byte, so that they
// differ from any key the plan makes. A plan key of MaxKeyLen bytes, which
// would not fit with the prefix, is shortened and ends with a digest of
// itself instead.
const (
	localPrefix  = 'L'
	hashedPrefix = 'H'
	digestLen    = 32 // hex characters
)

// localHits returns the plan's hits as the local policy decides them on one
// of nodes nodes, in s: local keys, the configured limits, and each cost
// weighed by localCost.
func (f *Failover) localHits(s *scratch, nodes int64) []sluice.Hit {
	hits := s.plan.Hits
	s.localKeys = s.localKeys[:0]
	s.localEnds = s.localEnds[:0]
	s.local = s.local[:0]
	for i := range hits {
		k := hits[i].Key
		if len(k) < sluice.MaxKeyLen {
			s.localKeys = append(s.localKeys, localPrefix)
			s.localKeys = append(s.localKeys, k...)
		} else {
			sum := sha256.Sum256([]byte(k))
			s.localKeys = append(s.localKeys, hashedPrefix)
			s.localKeys = append(s.localKeys, k[:sluice.MaxKeyLen-1-digestLen]...)
			s.localKeys = hex.AppendEncode(s.localKeys, sum[:digestLen/2])
		}
		s.localEnds = append(s.localEnds, len(s.localKeys))
		l := hits[i].Limit
		if l.Algorithm == sluice.Concurrency {
			s.local = append(s.local, sluice.Hit{Limit: f.share(l, nodes), Cost: hits[i].Cost})
			continue
		}
		s.local = append(s.local, sluice.Hit{Limit: l, Cost: localCost(hits[i].Cost, nodes, l)})
	}
	all := string(s.localKeys)
	start := 0
	for i, end := range s.localEnds {
		s.local[i].Key = all[start:end]
		start = end
	}
	return s.local
}

// localCost is what a hit of cost c weighs on one of n nodes under the local
// policy: c·n, in the limit's own units.
//
// The local counters count what the node admits as if every node admitted
// as much, that is the node's estimate of what the whole cluster spent, and
// they are compared with the configured limit. So a node admits about 1/n of
// the limit, and its counters never depend on n: when the number of nodes
// changes (registrations expiring during an outage, nodes joining), what a
// counter holds stays spent. A node that saw 3 nodes and admitted 667 of a
// limit of 2,000 holds 2,001 and admits nothing more when it comes to see 1
// node; dividing the limit instead would have given it a fresh counter of
// 2,000.
//
// A cost that fits the limit's capacity (its burst, or its rate for the
// windows) alone is capped at that capacity, so that a limit smaller than n
// still admits one such request per node and window rather than none: a
// node admits max(1, floor(x/(c·n))) requests of cost c in a window of x.
// c·n saturates at MaxCost.
func localCost(c, n int64, l *sluice.Limit) int64 {
	if n <= 1 || c <= 0 {
		return c
	}
	w := int64(sluice.MaxCost)
	if c <= sluice.MaxCost/n {
		w = c * n
	}
	if capacity := algo.Nominal(algo.Kind(l.Algorithm), l.Rate, l.Burst); c <= capacity && w > capacity {
		w = capacity
	}
	return w
}

// share returns the local policy's limit for a Concurrency limit l on one
// of n nodes: floor(N/n) slots of l's N, the same TTL. A permit cannot
// weigh n (its cost is 1), so the node's cap is divided instead; the
// permits it holds stay held when n changes, and count against the new
// share. floor, not at least 1: the nodes together hold at most N while
// the store is down, and a key with fewer slots than nodes admits nothing
// then (failure_policy open admits without a permit instead). The shares
// are made once per limit and node count (at most shareCacheMax kept).
func (f *Failover) share(l *sluice.Limit, n int64) *sluice.Limit {
	if n <= 1 {
		return l
	}
	return f.limitOf(shareKey{l, n, false})
}

// reserve returns l, a Concurrency limit of N slots, less the shares of
// the other nodes of n: N − (n−1)·floor(N/n) slots (reserving).
func (f *Failover) reserve(l *sluice.Limit, n int64) *sluice.Limit {
	return f.limitOf(shareKey{l, n, true})
}

// limitOf makes, or finds made, the limit k says.
func (f *Failover) limitOf(k shareKey) *sluice.Limit {
	if v, ok := f.shares.Load(k); ok {
		return v.(*sluice.Limit)
	}
	l, n := k.l, k.n
	s := *l
	s.Rate = l.Rate / n
	if k.reserve {
		s.Rate = l.Rate - (n-1)*(l.Rate/n)
	}
	if f.shareCount.Add(1) > shareCacheMax {
		f.shares.Clear()
		f.shareCount.Store(1)
	}
	v, _ := f.shares.LoadOrStore(k, &s)
	return v.(*sluice.Limit)
}

// shareKey names a local share: the configured limit and the node count;
// or, reserve set, what a node leaves to the others.
type shareKey struct {
	l       *sluice.Limit
	n       int64
	reserve bool
}

// shareCacheMax bounds the shares kept: rule reloads make new limits.
const shareCacheMax = 4096

// hasPermits reports whether hits hold permits: a Concurrency hit of
// cost 1.
func hasPermits(hits []sluice.Hit) bool {
	for i := range hits {
		if hits[i].Limit.Algorithm == sluice.Concurrency && hits[i].Cost == 1 {
			return true
		}
	}
	return false
}

// byPolicy answers r into o by its domain's failure policy, the store
// having failed it with storeErr (recorded: the store, not a remote, was
// asked), and returns the hits the policy decided, with the limits it
// enforced, and its overall decision.
func (d *Decider) byPolicy(ctx context.Context, s *scratch, r *Request, o *Outcome, storeErr error, recorded bool) ([]sluice.Hit, sluice.Decision, error) {
	out := s.out[:len(s.plan.Hits)]
	hits, overall, policy, err := d.fail(ctx, s, out, storeErr, recorded)
	if err != nil {
		return hits, overall, err
	}
	o.Permit, s.permit = s.permit, nil
	if o.Permit != nil && r.Token {
		o.PermitToken = permitToken(s.plan.Hits, s.local, s.nodes)
	}
	if policy == rules.FailLocal && recorded {
		d.policyAnswered(s, o.Permit, out, r.Token)
	}
	o.Degraded, o.StoreErr, o.Reason = policy, storeErr, fault.ReasonOf(storeErr)
	return hits, overall, nil
}
