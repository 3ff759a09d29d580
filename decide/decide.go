// Package decide is the decision core of every front door: it takes a
// domain and plain descriptors ([rules.Descriptor]: entries, a cost, an
// optional per-request limit), matches them against the rules in force,
// decides every matched limit together with a [sluice.Limiter], and says
// what became of each descriptor and limit in an [Outcome]. When the store
// fails, it answers by the domain's failure policy ([Failover]).
//
// Transports are codecs around it: package rls turns Envoy's
// RateLimitRequest into descriptors and an Outcome into a
// RateLimitResponse (for the gRPC service, the HTTP JSON API and sluice
// simulate); httplimit and proxy build descriptors from HTTP requests and
// call it directly.
//
// This package imports the root package, rules and the standard library.
// It must not import protobuf, gRPC, a transport or a store.
package decide

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
)

// Decider decides requests with the current rules and a limiter. It is safe
// for concurrent use; SetRules swaps the rules atomically.
type Decider struct {
	limiter  *sluice.Limiter
	rules    atomic.Pointer[rules.Config]
	failover atomic.Pointer[failover]
	plans    sync.Pool
	each     atomic.Bool // the default of domains that set no all_or_nothing: each limit on its own
	quota    atomic.Bool // every descriptor a quota (envoy-rl's QUOTA_MODE)
	runtime  atomic.Pointer[runtimeBox]

	spent ledger       // what the local failure policy admitted, to write back
	clock func() int64 // the write-back's clock (tests); nil: time.Now
}

type runtimeBox struct{ r rules.Runtime }

// SetRuntime makes every decision consult r (the runtime overrides,
// package overrides) before the rules; nil stops it.
func (d *Decider) SetRuntime(r rules.Runtime) {
	if r == nil {
		d.runtime.Store(nil)
		return
	}
	d.runtime.Store(&runtimeBox{r})
}

// Runtime returns what SetRuntime set, or nil.
func (d *Decider) Runtime() rules.Runtime {
	if b := d.runtime.Load(); b != nil {
		return b.r
	}
	return nil
}

// SetQuotaMode makes every limited descriptor a quota, as if each rule set
// quota_mode (envoyproxy/ratelimit's QUOTA_MODE): a request is denied by
// its descriptors only when all of them are over their limits.
func (d *Decider) SetQuotaMode(on bool) { d.quota.Store(on) }

// NewDecider returns a Decider over lim with the rules cfg. Until
// SetFailover, a store failure is answered fail_open in every domain that
// sets no failure_policy. cfg may be nil: until SetRules, every request is
// answered ErrNoRules.
func NewDecider(lim *sluice.Limiter, cfg *rules.Config) *Decider {
	d := &Decider{limiter: lim}
	d.rules.Store(cfg)
	d.failover.Store(&failover{Failover: Failover{Default: rules.FailOpen, Nodes: 1}})
	d.plans.New = func() any { return new(scratch) }
	return d
}

// SetAllOrNothing sets how the requests of a domain whose rules say
// nothing (no `all_or_nothing:`) consume: true (the default of
// NewDecider), every limit of a request decided together and none
// consumed when one denies (Limiter.DecideInto); false, each limit on its
// own, as envoyproxy/ratelimit counts: a limit that allows is consumed
// even when another denies, and a denied hit with room left is consumed
// past the limit as a debt (Limiter.DecideEach). sluice serve sets false,
// Envoy's way, unless told otherwise.
func (d *Decider) SetAllOrNothing(all bool) { d.each.Store(!all) }

// AllOrNothing reports how domain's requests consume under the rules in
// force (see SetAllOrNothing).
func (d *Decider) AllOrNothing(domain string) bool {
	if cfg := d.Rules(); cfg != nil {
		if dom := cfg.Domain(domain); dom != nil {
			return d.allOrNothing(dom)
		}
	}
	return !d.each.Load()
}

// allOrNothing is AllOrNothing for a domain of the rules (nil: unknown).
func (d *Decider) allOrNothing(dom *rules.Domain) bool {
	return d.allOrNothingFor(dom, PreferDecider)
}

// allOrNothingFor is allOrNothing with a caller's preference.
func (d *Decider) allOrNothingFor(dom *rules.Domain, pref Preference) bool {
	switch {
	case dom != nil && dom.AllOrNothing != nil:
		return *dom.AllOrNothing
	case pref == PreferAllOrNothing:
		return true
	case pref == PreferEach:
		return false
	}
	return !d.each.Load()
}

// Limiter returns the limiter the Decider decides with.
func (d *Decider) Limiter() *sluice.Limiter { return d.limiter }

// Rules returns the rules in force.
func (d *Decider) Rules() *rules.Config { return d.rules.Load() }

// SetRules replaces the rules in force.
func (d *Decider) SetRules(cfg *rules.Config) { d.rules.Store(cfg) }

// DescriptorOutcome is what became of one request descriptor.
type DescriptorOutcome struct {
	// Match is what the descriptor matched in the rules.
	Status  rules.Status
	StatKey string // the rule's stats key; empty when nothing matched
	Rule    *rules.Rule

	// Override is the ID of the runtime override whose limits the
	// descriptor had instead of the rules' (rules.Match.Runtime), empty
	// when none.
	Override string

	// Cost is the number of hits the descriptor applied (its own cost;
	// Envoy's codec sets it from hits_addend); 0 is a check that consumed
	// nothing.
	Cost int64

	// Limited reports that the descriptor had limits to decide (Status
	// Limited or Overridden); the rest are meaningful only then.
	Limited bool

	// Over reports that a limit of the descriptor denied the request,
	// shadow limits included.
	Over bool

	// ShadowOver reports that the denial came only from shadow-mode
	// limits: the descriptor is allowed.
	ShadowOver bool

	// Quota reports a quota descriptor (its rule's quota_mode, or the
	// Decider's SetQuotaMode): the request is denied by its quota
	// descriptors only when every one of them is over its limit.
	Quota bool

	// Decision is the deciding limit of the descriptor. Under the local
	// failure policy, Remaining is what this node still admits (see
	// Failover).
	Decision sluice.Decision
	Limit    *sluice.Limit
}

// LimitOutcome is one limit decided for a request and its decision.
type LimitOutcome struct {
	Limit    *sluice.Limit
	Decision sluice.Decision
	Cost     int64 // the hits applied (or, in a denied request, not applied)

	// Descriptor is the index of the request descriptor the limit belongs
	// to, or -1 for the domain capacity.
	Descriptor int
}

// Outcome is the full answer to one request, for callers that count or log
// (metrics, response headers, the simulator's summary).
type Outcome struct {
	// Overall is the request's decision: denied when any limit denied it
	// (a descriptor's, or the domain capacity), allowed otherwise; but
	// quota descriptors deny only all together (DescriptorOutcome.Quota).
	Overall     sluice.Decision
	Descriptors []DescriptorOutcome

	// Limits lists every limit decided, in the order of the descriptors
	// and the domain capacity last; Overall.Index indexes it.
	Limits []LimitOutcome

	// Degraded is the failure policy that answered the request because
	// the store failed: FailOpen, FailClosed or FailLocal (see Failover).
	// It is FailDefault, the zero value, when the store answered.
	Degraded rules.FailurePolicy

	// StoreErr is the store's error when Degraded is set, for logs, and
	// Reason why the store could not decide (sluice.ReasonOf(StoreErr)).
	StoreErr error
	Reason   sluice.FailReason
}

// OverLimit reports whether the request is denied: Envoy's OVER_LIMIT.
func (o *Outcome) OverLimit() bool { return !o.Overall.Allowed }

// Reset empties o for reuse by DecideInto, keeping its slices' storage.
func (o *Outcome) Reset() {
	clear(o.Descriptors)
	clear(o.Limits)
	*o = Outcome{Descriptors: o.Descriptors[:0], Limits: o.Limits[:0]}
}

// ErrInvalid is wrapped by every error about the request itself (as opposed
// to a store failure); it is sluice.ErrInvalid.
var ErrInvalid = sluice.ErrInvalid

// ErrTooLarge is wrapped, beside ErrInvalid, by the error of a request over
// one of the bounds below: it is refused before any matching.
var ErrTooLarge = errors.New("request too large")

// Bounds on one request, checked before its descriptors are matched, so
// that no request makes the server do more than a bounded amount of work:
// Envoy sends a handful of descriptors of a few entries each. The
// transports check them again on the wire, before decoding (see
// server.MaxRequestBytes).
const (
	// MaxDescriptors is the most descriptors in one request.
	MaxDescriptors = 256
	// MaxEntries is the most entries in one descriptor (rules nest at
	// most 64 deep, so no rule needs more).
	MaxEntries = 64
	// MaxTotalEntries is the most entries in all the descriptors of one
	// request together.
	MaxTotalEntries = 1024
)

// CheckCounts returns an error wrapping ErrInvalid and ErrTooLarge when a
// request with these counts is over a bound: descriptors, the entries of
// the largest descriptor, and the entries of all together.
func CheckCounts(descriptors, most, total int) error {
	switch {
	case descriptors > MaxDescriptors:
		return fmt.Errorf("%w: %w: more than %d descriptors", ErrInvalid, ErrTooLarge, MaxDescriptors)
	case most > MaxEntries:
		return fmt.Errorf("%w: %w: a descriptor of more than %d entries", ErrInvalid, ErrTooLarge, MaxEntries)
	case total > MaxTotalEntries:
		return fmt.Errorf("%w: %w: more than %d descriptor entries in all", ErrInvalid, ErrTooLarge, MaxTotalEntries)
	}
	return nil
}

// ErrNoRules is returned while no rules are loaded (a Decider made with nil
// rules, before its first SetRules): the service is not ready.
var ErrNoRules = errors.New("no rate limit configuration loaded")

// Decide decides the descriptors descs of domain. An error wrapping
// ErrInvalid means the request is malformed and nothing was consumed;
// ErrNoRules that no rules are loaded. A store failure is answered by the
// domain's failure policy (Outcome.Degraded says which), so that any other
// error is the caller's context ending (context.Canceled or
// DeadlineExceeded) or a store failure that no policy could answer (the
// local policy without a local limiter, or the local limiter failing).
func (d *Decider) Decide(ctx context.Context, domain string, descs []rules.Descriptor) (*Outcome, error) {
	o := new(Outcome)
	if err := d.DecideInto(ctx, domain, descs, o); err != nil {
		return nil, err
	}
	return o, nil
}

// DecideInto is Decide writing into o, whose Descriptors and Limits
// storage it reuses: a server pools Outcomes to answer without allocating
// them. descs is read during the call only. On error o is left reset.
func (d *Decider) DecideInto(ctx context.Context, domain string, descs []rules.Descriptor, o *Outcome) error {
	return d.decide(ctx, domain, descs, o, nil, PreferDecider)
}

// Preference is a caller's default, for one request, for the domains whose
// rules set no all_or_nothing: (see SetAllOrNothing).
type Preference uint8

const (
	PreferDecider      Preference = iota // the Decider's default
	PreferAllOrNothing                   // every limit of the request together
	PreferEach                           // each limit on its own, as Envoy
)

// DecideIntoPreferring is DecideInto with the caller's default pref for a
// domain whose rules say nothing; a domain's all_or_nothing: wins. sluice
// proxy decides on a remote sluice serve preferring all-or-nothing, its
// own default, while Envoy's requests there count Envoy's way.
func (d *Decider) DecideIntoPreferring(ctx context.Context, domain string, descs []rules.Descriptor, o *Outcome, pref Preference) error {
	return d.decide(ctx, domain, descs, o, nil, pref)
}

// DecideDegraded answers as DecideInto does when the store fails with
// cause, without asking the store: by the domain's failure policy (see
// Failover), with o.Degraded and o.StoreErr set. It is for a caller whose
// own backend failed: a client of a remote rate limit service answers with
// it, on a Decider of the same rules, while the service cannot answer.
//
// As with DecideInto, an invalid request is an error wrapping ErrInvalid;
// a request that matches no limit (an unknown domain, descriptors that
// match no rule) needs no store and is answered OK, not degraded; and
// cause itself is returned when no policy answers (the caller's context
// ended, the local policy without a local limiter, or cause wrapping
// ErrInvalid). A nil cause is an error.
func (d *Decider) DecideDegraded(ctx context.Context, domain string, descs []rules.Descriptor, o *Outcome, cause error) error {
	if cause == nil {
		o.Reset()
		return errors.New("decide: DecideDegraded without a cause")
	}
	return d.decide(ctx, domain, descs, o, cause, PreferDecider)
}

// decide is DecideInto, or with a non-nil cause DecideDegraded: the store
// is not asked, and its failure is cause.
func (d *Decider) decide(ctx context.Context, domain string, descs []rules.Descriptor, o *Outcome, cause error, pref Preference) error {
	o.Reset()
	s := d.plans.Get().(*scratch)
	defer d.plans.Put(s)
	s.pref = pref

	if err := d.plan(s, domain, descs); err != nil {
		return err
	}
	p := &s.plan
	if cap(s.out) < len(p.Hits) {
		s.out = make([]sluice.Decision, len(p.Hits))
	}
	out := s.out[:len(p.Hits)]
	hits := p.Hits
	var overall sluice.Decision
	var err error
	// A request with quota descriptors is decided one by one whatever
	// all_or_nothing says: a quota over its limit does not deny the
	// request while another has room, so it must not stop the others
	// from counting either.
	quota := d.hasQuota(p)
	each := quota || !d.allOrNothingFor(p.Domain, pref)
	switch {
	case cause == nil && each:
		overall, err = d.limiter.DecideEach(ctx, hits, out)
	case cause == nil:
		overall, err = d.limiter.DecideInto(ctx, hits, out)
	default:
		overall, err = failedDecision(hits, cause)
	}
	if err != nil {
		// The store failed: the domain's failure policy answers, with
		// hits whose limits are those it enforced.
		storeErr := err
		var policy rules.FailurePolicy
		if hits, overall, policy, err = d.fail(ctx, s, out, storeErr, cause == nil); err != nil {
			return err
		}
		o.Degraded, o.StoreErr, o.Reason = policy, storeErr, sluice.ReasonOf(storeErr)
	} else if cause == nil && len(hits) > 0 && d.spent.pending.Load() {
		// The store answers again: charge it what the local policy
		// admitted meanwhile.
		d.startWriteBack(d.failover.Load().Logger)
	}

	n := len(p.Matches)
	o.Overall = overall
	o.Descriptors = grow(o.Descriptors, n)
	o.Limits = grow(o.Limits, len(hits))
	for i := range hits {
		o.Limits[i] = LimitOutcome{Limit: hits[i].Limit, Decision: out[i], Cost: hits[i].Cost, Descriptor: -1}
	}
	for i := range p.Matches {
		m := &p.Matches[i]
		do := &o.Descriptors[i]
		do.Status, do.StatKey, do.Rule, do.Override, do.Cost = m.Status, m.StatKey, m.Rule, m.Runtime, descs[i].Cost
		if m.Count == 0 {
			continue
		}
		for j := m.First; j < m.First+m.Count; j++ {
			o.Limits[j].Descriptor = i
		}
		do.Limited = true
		dh := hits[m.First : m.First+m.Count]
		dd := sluice.Overall(dh, out[m.First:m.First+m.Count])
		do.Decision, do.Limit = dd, dh[dd.Index].Limit
		do.Over = !dd.Allowed || dd.Shadow
		do.ShadowOver = dd.Allowed && dd.Shadow
		do.Quota = quota && (d.quota.Load() || m.Rule != nil && m.Rule.QuotaMode)
	}
	if quota {
		o.quotaOverall(p.Capacity)
	}
	return nil
}

// hasQuota reports whether a descriptor of the plan is a quota.
func (d *Decider) hasQuota(p *rules.Plan) bool {
	global := d.quota.Load()
	for i := range p.Matches {
		m := &p.Matches[i]
		if m.Count > 0 && (global || m.Rule != nil && m.Rule.QuotaMode) {
			return true
		}
	}
	return false
}

// quotaOverall sets o.Overall as envoyproxy/ratelimit decides a request
// with quota descriptors: denied when a descriptor that is not a quota is
// over its limit (or the domain capacity, the hit at index capacity of
// o.Limits, -1 if none), or when every quota descriptor is.
func (o *Outcome) quotaOverall(capacity int) {
	quotas, quotasOver, otherOver := 0, 0, false
	for i := range o.Descriptors {
		do := &o.Descriptors[i]
		if !do.Limited {
			continue
		}
		over := do.Over && !do.ShadowOver
		switch {
		case do.Quota:
			quotas++
			if over {
				quotasOver++
			}
		case over:
			otherOver = true
		}
	}
	if capacity >= 0 && capacity < len(o.Limits) {
		if c := o.Limits[capacity].Decision; !c.Allowed && !o.Limits[capacity].Limit.Shadow {
			otherOver = true
		}
	}
	if otherOver || quotas > 0 && quotas == quotasOver || o.Overall.Allowed {
		return
	}
	// Only quotas denied, and not all of them: the request passes.
	o.Overall.Allowed, o.Overall.RetryAfter, o.Overall.Blocked = true, 0, false
}

// failedDecision is what the limiter's DecideInto returns for hits when its
// store fails with cause: the hits' own errors first, and no store call
// (so no failure) for a request without hits.
func failedDecision(hits []sluice.Hit, cause error) (sluice.Decision, error) {
	if err := sluice.ValidateHits(hits); err != nil {
		return sluice.Decision{}, err
	}
	if len(hits) == 0 {
		return sluice.Decision{Allowed: true, Index: -1}, nil
	}
	return sluice.Decision{}, cause
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// Check reports whether a request is well formed for the rules in force,
// without deciding anything: the errors Decide would return for the
// request itself.
func (d *Decider) Check(domain string, descs []rules.Descriptor) error {
	s := d.plans.Get().(*scratch)
	defer d.plans.Put(s)
	return d.plan(s, domain, descs)
}

// plan checks descs and matches them against the rules in force into
// s.plan.
func (d *Decider) plan(s *scratch, domain string, descs []rules.Descriptor) error {
	total, most := 0, 0
	for i := range descs {
		if c := descs[i].Cost; c < 0 || c > sluice.MaxCost {
			return fmt.Errorf("%w: descriptor %d: cost %d out of range (0 to %d)", ErrInvalid, i, c, int64(sluice.MaxCost))
		}
		n := len(descs[i].Entries)
		total, most = total+n, max(most, n)
	}
	if err := CheckCounts(len(descs), most, total); err != nil {
		return err
	}
	cfg := d.Rules()
	if cfg == nil {
		return ErrNoRules
	}
	s.cfg = cfg
	s.plan.Runtime = d.Runtime()
	return cfg.Plan(domain, descs, &s.plan)
}

type scratch struct {
	cfg  *rules.Config // the rules plan was matched against
	plan rules.Plan
	out  []sluice.Decision
	pref Preference // the caller's default of all_or_nothing

	// The local policy's hits and their keys (see failover.go).
	local     []sluice.Hit
	localKeys []byte
	localEnds []int
}
