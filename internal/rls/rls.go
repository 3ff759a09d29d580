// Package rls is the codec of Envoy's rate limit service (RLS v3) around
// the decision core: it turns a RateLimitRequest into the core's
// descriptors (the cost of each from hits_addend, Envoy's per-request
// limit), has package decide decide them, and builds the RateLimitResponse
// from the decide.Outcome with envoyproxy/ratelimit's conventions.
//
// It is shared by every front door that speaks RLS (the gRPC service, the
// HTTP JSON API, sluice simulate, the client of a remote service). It does
// no networking and must not import the transports; it imports the root
// package, rules, decide and the Envoy protos.
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
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
)

// Decider answers RLS requests with a decision core: the rules, a limiter
// and the failure policies of a decide.Decider. It is safe for concurrent
// use.
type Decider struct {
	core     *decide.Decider
	convs    sync.Pool // *convScratch
	metadata atomic.Bool
}

// SetDynamicMetadata adds to every response the dynamic metadata of
// envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA, for Envoy to route or
// log on: the domain, the request's descriptors (their entries as
// "key=value", their limit and hits_addend when set), the request's
// hits_addend when set, and the metadata of the rules of the descriptors
// that passed, merged.
func (d *Decider) SetDynamicMetadata(on bool) { d.metadata.Store(on) }

// NewDecider returns a Decider over a new decide.Decider of lim and cfg
// (see decide.NewDecider).
func NewDecider(lim *sluice.Limiter, cfg *rules.Config) *Decider {
	return Wrap(decide.NewDecider(lim, cfg))
}

// Wrap returns a Decider that answers RLS requests with core, so that RLS
// and other front doors can share one core.
func Wrap(core *decide.Decider) *Decider {
	d := &Decider{core: core}
	d.convs.New = func() any { return new(convScratch) }
	return d
}

// Core returns the decision core.
func (d *Decider) Core() *decide.Decider { return d.core }

// Limiter returns the limiter the Decider decides with.
func (d *Decider) Limiter() *sluice.Limiter { return d.core.Limiter() }

// Rules returns the rules in force.
func (d *Decider) Rules() *rules.Config { return d.core.Rules() }

// SetRules replaces the rules in force.
func (d *Decider) SetRules(cfg *rules.Config) { d.core.SetRules(cfg) }

// SetFailover sets how store failures are answered (decide.Decider.SetFailover).
func (d *Decider) SetFailover(f Failover) error { return d.core.SetFailover(f) }

// Failover returns the failure handling in force (decide.Decider.Failover).
func (d *Decider) Failover() Failover { return d.core.Failover() }

// The core's types and errors, under the names this package has always
// given them.
type (
	Failover          = decide.Failover
	DescriptorOutcome = decide.DescriptorOutcome
	LimitOutcome      = decide.LimitOutcome
)

var (
	ErrInvalid  = decide.ErrInvalid
	ErrTooLarge = decide.ErrTooLarge
	ErrNoRules  = decide.ErrNoRules
	CheckCounts = decide.CheckCounts
)

const (
	MaxDescriptors  = decide.MaxDescriptors
	MaxEntries      = decide.MaxEntries
	MaxTotalEntries = decide.MaxTotalEntries
)

// Outcome is the core's outcome of a request and the RateLimitResponse
// built from it.
type Outcome struct {
	decide.Outcome
	Response *rlsv3.RateLimitResponse

	// ReuseResponse lets DecideInto build Response in the storage of the
	// Response it built in an earlier call with this Outcome, instead of
	// allocating one: for callers that never keep a Response past the
	// next decision or Reset. Reset keeps it and the storage.
	ReuseResponse bool

	// Dialect is how Response tells limits and times; the zero value is
	// envoyproxy/ratelimit's. Reset keeps it.
	Dialect Dialect

	// Prefer is the caller's default of all_or_nothing for domains whose
	// rules set none (decide.DecideIntoPreferring); the zero value is the
	// Decider's. Reset keeps it.
	Prefer decide.Preference

	statuses []statusBlock // the storage ReuseResponse reuses
	response *rlsv3.RateLimitResponse
}

// Dialect is how a Response tells each descriptor's limit and reset.
type Dialect uint8

const (
	// DialectEnvoy answers as envoyproxy/ratelimit does: a limit's name is
	// the rule's name: (empty when it has none; Envoy adds a name it gets
	// to its x-ratelimit-limit header), and the reset is whole seconds,
	// rounded up.
	DialectEnvoy Dialect = iota
	// DialectExact tells what sluice knows: a limit's name as sluice names
	// it (the rule's name:, else its stats key, with #i for one of several
	// limits) and the reset to the nanosecond. sluice's own client
	// (rlsclient) asks for it with the gRPC metadata DialectKey:
	// DialectExactValue; Envoy never does.
	DialectExact
)

// DialectKey is the gRPC metadata key (and HTTP header) by which a client
// asks for a dialect; DialectExactValue its value for DialectExact.
// AllOrNothingKey is the one by which it states its default of
// all_or_nothing ("true" or "false") for domains that set none.
const (
	DialectKey        = "sluice-dialect"
	DialectExactValue = "exact"
	AllOrNothingKey   = "sluice-all-or-nothing"
)

// Reset empties o for reuse by DecideInto, keeping its slices' storage. It
// drops the Response, which the caller may still hold, unless
// ReuseResponse is set.
func (o *Outcome) Reset() {
	o.Outcome.Reset()
	o.Response = nil
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
// them. It allocates a new o.Response, which the caller owns (unless
// o.ReuseResponse). On error o is left reset.
func (d *Decider) DecideInto(ctx context.Context, req *rlsv3.RateLimitRequest, o *Outcome) error {
	return d.decide(ctx, req, o, nil)
}

// DecideDegraded answers req as DecideInto does when the store fails with
// cause, without asking the store: by the domain's failure policy (see
// decide.Decider.DecideDegraded). A nil cause is an error.
func (d *Decider) DecideDegraded(ctx context.Context, req *rlsv3.RateLimitRequest, o *Outcome, cause error) error {
	if cause == nil {
		o.Reset()
		return errors.New("rls: DecideDegraded without a cause")
	}
	return d.decide(ctx, req, o, cause)
}

// decide converts req, has the core decide it (DecideDegraded with a
// non-nil cause), and builds the response.
func (d *Decider) decide(ctx context.Context, req *rlsv3.RateLimitRequest, o *Outcome, cause error) error {
	o.Reset()
	s := d.convs.Get().(*convScratch)
	defer d.convs.Put(s)
	if err := s.convert(req); err != nil {
		return err
	}
	var err error
	if cause == nil {
		err = d.core.DecideIntoPreferring(ctx, req.GetDomain(), s.descs, &o.Outcome, o.Prefer)
	} else {
		err = d.core.DecideDegraded(ctx, req.GetDomain(), s.descs, &o.Outcome, cause)
	}
	if err != nil {
		return err
	}
	o.respond()
	if d.metadata.Load() {
		o.Response.DynamicMetadata = dynamicMetadata(req, o)
	}
	return nil
}

// dynamicMetadata is envoyproxy/ratelimit's response dynamic metadata for
// req and its outcome o.
func dynamicMetadata(req *rlsv3.RateLimitRequest, o *Outcome) *structpb.Struct {
	fields := map[string]*structpb.Value{"domain": structpb.NewStringValue(req.GetDomain())}
	descs := make([]*structpb.Value, 0, len(req.GetDescriptors()))
	for _, pd := range req.GetDescriptors() {
		f := map[string]*structpb.Value{}
		entries := make([]*structpb.Value, 0, len(pd.GetEntries()))
		for _, e := range pd.GetEntries() {
			entries = append(entries, structpb.NewStringValue(e.GetKey()+"="+e.GetValue()))
		}
		f["entries"] = structpb.NewListValue(&structpb.ListValue{Values: entries})
		if l := pd.GetLimit(); l != nil {
			f["limit"] = structpb.NewStringValue(prototext.Format(l))
		}
		if h := pd.GetHitsAddend(); h != nil {
			f["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		descs = append(descs, structpb.NewStructValue(&structpb.Struct{Fields: f}))
	}
	fields["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: descs})
	if h := req.GetHitsAddend(); h != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	passed := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i := range o.Descriptors {
		do := &o.Descriptors[i]
		if do.Status != rules.Limited || do.Rule == nil || do.Rule.Metadata == nil || do.Over && !do.ShadowOver {
			continue
		}
		if s, err := structpb.NewStruct(do.Rule.Metadata); err == nil {
			mergeMetadata(passed, s)
		}
	}
	if len(passed.Fields) > 0 {
		fields["metadata"] = structpb.NewStructValue(passed)
	}
	return &structpb.Struct{Fields: fields}
}

// mergeMetadata merges src into dst: a key dst lacks is added, two
// structs under one key are merged, and otherwise dst's value stays (as
// envoyproxy/ratelimit merges).
func mergeMetadata(dst, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		dv, ok := dst.Fields[k]
		if !ok {
			dst.Fields[k] = v
			continue
		}
		if ds, ss := dv.GetStructValue(), v.GetStructValue(); ds != nil && ss != nil {
			mergeMetadata(ds, ss)
		}
	}
}

// respond builds o.Response from the core's outcome, as
// envoyproxy/ratelimit answers: each limited descriptor with its deciding
// limit, the remaining count and the time until it resets (UntilReset);
// OVER_LIMIT for the descriptors and the request denied. A fail_open
// answer knows no limit to tell.
func (o *Outcome) respond() {
	blocks := o.newResponse(len(o.Descriptors))
	for i := range o.Descriptors {
		do := &o.Descriptors[i]
		b := &blocks[i]
		st := &b.status
		st.Code = rlsv3.RateLimitResponse_OK
		o.Response.Statuses[i] = st
		if do.Status == rules.Unlimited {
			// Envoy's answer for unlimited: nothing left to count.
			st.LimitRemaining = math.MaxUint32
			continue
		}
		if !do.Limited {
			continue
		}
		dd := &do.Decision
		if !dd.Allowed {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		st.CurrentLimit = &b.limit
		st.LimitRemaining = clampUint32(dd.Remaining)
		st.DurationUntilReset = &b.reset
		reset := UntilReset(do.Limit, dd)
		if o.Dialect == DialectExact {
			b.setCurrentLimit(do.Limit, do.Limit.Name)
			b.reset.Seconds = int64(reset / time.Second)
			b.reset.Nanos = int32(reset % time.Second)
			continue
		}
		name := ""
		if do.Status == rules.Limited && do.Rule != nil {
			name = do.Rule.Name // the rule's name:, never its stats key
		}
		b.setCurrentLimit(do.Limit, name)
		b.reset.Seconds = WholeSeconds(reset)
	}
	// The domain capacity belongs to no descriptor: when it denies, the
	// request is over limit although every descriptor's own limits allow.
	if o.OverLimit() {
		o.Response.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if o.Degraded == rules.FailOpen {
		forgetLimits(o.Response)
	}
}

// forgetLimits takes out of resp what a fail_open answer cannot know: each
// descriptor's current limit, remaining count and reset.
func forgetLimits(resp *rlsv3.RateLimitResponse) {
	for _, st := range resp.Statuses {
		st.CurrentLimit, st.LimitRemaining, st.DurationUntilReset = nil, 0, nil
	}
}

// Check reports whether req is well formed for the rules in force, without
// deciding anything: the errors Decide would return for the request itself.
func (d *Decider) Check(req *rlsv3.RateLimitRequest) error {
	s := d.convs.Get().(*convScratch)
	defer d.convs.Put(s)
	if err := s.convert(req); err != nil {
		return err
	}
	return d.core.Check(req.GetDomain(), s.descs)
}

// convScratch holds a request's descriptors as the core takes them.
type convScratch struct {
	descs   []rules.Descriptor
	entries []rules.Entry
	ovs     []rules.Override
}

// convert resolves the descriptors of req into s.descs: the cost of each
// (Envoy: the descriptor's hits_addend if set, else the request's, where 0
// means 1) and its override.
func (s *convScratch) convert(req *rlsv3.RateLimitRequest) error {
	if req == nil {
		return fmt.Errorf("%w: no request", ErrInvalid)
	}
	reqCost := int64(req.GetHitsAddend())
	if reqCost == 0 {
		reqCost = 1
	}
	descs := req.GetDescriptors()
	n := 0 // the entries, for the storage below; the core checks the bounds
	for _, pd := range descs {
		n += len(pd.GetEntries())
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

// UntilReset is the duration_until_reset told of a limit l that decided
// d: for a fixed window the time until its window ends, as
// envoyproxy/ratelimit tells it; for the other algorithms the time until
// more quota is available (sluice.Limit.MoreAfter), which sluice's own
// headers tell as the RateLimit field's t and which a client may wait for
// (where a sliding window's end may come before any quota, a bucket's
// refill after it).
func UntilReset(l *sluice.Limit, d *sluice.Decision) time.Duration {
	if l.Algorithm != sluice.FixedWindow {
		if m := l.MoreAfter(*d); m < sluice.Never {
			return max(0, m)
		}
	}
	return max(0, d.ResetAfter)
}

// WholeSeconds is a reset time as envoyproxy/ratelimit tells it: whole
// seconds, rounded up, so that a client never retries early (Envoy's
// x-ratelimit-reset header keeps the seconds alone). A reset within a
// second is 1, never 0; a negative one is 0.
func WholeSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// setCurrentLimit describes l as Envoy's RateLimit in b.limit: its name
// (the rule's name:, empty when the rule has none, as Envoy sends it),
// requests per unit, with the unit and multiplier that spell its period
// exactly (a 90 s period is 90 SECOND).
func (b *statusBlock) setCurrentLimit(l *sluice.Limit, name string) {
	rl := &b.limit
	rl.Name = name
	rl.RequestsPerUnit = clampUint32(l.Rate)
	unit, mult := UnitOf(l.Period)
	rl.Unit = rlsv3.RateLimitResponse_RateLimit_Unit(unit)
	if unit != rules.UnitUnknown && mult != 1 {
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
