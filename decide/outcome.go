package decide

import (
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/fault"
	"github.com/sluicehq/sluice/rules"
)

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
	// Decider's Config.QuotaMode): the request is denied by its quota
	// descriptors only when every one of them is over its limit.
	Quota bool

	// Release reports a release descriptor (Request.Release): it gave
	// back permits rather than being decided, and is allowed.
	Release bool

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
	// the store (or the remote) failed: FailOpen, FailClosed or FailLocal
	// (see Failover). It is FailDefault, the zero value, when the store
	// answered.
	Degraded rules.FailurePolicy

	// StoreErr is the store's error when Degraded is set, for logs, and
	// Reason why the store could not decide (fault.ReasonOf(StoreErr)).
	StoreErr error
	Reason   fault.Reason

	// Permit holds the request's slots of its concurrency limits when it
	// was admitted with any (nil otherwise): the front door keeps it while
	// the request runs (Permit.Keep) and releases it when the response
	// ends (Permit.Release), whatever the way it ends. Under the local
	// failure policy it is held in the node's own store. Decided by a
	// Remote, it is held by the remote: its Release asks the remote to
	// give the slots back, and nothing renews them (Keep renews nothing),
	// so they expire a TTL after the remote took them unless released.
	Permit *sluice.Permit

	// PermitToken names the permits of Permit, for a front door that
	// cannot keep Permit until the request ends (sluice serve hands it to
	// Envoy, which sends it back when the stream is done): a later
	// request whose descriptor carries it releases them
	// (Request.Release). It holds the permits' random IDs and where they
	// are held, no key and no descriptor value; empty when Permit is nil.
	// Decided by a Remote, it is the remote's token (Remote).
	PermitToken string

	// Released, ReleaseStale, ReleaseRefused and ReleaseFailed count
	// the release descriptors of the request (Request.Release), each in
	// one of them but those whose token is well formed and that have no
	// concurrency limit (sluice proxy sends its token on every
	// descriptor): those whose permits were given back (the store held
	// one at least, and removed it), those whose permits the store no
	// longer held (released before: a release repeated or replayed;
	// expired; never acquired), those whose token was malformed or named
	// no permit of the descriptor's concurrency limits (nothing
	// released), and those the store failed to give back (the permits
	// expire by their TTL), with its error in ReleaseErr.
	Released, ReleaseStale, ReleaseRefused, ReleaseFailed int
	ReleaseErr                                            error

	// ShadowDenied reports a request that the limits denied and global
	// shadow mode let through (GlobalShadow): Overall is then allowed.
	ShadowDenied bool

	// Elapsed is how long the decision took, matching and store
	// included; it is set, for the hooks, only when there are hooks.
	Elapsed time.Duration

	// Headers are the response headers the hooks set for the request
	// (AddHeader), which the front door sends with its answer.
	Headers []Header
	hbuf    []byte // the values of Headers

	res reservation // of a Reserve request, for Settle
}

// Header is one response header a hook set on an outcome. Value is in the
// outcome's storage: it is valid until the outcome is reset.
type Header struct {
	Name  string
	Value []byte
}

// AddHeader adds a response header to o, for the front door to send; value
// is copied. A hook that sets several headers gives each its own call.
func (o *Outcome) AddHeader(name string, value []byte) {
	start := len(o.hbuf)
	o.hbuf = append(o.hbuf, value...)
	o.Headers = append(o.Headers, Header{Name: name, Value: o.hbuf[start:len(o.hbuf):len(o.hbuf)]})
}

// OverLimit reports whether the request is denied: Envoy's OVER_LIMIT.
func (o *Outcome) OverLimit() bool { return !o.Overall.Allowed }

// Reset empties o for reuse by Decide, keeping its slices' storage.
func (o *Outcome) Reset() {
	clear(o.Descriptors)
	clear(o.Limits)
	clear(o.Headers)
	*o = Outcome{Descriptors: o.Descriptors[:0], Limits: o.Limits[:0], Headers: o.Headers[:0], hbuf: o.hbuf[:0],
		res: reservation{hits: o.res.hits[:0], consumed: o.res.consumed[:0], settled: o.res.settled[:0]}}
}

// hasQuota reports whether a descriptor of the plan is a quota.
func (d *Decider) hasQuota(p *rules.Plan) bool {
	global := d.quota
	for i := range p.Matches {
		m := &p.Matches[i]
		if m.Count > 0 && (global || m.Rule != nil && m.Rule.QuotaMode) {
			return true
		}
	}
	return false
}

// markQuotas marks o's quota descriptors, when quota (a request with quota
// descriptors and no permits), and decides the request as
// envoyproxy/ratelimit does one with quotas (quotaOverall).
func (d *Decider) markQuotas(o *Outcome, capacity int, quota bool) {
	for i := range o.Descriptors {
		do := &o.Descriptors[i]
		do.Quota = quota && do.Limited && (d.quota || do.Rule != nil && do.Rule.QuotaMode)
	}
	if quota {
		o.quotaOverall(capacity)
	}
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
