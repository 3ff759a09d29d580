// Package decide is the decision core of every front door, and its one
// door: a Decider, made by New from one Config, answers a Request (a
// domain and plain descriptors: entries, a cost, an optional per-request
// limit) with Decide, which matches the descriptors against the rules and
// runtime overrides in force, decides every matched limit with a
// sluice.Limiter, answers a store failure by the domain's failure policy
// (Failover, resolved in one place: FailurePolicy), and says what became of
// each descriptor and limit in an Outcome. A Decider may decide on a
// remote service first (Config.Remote), its own rules then being the
// fallback when the remote cannot answer.
//
// What a front door adds after a decision (global shadow mode, response
// headers, metrics, top keys) is a Hook it registers in Config.Hooks:
// written once, and shared by sluice serve (gRPC and HTTP JSON), the
// proxy, the httplimit middleware and the simulator. Transports are codecs
// around the core: they turn their messages into a Request and an Outcome
// into their answers, and decide nothing themselves.
//
// This package imports the root package, rules and the standard library.
// It must not import protobuf, gRPC, a transport or a store.
package decide

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/fault"
	"github.com/sluicehq/sluice/internal/vocab/bounds"
	"github.com/sluicehq/sluice/rules"
)

// Config configures a Decider. Zero fields mean the default written in
// their comment; Limiter is required.
type Config struct {
	// Limiter decides the limits, over the store. Required.
	Limiter *sluice.Limiter

	// Rules are the rules in force at first. Nil: every request is
	// answered ErrNoRules until SetRules (or, with a Remote, answered by
	// the remote alone).
	Rules *rules.Config

	// Runtime, when set, is consulted by every decision before the rules:
	// the runtime overrides (rules.Runtime).
	Runtime rules.Runtime

	// CountEach is how the requests of a domain whose rules say nothing
	// (no `all_or_nothing:`) consume. False, the default: every limit of
	// a request is decided together, and none is consumed when one
	// denies (sluice.Limiter.Take). True: each limit on its own, as
	// envoyproxy/ratelimit counts: a limit that allows is consumed even
	// when another denies, and a denied hit with room left is consumed
	// past the limit as a debt (sluice.Limiter.TakeEach). sluice serve
	// sets it, Envoy's way, unless told otherwise. A request's own
	// Preference comes before it, a domain's all_or_nothing before both.
	CountEach bool

	// QuotaMode makes every limited descriptor a quota, as if each rule
	// set quota_mode (envoyproxy/ratelimit's QUOTA_MODE): a request is
	// denied by its descriptors only when all of them are over their
	// limits.
	QuotaMode bool

	// Failover says how a store failure is answered (see Failover). The
	// zero value answers fail_open in every domain that sets no
	// failure_policy.
	Failover Failover

	// Remote, when set, decides every request first: the Decider's own
	// rules, limiter and failure policies answer only the requests the
	// remote cannot (see Remote).
	Remote Remote

	// Hooks are told of every request Decide answers, in this order,
	// after the decision (see Hook).
	Hooks []Hook

	// Logger receives what the core does on its own: the write-backs of
	// what the local failure policy admitted. Nil discards.
	Logger *slog.Logger

	// Earliest is a clock at or behind the store's, never ahead of it:
	// Decide reads it before taking a reservation (Request.Reserve), and a
	// refund never returns more than the reservation still holds after the
	// time since (see Settle). It may return the zero time when it knows
	// nothing of the store's clock: the reservations taken then are not
	// refunded. Nil means Now, or time.Now: exact for a memstore on the
	// process's clock; over Redis, give redisstore.Store.Earliest, the
	// estimate of Redis's clock less its error (sluice serve and proxy do).
	Earliest func() time.Time

	// Now is the store's clock, which chooses the window of rules with
	// schedules and the period of calendar limits (rules.Plan.Now): read
	// once per decision, and only for such rules. Nil means time.Now, the
	// clock of a memstore made without one; over Redis, give
	// redisstore.Store.Now, its estimate of Redis's clock (sluice serve and
	// proxy do).
	Now func() time.Time
}

// Request is one request to decide.
type Request struct {
	// Domain is the rules domain of the request. Required.
	Domain string

	// Descriptors are the request's descriptors, each with its entries, its
	// cost (0 peeks) and optionally its own limit. They are read during
	// Decide only: the Decider copies what it keeps.
	Descriptors []rules.Descriptor

	// Prefer is the caller's default of all_or_nothing for a domain whose
	// rules set none; the zero value is the Decider's (Config.CountEach).
	Prefer Preference

	// Reserve marks the descriptors' costs as reservations, each settled
	// with Settle once its real cost is known. Their limits are decided
	// all together whatever all_or_nothing says (but for quota
	// descriptors): a denied request must hold nothing it will not settle.
	Reserve bool

	// Token asks for Outcome.PermitToken when the request is admitted
	// holding permits: for a front door that hands the token to its
	// caller to release with later (the RLS codec). Others keep the
	// Permit and build no token.
	Token bool

	// Release, when not empty, has one string per descriptor: a
	// descriptor whose string is a permit token (Outcome.PermitToken of
	// an earlier request) is not decided but releases the permits the
	// token names on its own concurrency limits, those that a request of
	// its entries would hold; one whose string is empty is decided as
	// usual. A release consumes nothing and is answered OK; a token that
	// is malformed or names no permit of the descriptor releases nothing.
	// Outcome.Released, ReleaseStale, ReleaseRefused and ReleaseFailed
	// count what became of them (permittoken.go).
	Release []string
}

// Preference is a caller's default, for one request, of how a domain whose
// rules set no all_or_nothing: consumes (see Config.CountEach).
type Preference uint8

const (
	PreferDecider      Preference = iota // the Decider's default
	PreferAllOrNothing                   // every limit of the request together
	PreferEach                           // each limit on its own, as Envoy
)

// Remote decides requests on a remote rate limit service (the client of
// a remote sluice serve, or envoyproxy/ratelimit, is one). Ask fills o, as
// Decide documents it, from the remote's answer, and must leave o reset on
// error. When the remote holds permits of concurrency limits for the
// request (a sluice serve's answer names them in a permit token), Ask
// puts the token in o.PermitToken, and the Decider makes o.Permit of it,
// whose Release asks the remote again: r's descriptors, each with the
// token (Request.Release), as Envoy does when its stream is done. An
// error wrapping sluice.ErrInvalid means the remote refused the request
// itself; the end of ctx is returned as it is. Any other error means the
// remote could not answer: the Decider then answers by the domain's
// failure policy, on its own rules (without them, by its default policy:
// fail_closed denies every descriptor, retry after a second; anything else
// allows them), with Outcome.Degraded set and Outcome.StoreErr the
// remote's error.
type Remote interface {
	Ask(ctx context.Context, r *Request, o *Outcome) error
}

// A Hook is what a front door adds after every decision: global shadow
// mode (GlobalShadow), response headers, metrics, top keys. It is called,
// for every request Decide answers, with the request and its outcome (err
// nil), which it may change (GlobalShadow lets a denial through), or with
// the error Decide returns (o then reset). Hooks run in the order of
// Config.Hooks, on the caller's goroutine: they must be fast, safe for
// concurrent use, and must not keep r, o or anything in them after they
// return.
type Hook func(ctx context.Context, r *Request, o *Outcome, err error)

// Decider decides requests with the rules in force and a limiter: its one
// entry point is Decide. It is safe for concurrent use; SetRules swaps the
// rules atomically.
type Decider struct {
	limiter  *sluice.Limiter
	rules    atomic.Pointer[rules.Config]
	runtime  rules.Runtime
	storeNow func() time.Time // Config.Now
	earliest func() time.Time // Config.Earliest, defaulted
	retries  settleRetries
	each     bool
	quota    bool
	failover Failover
	remote   Remote
	hooks    []Hook
	log      *slog.Logger
	plans    sync.Pool

	spent    ledger       // what the local failure policy admitted, to write back
	held     handOvers    // the permits it holds, to hand over
	clock    func() int64 // the write-back's clock (tests); nil: time.Now
	budgetMu sync.Mutex   // the local policy's budget charges (budget)
}

// New checks cfg and returns a Decider of it.
func New(cfg Config) (*Decider, error) {
	if cfg.Limiter == nil {
		return nil, errors.New("decide: Config.Limiter is required")
	}
	f, err := cfg.Failover.withDefaults()
	if err != nil {
		return nil, err
	}
	for i, h := range cfg.Hooks {
		if h == nil {
			return nil, fmt.Errorf("decide: Config.Hooks[%d] is nil", i)
		}
	}
	d := &Decider{
		limiter:  cfg.Limiter,
		runtime:  cfg.Runtime,
		storeNow: cfg.Now,
		earliest: cfg.Earliest,
		each:     cfg.CountEach,
		quota:    cfg.QuotaMode,
		failover: f,
		remote:   cfg.Remote,
		hooks:    cfg.Hooks,
		log:      cfg.Logger,
	}
	if d.earliest == nil {
		d.earliest = cfg.Now
	}
	if d.earliest == nil {
		d.earliest = time.Now
	}
	d.rules.Store(cfg.Rules)
	d.plans.New = func() any { return new(scratch) }
	d.watchStore()
	return d, nil
}

// ErrNoRules is returned while no rules are loaded (a Decider made with nil
// rules, before its first SetRules): the service is not ready.
var ErrNoRules = errors.New("no rate limit configuration loaded")

// Decide decides r into o, whose storage it reuses (a server pools its
// Outcomes to answer without allocating them), then tells the hooks. r
// escapes to the heap (the hooks are given it), so a caller that decides
// often reuses its Request as it does its Outcome. An
// error wrapping sluice.ErrInvalid means the request is malformed and nothing was
// consumed; ErrNoRules that no rules are loaded. A store failure (or a
// remote's) is answered by the domain's failure policy (o.Degraded says
// which), so that any other error is the caller's context ending
// (context.Canceled or DeadlineExceeded) or a failure that no policy
// could answer (the local policy without a local limiter, or the local
// limiter failing). On error o is left reset.
func (d *Decider) Decide(ctx context.Context, r *Request, o *Outcome) error {
	var start time.Time
	if len(d.hooks) > 0 {
		start = time.Now()
	}
	err := d.decide(ctx, r, o)
	if len(d.hooks) == 0 {
		return err
	}
	o.Elapsed = time.Since(start)
	for _, h := range d.hooks {
		h(ctx, r, o, err)
	}
	return err
}

// decide is Decide without the hooks: the permits of the release
// descriptors given back, and the other descriptors decided.
func (d *Decider) decide(ctx context.Context, r *Request, o *Outcome) error {
	if len(r.Release) > 0 {
		return d.decideReleasing(ctx, r, o)
	}
	return d.decideAll(ctx, r, o)
}

// decideAll decides every descriptor of r: on the remote first, if there
// is one, else (or when it cannot answer) on the rules.
func (d *Decider) decideAll(ctx context.Context, r *Request, o *Outcome) error {
	if d.remote == nil {
		return d.local(ctx, r, o, nil)
	}
	err := d.remote.Ask(ctx, r, o)
	switch {
	case err == nil:
		if o.PermitToken != "" && o.Permit == nil {
			d.holdRemote(ctx, r, o)
		}
		return nil
	case errors.Is(err, sluice.ErrInvalid) || ctx.Err() != nil:
		o.Reset()
		return err
	}
	o.Reset()
	if d.Rules() == nil {
		return d.blind(r, o, err)
	}
	return d.local(ctx, r, o, err)
}

// GlobalShadow is the hook of a global shadow mode (envoyproxy/ratelimit's
// SHADOW_MODE, sluice serve --shadow-mode, the proxy's and httplimit's
// ShadowMode): every request is decided and counted, but a denied one is
// let through, with o.ShadowDenied set. Each descriptor still says what
// its limits decided. Register it after the hooks that must see the
// denial (Envoy's own headers), before those that tell the client.
func GlobalShadow(_ context.Context, _ *Request, o *Outcome, err error) {
	if err != nil || o.Overall.Allowed {
		return
	}
	o.Overall.Allowed, o.Overall.RetryAfter, o.Overall.Blocked = true, 0, false
	o.ShadowDenied = true
}

// Rules returns the rules in force.
func (d *Decider) Rules() *rules.Config { return d.rules.Load() }

// SetRules replaces the rules in force (a reload): requests already
// deciding finish with the rules they started with.
func (d *Decider) SetRules(cfg *rules.Config) { d.rules.Store(cfg) }

// Limiter returns the limiter the Decider decides with.
func (d *Decider) Limiter() *sluice.Limiter { return d.limiter }

// Runtime returns the runtime overrides the Decider consults (Config.Runtime).
func (d *Decider) Runtime() rules.Runtime { return d.runtime }

// AllOrNothing reports how domain's requests consume under the rules in
// force, for callers without a preference (see Config.CountEach).
func (d *Decider) AllOrNothing(domain string) bool {
	var dom *rules.Domain
	if cfg := d.Rules(); cfg != nil {
		dom = cfg.Domain(domain)
	}
	return d.allOrNothingFor(dom, PreferDecider)
}

// allOrNothingFor is AllOrNothing for a domain of the rules (nil: unknown)
// and a caller's preference.
func (d *Decider) allOrNothingFor(dom *rules.Domain, pref Preference) bool {
	switch {
	case dom != nil && dom.AllOrNothing != nil:
		return *dom.AllOrNothing
	case pref == PreferAllOrNothing:
		return true
	case pref == PreferEach:
		return false
	}
	return !d.each
}

// local decides r on the rules in force into o. With a non-nil cause (the
// remote could not answer), the store is not asked: its failure is cause.
func (d *Decider) local(ctx context.Context, r *Request, o *Outcome, cause error) error {
	o.Reset()
	s := d.plans.Get().(*scratch)
	defer d.plans.Put(s)
	s.pref = r.Prefer

	if err := d.plan(s, r.Domain, r.Descriptors); err != nil {
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
	// A request that holds permits is decided all or nothing, whatever
	// all_or_nothing and quotas say: refused a slot, it must take nothing
	// from its rates, and refused by a rate, hold no slot.
	quota := d.hasQuota(p)
	permits := hasPermits(hits)
	each := !permits && (quota || !r.Reserve && !d.allOrNothingFor(p.Domain, r.Prefer))
	var at time.Time
	if r.Reserve {
		at = d.earliest()
	}
	if cause == nil {
		err = d.countedFirst(ctx, hits, permits)
	}
	switch {
	case err != nil:
		// It could not: the failure policy answers.
	case cause == nil && permits:
		o.Permit, overall, err = d.acquire(ctx, s, hits, out)
	case cause == nil && each:
		overall, err = d.limiter.TakeEach(ctx, hits, out)
	case cause == nil:
		overall, err = d.limiter.Take(ctx, hits, out)
	default:
		overall, err = failedDecision(hits, cause)
	}
	if err != nil {
		// The store failed: the domain's failure policy answers, with
		// hits whose limits are those it enforced.
		if hits, overall, err = d.byPolicy(ctx, s, r, o, err, cause == nil); err != nil {
			return err
		}
	} else {
		if o.Permit != nil && r.Token {
			o.PermitToken = permitToken(hits, hits, 0)
			d.granted(o.Permit, hits, out)
		}
		if cause == nil {
			d.storeAnswered(len(hits) > 0)
		}
	}
	if r.Reserve {
		o.note(hits, out, each, overall.Allowed, at, o.Degraded)
	}
	o.fill(p, hits, out, r.Descriptors, overall)
	d.markQuotas(o, p.Capacity, quota && !permits) // with permits: all or nothing
	return nil
}

// fill writes into o the plan p's matches, its hits as decided (out) and
// the overall decision.
func (o *Outcome) fill(p *rules.Plan, hits []sluice.Hit, out []sluice.Decision, descs []rules.Descriptor, overall sluice.Decision) {
	o.Overall = overall
	o.Descriptors = grow(o.Descriptors, len(p.Matches))
	o.Limits = grow(o.Limits, len(hits))
	for i := range hits {
		o.Limits[i] = LimitOutcome{Limit: hits[i].Limit, Decision: out[i], Cost: hits[i].Cost, Descriptor: -1}
	}
	for i := range p.Matches {
		m := &p.Matches[i]
		do := &o.Descriptors[i]
		do.Status, do.StatKey, do.Rule, do.Cost, do.Override = m.Status, m.StatKey, m.Rule, descs[i].Cost, m.Runtime
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
	}
}

// blind answers r by the default failure policy without rules, the remote
// having failed with cause: fail_closed denies every descriptor (no rules
// say which are limited), retry after a second; any other policy allows
// them all, with no limit known.
func (d *Decider) blind(r *Request, o *Outcome, cause error) error {
	if err := checkRequest(r); err != nil {
		return err
	}
	closed := d.failover.Default == rules.FailClosed
	o.Degraded, o.StoreErr, o.Reason = rules.FailOpen, cause, fault.ReasonOf(cause)
	o.Overall = sluice.Decision{Allowed: true, Index: -1}
	if closed {
		o.Degraded = rules.FailClosed
		o.Overall = sluice.Decision{ResetAfter: failClosedWait, RetryAfter: failClosedWait, Index: -1}
	}
	o.Descriptors = grow(o.Descriptors, len(r.Descriptors))
	for i := range o.Descriptors {
		do := &o.Descriptors[i]
		do.Cost = r.Descriptors[i].Cost
		do.Decision = sluice.Decision{Allowed: true}
		if closed {
			do.Over = true
			do.Decision = sluice.Decision{ResetAfter: failClosedWait, RetryAfter: failClosedWait}
		}
	}
	return nil
}

// checkRequest reports what makes r invalid whatever the rules: no domain,
// no descriptors, or more of them than the bounds allow.
func checkRequest(r *Request) error {
	switch {
	case r.Domain == "":
		return fmt.Errorf("%w: rate limit domain must not be empty", sluice.ErrInvalid)
	case len(r.Descriptors) == 0:
		return fmt.Errorf("%w: rate limit descriptor list must not be empty", sluice.ErrInvalid)
	}
	return checkDescriptors(r.Descriptors)
}

// checkDescriptors checks the costs and counts of descs against the bounds.
func checkDescriptors(descs []rules.Descriptor) error {
	total, most := 0, 0
	for i := range descs {
		if c := descs[i].Cost; c < 0 || c > sluice.MaxCost {
			return fmt.Errorf("%w: descriptor %d: cost %d out of range (0 to %d)", sluice.ErrInvalid, i, c, int64(sluice.MaxCost))
		}
		n := len(descs[i].Entries)
		total, most = total+n, max(most, n)
	}
	return bounds.CheckCounts(len(descs), most, total)
}

// failedDecision is what the limiter's Take returns for hits when its
// store fails with cause: no store call (so no failure) for a request
// without hits. (The rules' plan has checked the hits: their number,
// their keys' length and their limits.)
func failedDecision(hits []sluice.Hit, cause error) (sluice.Decision, error) {
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

// Check reports whether r is well formed for the rules in force, without
// deciding anything: the errors Decide would return for the request
// itself.
func (d *Decider) Check(r *Request) error {
	s := d.plans.Get().(*scratch)
	defer d.plans.Put(s)
	return d.plan(s, r.Domain, r.Descriptors)
}

// plan checks descs and matches them against the rules in force into
// s.plan.
func (d *Decider) plan(s *scratch, domain string, descs []rules.Descriptor) error {
	if err := checkDescriptors(descs); err != nil {
		return err
	}
	cfg := d.Rules()
	if cfg == nil {
		return ErrNoRules
	}
	s.cfg = cfg
	s.plan.Runtime = d.runtime
	s.plan.Now = d.storeNow
	return cfg.Plan(domain, descs, &s.plan)
}

type scratch struct {
	cfg  *rules.Config // the rules plan was matched against
	plan rules.Plan
	out  []sluice.Decision
	pref Preference // the caller's default of all_or_nothing

	// The local policy's hits and their keys, the permit it holds and
	// the number of nodes it shared the slots among (see failover.go).
	permit    *sluice.Permit
	local     []sluice.Hit
	localKeys []byte
	localEnds []int
	nodes     int64

	rel releaseScratch // a request's release descriptors (permittoken.go)

	reserved []sluice.Hit // the hits with the other nodes' shares reserved (reserving)
}
