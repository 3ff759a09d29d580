// Package rls answers Envoy rate limit service (RLS v3) requests: it turns a
// RateLimitRequest into rules.Descriptors, matches them against the rules,
// decides every matched limit together with a sluice.Limiter, and builds the
// RateLimitResponse with envoyproxy/ratelimit's conventions. When the store
// fails, it answers by the domain's failure policy (Failover).
//
// It is the shared core of every front door that speaks RLS (the gRPC
// service, the HTTP JSON API, sluice simulate). It does no networking and
// must not import the transports; it imports the root package, rules and
// the Envoy protos.
package rls

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
)

// Decider answers RLS requests with the current rules and a limiter. It is
// safe for concurrent use; SetRules swaps the rules atomically.
type Decider struct {
	limiter  *sluice.Limiter
	rules    atomic.Pointer[rules.Config]
	failover atomic.Pointer[failover]
	plans    sync.Pool
}

// NewDecider returns a Decider over lim with the rules cfg. Until
// SetFailover, a store failure is answered fail_open in every domain that
// sets no failure_policy (see Failover).
func NewDecider(lim *sluice.Limiter, cfg *rules.Config) *Decider {
	d := &Decider{limiter: lim}
	d.rules.Store(cfg)
	d.failover.Store(&failover{Failover: Failover{Default: rules.FailOpen, Nodes: 1}})
	d.plans.New = func() any { return new(scratch) }
	return d
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

	// Cost is the number of hits the descriptor applied (its hits_addend,
	// else the request's, where 0 means 1); 0 is a check that consumed
	// nothing.
	Cost int64

	// Limited reports that the descriptor had limits to decide (Status
	// Limited or Overridden); the rest are meaningful only then.
	Limited bool

	// Over reports that a limit of the descriptor denied the request,
	// shadow limits included.
	Over bool

	// ShadowOver reports that the denial came only from shadow-mode
	// limits: the descriptor's response code is OK.
	ShadowOver bool

	// Decision is the deciding limit of the descriptor. Under the local
	// failure policy, Limit is the node's divided copy of the configured
	// limit (see Failover).
	Decision sluice.Decision
	Limit    *sluice.Limit
}

// LimitOutcome is one limit decided for a request and its decision.
type LimitOutcome struct {
	Limit    *sluice.Limit // as enforced: under the local failure policy, the node's copy
	Decision sluice.Decision
	Cost     int64 // the hits applied (or, in a denied request, not applied)

	// Descriptor is the index of the request descriptor the limit belongs
	// to, or -1 for the domain capacity.
	Descriptor int
}

// Outcome is the full answer to one request, for callers that count or log
// (metrics, response headers, the simulator's summary).
type Outcome struct {
	Response    *rlsv3.RateLimitResponse
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

	// ReuseResponse lets DecideInto build Response in the storage of the
	// Response it built in an earlier call with this Outcome, instead of
	// allocating one: for callers that never keep a Response past the
	// next decision or Reset (the HTTP middleware, which reads only the
	// overall code). Reset keeps it and the storage.
	ReuseResponse bool
	statuses      []statusBlock // the storage ReuseResponse reuses
	response      *rlsv3.RateLimitResponse
}

// Reset empties o for reuse by DecideInto, keeping its slices' storage. It
// drops the Response, which the caller may still hold, unless
// ReuseResponse is set.
func (o *Outcome) Reset() {
	clear(o.Descriptors)
	clear(o.Limits)
	*o = Outcome{Descriptors: o.Descriptors[:0], Limits: o.Limits[:0],
		ReuseResponse: o.ReuseResponse, statuses: o.statuses, response: o.response}
}

// newResponse sets o.Response to a response of n statuses, OK, and returns
// the blocks its statuses point into. One allocation holds every status
// with its limit and duration, and with one status the response too; with
// ReuseResponse, none when an earlier call's storage is big enough.
func (o *Outcome) newResponse(n int) []statusBlock {
	var blocks []statusBlock
	switch {
	case o.ReuseResponse && o.response != nil && cap(o.statuses) >= n:
		blocks = o.statuses[:n]
		clear(blocks)
		ptrs := o.response.Statuses[:n]
		o.response.Reset()
		o.response.Statuses = ptrs
		o.Response = o.response
	case n == 1:
		one := new(oneStatus)
		one.resp.Statuses = one.ptr[:]
		blocks = one.block[:]
		o.Response = &one.resp
	default:
		blocks = make([]statusBlock, n)
		o.Response = &rlsv3.RateLimitResponse{Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
	}
	if o.ReuseResponse && o.Response != o.response {
		o.statuses, o.response = blocks[:cap(blocks)], o.Response
	}
	o.Response.OverallCode = rlsv3.RateLimitResponse_OK
	return blocks
}

type scratch struct {
	descs   []rules.Descriptor
	entries []rules.Entry
	ovs     []rules.Override
	cfg     *rules.Config // the rules plan was matched against
	plan    rules.Plan
	out     []sluice.Decision

	// The local policy's hits and their keys (see failover.go).
	local     []sluice.Hit
	localKeys []byte
	localEnds []int
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

// Decide answers req. An error wrapping ErrInvalid means the request is
// malformed (gRPC InvalidArgument, HTTP 400) and nothing was consumed;
// ErrNoRules that no rules are loaded. A store failure is answered by the
// domain's failure policy (Outcome.Degraded says which), so that any other
// error is the caller's context ending (context.Canceled or
// DeadlineExceeded) or a store failure that no policy could answer (the
// local policy without a local limiter, or the local limiter failing).
func (d *Decider) Decide(ctx context.Context, req *rlsv3.RateLimitRequest) (*Outcome, error) {
	o := new(Outcome)
	if err := d.DecideInto(ctx, req, o); err != nil {
		return nil, err
	}
	return o, nil
}

// DecideInto is Decide writing into o, whose Descriptors and Limits
// storage it reuses: a server pools Outcomes to answer without allocating
// them. It allocates a new o.Response, which the caller owns. On error o
// is left reset.
func (d *Decider) DecideInto(ctx context.Context, req *rlsv3.RateLimitRequest, o *Outcome) error {
	return d.decide(ctx, req, o, nil)
}

// DecideDegraded answers req as DecideInto does when the store fails with
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
func (d *Decider) DecideDegraded(ctx context.Context, req *rlsv3.RateLimitRequest, o *Outcome, cause error) error {
	if cause == nil {
		o.Reset()
		return errors.New("rls: DecideDegraded without a cause")
	}
	return d.decide(ctx, req, o, cause)
}

// decide is DecideInto, or with a non-nil cause DecideDegraded: the store
// is not asked, and its failure is cause.
func (d *Decider) decide(ctx context.Context, req *rlsv3.RateLimitRequest, o *Outcome, cause error) error {
	o.Reset()
	s := d.plans.Get().(*scratch)
	defer d.plans.Put(s)

	if err := d.plan(s, req); err != nil {
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
	if cause == nil {
		overall, err = d.limiter.DecideInto(ctx, hits, out)
	} else {
		overall, err = failedDecision(hits, cause)
	}
	if err != nil {
		// The store failed: the domain's failure policy answers, with
		// hits whose limits are those it enforced.
		storeErr := err
		var policy rules.FailurePolicy
		if hits, overall, policy, err = d.fail(ctx, s, out, storeErr); err != nil {
			return err
		}
		o.Degraded, o.StoreErr, o.Reason = policy, storeErr, sluice.ReasonOf(storeErr)
	}

	n := len(p.Matches)
	o.Overall = overall
	o.Descriptors = grow(o.Descriptors, n)
	o.Limits = grow(o.Limits, len(hits))
	for i := range hits {
		o.Limits[i] = LimitOutcome{Limit: hits[i].Limit, Decision: out[i], Cost: hits[i].Cost, Descriptor: -1}
	}
	blocks := o.newResponse(n)
	for i := range p.Matches {
		m := &p.Matches[i]
		do := &o.Descriptors[i]
		do.Status, do.StatKey, do.Rule, do.Cost = m.Status, m.StatKey, m.Rule, s.descs[i].Cost
		b := &blocks[i]
		st := &b.status
		st.Code = rlsv3.RateLimitResponse_OK
		o.Response.Statuses[i] = st
		if m.Count == 0 {
			continue
		}
		for j := m.First; j < m.First+m.Count; j++ {
			o.Limits[j].Descriptor = i
		}
		do.Limited = true
		dh := hits[m.First : m.First+m.Count]
		dd := sluice.Overall(dh, out[m.First:m.First+m.Count])
		lim := dh[dd.Index].Limit
		do.Decision, do.Limit = dd, lim
		do.Over = !dd.Allowed || dd.Shadow
		do.ShadowOver = dd.Allowed && dd.Shadow
		if !dd.Allowed {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		b.setCurrentLimit(lim)
		st.CurrentLimit = &b.limit
		st.LimitRemaining = clampUint32(dd.Remaining)
		reset := max(0, dd.ResetAfter)
		b.reset.Seconds = int64(reset / time.Second)
		b.reset.Nanos = int32(reset % time.Second)
		st.DurationUntilReset = &b.reset
	}
	// The domain capacity belongs to no descriptor: when it denies, the
	// request is over limit although every descriptor's own limits allow.
	if !overall.Allowed {
		o.Response.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if o.Degraded == rules.FailOpen {
		forgetLimits(o.Response)
	}
	return nil
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

// statusBlock is one descriptor status of a response with the messages it
// points to, allocated together.
type statusBlock struct {
	status rlsv3.RateLimitResponse_DescriptorStatus
	limit  rlsv3.RateLimitResponse_RateLimit
	reset  durationpb.Duration
	mult   wrapperspb.UInt32Value
}

// oneStatus is the response to a request of one descriptor, allocated at
// once.
type oneStatus struct {
	resp  rlsv3.RateLimitResponse
	ptr   [1]*rlsv3.RateLimitResponse_DescriptorStatus
	block [1]statusBlock
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// Check reports whether req is well formed for the rules in force, without
// deciding anything: the errors Decide would return for the request itself.
func (d *Decider) Check(req *rlsv3.RateLimitRequest) error {
	s := d.plans.Get().(*scratch)
	defer d.plans.Put(s)
	return d.plan(s, req)
}

// plan converts req and matches it against the rules in force into s.plan.
func (d *Decider) plan(s *scratch, req *rlsv3.RateLimitRequest) error {
	if err := s.convert(req); err != nil {
		return err
	}
	cfg := d.Rules()
	if cfg == nil {
		return ErrNoRules
	}
	s.cfg = cfg
	return cfg.Plan(req.GetDomain(), s.descs, &s.plan)
}

// convert resolves the descriptors of req into s.descs: the cost of each
// (Envoy: the descriptor's hits_addend if set, else the request's, where 0
// means 1) and its override.
func (s *scratch) convert(req *rlsv3.RateLimitRequest) error {
	if req == nil {
		return fmt.Errorf("%w: no request", ErrInvalid)
	}
	reqCost := int64(req.GetHitsAddend())
	if reqCost == 0 {
		reqCost = 1
	}
	descs := req.GetDescriptors()
	n, most := 0, 0
	if len(descs) <= MaxDescriptors {
		for _, pd := range descs {
			n += len(pd.GetEntries())
			most = max(most, len(pd.GetEntries()))
		}
	}
	if err := CheckCounts(len(descs), most, n); err != nil {
		return err
	}
	s.descs = s.descs[:0]
	s.entries = s.entries[:0]
	s.ovs = s.ovs[:0]
	if cap(s.entries) < n {
		s.entries = make([]rules.Entry, 0, n)
	}
	if cap(s.ovs) < len(descs) {
		s.ovs = make([]rules.Override, 0, len(descs))
	}
	for i, pd := range descs {
		if pd == nil {
			return fmt.Errorf("%w: descriptor %d is null", ErrInvalid, i)
		}
		if pd.GetIsNegativeHits() {
			return fmt.Errorf("%w: descriptor %d: is_negative_hits is not supported", ErrInvalid, i)
		}
		start := len(s.entries)
		for _, e := range pd.GetEntries() {
			s.entries = append(s.entries, rules.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		desc := rules.Descriptor{Entries: s.entries[start:len(s.entries):len(s.entries)], Cost: reqCost}
		if h := pd.GetHitsAddend(); h != nil {
			if h.GetValue() > sluice.MaxCost {
				return fmt.Errorf("%w: descriptor %d: hits_addend %d is too large (at most %d)", ErrInvalid, i, h.GetValue(), int64(sluice.MaxCost))
			}
			desc.Cost = int64(h.GetValue())
		}
		if o := pd.GetLimit(); o != nil {
			mult := uint32(1)
			if m := o.GetUnitMultiplier(); m != nil {
				mult = m.GetValue()
				if mult == 0 {
					return fmt.Errorf("%w: descriptor %d: limit override unit_multiplier must be positive", ErrInvalid, i)
				}
			}
			s.ovs = append(s.ovs, rules.Override{
				RequestsPerUnit: o.GetRequestsPerUnit(),
				Unit:            rules.Unit(o.GetUnit()),
				UnitMultiplier:  mult,
			})
			desc.Override = &s.ovs[len(s.ovs)-1]
		}
		s.descs = append(s.descs, desc)
	}
	return nil
}

// setCurrentLimit describes l as Envoy's RateLimit in b.limit: requests
// per unit, with the unit and multiplier that spell its period exactly (a
// 90 s period is 90 SECOND).
func (b *statusBlock) setCurrentLimit(l *sluice.Limit) {
	rl := &b.limit
	rl.Name = l.Name
	rl.RequestsPerUnit = clampUint32(l.Rate)
	unit, mult := UnitOf(l.Period)
	rl.Unit = rlsv3.RateLimitResponse_RateLimit_Unit(unit)
	if mult != 1 {
		b.mult.Value = mult
		rl.UnitMultiplier = &b.mult
	}
}

// UnitOf spells a period as the largest Envoy unit that divides it and a
// multiplier: 1 minute is (Minute, 1), 90 s is (Second, 90). A period that
// no unit divides, or whose multiplier overflows 32 bits, is UnitUnknown.
func UnitOf(period time.Duration) (rules.Unit, uint32) {
	units := [...]rules.Unit{rules.Year, rules.Month, rules.Week, rules.Day, rules.Hour, rules.Minute, rules.Second}
	for _, u := range units {
		ud := u.Duration()
		if period >= ud && period%ud == 0 {
			if m := period / ud; m <= math.MaxUint32 {
				return u, uint32(m)
			}
		}
	}
	return rules.UnitUnknown, 0
}

func clampUint32(v int64) uint32 {
	if v < 0 {
		return 0
	}
	if v > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(v)
}
