package decide

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
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
//     node's own, with every limit divided by the number of nodes (Nodes,
//     or as the nodes learn it, NodeCount): its rate, burst and
//     elastic ceiling (and the domain capacity's) each become
//     ceil(x/Nodes), so that a small limit never becomes 0 and the nodes
//     together admit at most Nodes*ceil(x/Nodes) <= x+Nodes-1 where the
//     cluster admitted x, provided the load is spread over Nodes nodes (a
//     node that gets all of a key's traffic admits only its share). The
//     algorithm, period and the other settings are unchanged, except that
//     a token bucket with discrete refill adds ceil(a/Nodes) tokens per
//     interval where it added a (a little more, never more than a, for a
//     huge rate over an interval longer than its period, where that amount
//     cannot be stated in whole tokens). The counters are the node's own and
//     start empty: what the store had counted is not carried over, and
//     what the node counts is not carried back when the store recovers.
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
	// policy divides every limit by it. Zero means NodeCount's, or 1.
	Nodes int

	// NodeCount, when Nodes is zero, returns the number of nodes sharing
	// the limits as the nodes learn it from each other (the Redis store's
	// registry: redisstore.Store.Nodes), asked whenever the local policy
	// answers. A result below 1 (not learnt yet) means 1.
	NodeCount func() int
}

// nodes is the number of nodes the local policy divides by.
func (f *Failover) nodes() int64 {
	if f.Nodes > 0 {
		return int64(f.Nodes)
	}
	if f.NodeCount != nil {
		if n := f.NodeCount(); n > 1 {
			return int64(n)
		}
	}
	return 1
}

// failover is a Failover in force, with the local copies of the limits.
type failover struct {
	Failover
	scaled atomic.Pointer[scaledLimits]
}

// SetFailover sets how store failures are answered. It may be called at any
// time; requests already deciding finish with the previous setting.
func (d *Decider) SetFailover(f Failover) error {
	switch {
	case f.Default > rules.FailLocal:
		return fmt.Errorf("decide: unknown failure policy %v", f.Default)
	case f.Nodes < 0:
		return fmt.Errorf("decide: %d nodes", f.Nodes)
	case f.Default == rules.FailLocal && f.Local == nil:
		return errors.New("decide: the local failure policy needs a Local limiter")
	}
	if f.Default == rules.FailDefault {
		f.Default = rules.FailOpen
	}
	if f.Nodes == 0 && f.NodeCount == nil {
		f.Nodes = 1
	}
	d.failover.Store(&failover{Failover: f})
	return nil
}

// Failover returns the failure handling in force, its defaults filled in:
// Default is never FailDefault, and Nodes at least 1 unless NodeCount is
// set.
func (d *Decider) Failover() Failover { return d.failover.Load().Failover }

// fail answers, by the domain's failure policy, the request planned in s
// whose store decision failed with storeErr. It returns the hits as the
// policy decided them (with the local policy, their limits are the local
// copies), the overall decision, and the policy; or an error when no
// policy applies, writing the per-hit decisions to out.
func (d *Decider) fail(ctx context.Context, s *scratch, out []sluice.Decision, storeErr error) ([]sluice.Hit, sluice.Decision, rules.FailurePolicy, error) {
	p := &s.plan
	if errors.Is(storeErr, sluice.ErrInvalid) || ctx.Err() != nil || p.Domain == nil {
		return nil, sluice.Decision{}, rules.FailDefault, storeErr
	}
	f := d.failover.Load()
	policy := p.Domain.FailurePolicy
	if policy == rules.FailDefault {
		policy = f.Default
	}
	hits := p.Hits
	switch policy {
	case rules.FailClosed:
		for i := range hits {
			l := hits[i].Limit
			wait := min(l.Period, time.Second)
			out[i] = sluice.Decision{Limit: l.Nominal(), ResetAfter: wait, RetryAfter: wait}
		}
	case rules.FailLocal:
		if f.Local == nil {
			return nil, sluice.Decision{}, rules.FailDefault, fmt.Errorf("%w (failure_policy local, but no local limiter is set)", storeErr)
		}
		hits = f.localHits(s)
		decide := f.Local.DecideInto
		if !d.allOrNothingFor(p.Domain, s.pref) {
			decide = f.Local.DecideEach
		}
		overall, err := decide(ctx, hits, out)
		if err != nil {
			return nil, sluice.Decision{}, rules.FailDefault, fmt.Errorf("local failure policy: %w (after the store failed: %v)", err, storeErr)
		}
		return hits, overall, rules.FailLocal, nil
	default:
		policy = rules.FailOpen
		for i := range hits {
			n := hits[i].Limit.Nominal()
			out[i] = sluice.Decision{Allowed: true, Limit: n, Remaining: n}
		}
	}
	return hits, sluice.Overall(hits, out), policy, nil
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

// localHits returns the plan's hits as the local policy decides them, in s:
// local keys and limits divided by the number of nodes.
func (f *failover) localHits(s *scratch) []sluice.Hit {
	scaled := f.limitsFor(s.cfg)
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
		s.local = append(s.local, sluice.Hit{Limit: scaled.get(hits[i].Limit), Cost: hits[i].Cost})
	}
	all := string(s.localKeys)
	start := 0
	for i, end := range s.localEnds {
		s.local[i].Key = all[start:end]
		start = end
	}
	return s.local
}

// scaledLimits holds the local copies of the limits of one rules
// configuration, made on first use and kept until the rules change.
type scaledLimits struct {
	cfg   *rules.Config
	nodes int64
	m     sync.Map // *sluice.Limit -> *sluice.Limit
	n     atomic.Int64
}

// maxScaled bounds the copies kept for one configuration: the limits of
// per-request overrides beyond the rules' own cache are new on every
// request, and are divided anew each time once the bound is reached.
const maxScaled = 1 << 14

// limitsFor returns the local copies for cfg, starting afresh when the rules
// or the number of nodes have changed.
func (f *failover) limitsFor(cfg *rules.Config) *scaledLimits {
	nodes := f.nodes()
	if sl := f.scaled.Load(); sl != nil && sl.cfg == cfg && sl.nodes == nodes {
		return sl
	}
	sl := &scaledLimits{cfg: cfg, nodes: nodes}
	f.scaled.Store(sl)
	return sl
}

// get returns the local copy of l.
func (sl *scaledLimits) get(l *sluice.Limit) *sluice.Limit {
	if sl.nodes <= 1 {
		return l
	}
	if v, ok := sl.m.Load(l); ok {
		return v.(*sluice.Limit)
	}
	c := scale(l, sl.nodes)
	if sl.n.Load() < maxScaled {
		if v, loaded := sl.m.LoadOrStore(l, c); loaded {
			return v.(*sluice.Limit)
		}
		sl.n.Add(1)
	}
	return c
}

// scale returns a copy of l, a valid limit, for one of n nodes sharing it:
// its rate, burst and elastic ceiling each ceil(x/n), everything else
// unchanged. A token bucket's burst is set explicitly (ceil(Nominal/n)) so
// that a zero burst, which means the rate, keeps meaning the original rate
// divided. A token bucket with discrete refill, which adds a =
// Rate*RefillInterval/Period tokens per interval, adds ceil(a/n) instead,
// stated as that rate per interval so that the amount stays whole. The copy
// is valid; n < 1 is taken as 1.
func scale(l *sluice.Limit, n int64) *sluice.Limit {
	c := *l
	if n <= 1 {
		return &c
	}
	isBucket := l.Algorithm == sluice.TokenBucket || l.Algorithm == sluice.LeakyBucket || l.Algorithm == sluice.GCRA
	if isBucket {
		c.Burst = ceilDiv(l.Nominal(), n)
	}
	c.Rate = ceilDiv(l.Rate, n)
	c.ElasticCeiling = ceilDiv(l.ElasticCeiling, n)
	if l.RefillInterval > 0 {
		// a tokens per step; valid input has Rate*RefillInterval in 64
		// bits and a multiple of Period.
		iv, per := uint64(l.RefillInterval), uint64(l.Period)
		_, lo := bits.Mul64(uint64(l.Rate), iv)
		c.Rate, c.Period = ceilDiv(int64(lo/per), n), l.RefillInterval
		if hi, _ := bits.Mul64(uint64(c.Rate), iv); hi != 0 || c.Rate > sluice.MaxCost {
			// Too many tokens per step to state so: keep the period
			// and round the divided rate up to the next rate whose
			// step is whole, a multiple of m.
			m := int64(per / gcd(per, iv))
			c.Rate, c.Period = ceilDiv(l.Rate/m, n)*m, l.Period
		}
	}
	return &c
}

func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func ceilDiv(x, n int64) int64 {
	if x <= 0 {
		return x
	}
	return (x-1)/n + 1
}

// StoreReadiness is the readiness rule of every front door, given its
// store's health (nil: up) and the default failure policy: not ready while
// the store has never been reached since start (a wrong address, a backend
// not started: better seen at once than answered by the policy unnoticed),
// nor while it is down and the policy is fail_closed (every request would
// be denied); ready otherwise, the policy answering during an outage.
func StoreReadiness(storeErr error, policy rules.FailurePolicy) error {
	switch {
	case storeErr == nil:
		return nil
	case errors.Is(storeErr, sluice.ErrNeverConnected):
		return fmt.Errorf("store not reached since start (%v); check that it runs and its address", storeErr)
	case policy == rules.FailClosed:
		return fmt.Errorf("store down (%v) and the default failure policy is %s", storeErr, policy)
	}
	return nil
}
