// Package rls is the codec of Envoy's rate limit service (RLS v3): it
// converts a RateLimitRequest into the decision core's decide.Request (the
// cost of each descriptor from hits_addend, Envoy's per-request limit) and
// a decide.Outcome into a RateLimitResponse with envoyproxy/ratelimit's
// conventions, and back for a client of a remote service. It converts and
// nothing else: it owns no decider.
//
// It is shared by every front door that speaks RLS (the gRPC service, the
// HTTP JSON API, sluice simulate, the client of a remote service). It does
// no networking and must not import the transports; it imports the root
// package, rules, decide and the Envoy protos.
package rls

import (
	"fmt"
	"math"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/vocab/limits"
	"github.com/sluicehq/sluice/rules"
)

// DialectKey is the gRPC metadata key (and HTTP header) by which a client
// asks for the exact dialect of a response (Response's exact):
// DialectExactValue; Envoy never does. AllOrNothingKey is the one by which
// it states its default of all_or_nothing ("true" or "false") for domains
// that set none.
const (
	DialectKey        = "sluice-dialect"
	DialectExactValue = "exact"
	AllOrNothingKey   = "sluice-all-or-nothing"
)

// PermitKey is the descriptor entry key, and the field of a response's
// dynamic metadata, of a permit token (decide.Outcome.PermitToken): a
// request admitted holding permits of concurrency limits is answered
// with its token in this field, which Envoy keeps under the filter's
// namespace (envoy.filters.http.ratelimit); a descriptor with an entry of
// this key (Envoy's metadata action, at stream done) gives those permits
// back rather than being decided (decide.Request.Release). The entry is
// taken out of the descriptor, so no rule, key, stat or top key sees it.
const PermitKey = "sluice_permit"

// Preference reads a client's all_or_nothing default, the value of
// AllOrNothingKey.
func Preference(v string) decide.Preference {
	switch v {
	case "true":
		return decide.PreferAllOrNothing
	case "false":
		return decide.PreferEach
	}
	return decide.PreferDecider
}

// Request converts req into r, reusing r's storage: the domain, and each
// descriptor's entries, cost (its hits_addend if set, else the request's,
// where 0 means 1), per-request limit and permit token (an entry of
// PermitKey, at most one, never empty: r.Release); r.Token is set, since
// the answer carries the permit token. r.Prefer is left as it is. An error wraps sluice.ErrInvalid.
func Request(req *rlsv3.RateLimitRequest, r *decide.Request) error {
	if req == nil {
		return fmt.Errorf("%w: no request", sluice.ErrInvalid)
	}
	reqCost := int64(req.GetHitsAddend())
	if reqCost == 0 {
		reqCost = 1
	}
	pds := req.GetDescriptors()
	r.Domain = req.GetDomain()
	r.Token = true // the answer carries it, for Envoy's stream-done release
	descs := r.Descriptors[:0]
	release, releases := r.Release[:0], false
	for i, pd := range pds {
		if pd == nil {
			return fmt.Errorf("%w: descriptor %d is null", sluice.ErrInvalid, i)
		}
		if pd.GetIsNegativeHits() {
			return fmt.Errorf("%w: descriptor %d: is_negative_hits is not supported", sluice.ErrInvalid, i)
		}
		// Reuse the entries of the descriptor this one replaces.
		var entries []rules.Entry
		if len(descs) < cap(descs) {
			entries = descs[:len(descs)+1][len(descs)].Entries[:0]
		}
		token := ""
		for _, e := range pd.GetEntries() {
			if e.GetKey() == PermitKey {
				if token != "" || e.GetValue() == "" {
					return fmt.Errorf("%w: descriptor %d: one %s entry with a value is allowed", sluice.ErrInvalid, i, PermitKey)
				}
				token = e.GetValue()
				continue
			}
			entries = append(entries, rules.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		release, releases = append(release, token), releases || token != ""
		desc := rules.Descriptor{Entries: entries, Cost: reqCost}
		if h := pd.GetHitsAddend(); h != nil {
			if h.GetValue() > sluice.MaxCost {
				return fmt.Errorf("%w: descriptor %d: hits_addend %d is too large (at most %d)", sluice.ErrInvalid, i, h.GetValue(), int64(sluice.MaxCost))
			}
			desc.Cost = int64(h.GetValue())
		}
		if o := pd.GetLimit(); o != nil {
			mult := uint32(1)
			if m := o.GetUnitMultiplier(); m != nil {
				mult = m.GetValue()
				if mult == 0 {
					return fmt.Errorf("%w: descriptor %d: limit override unit_multiplier must be positive", sluice.ErrInvalid, i)
				}
			}
			desc.Override = &rules.Override{RequestsPerUnit: o.GetRequestsPerUnit(), Unit: rules.Unit(o.GetUnit()), UnitMultiplier: mult}
		}
		descs = append(descs, desc)
	}
	r.Descriptors = descs
	if !releases {
		clear(release)
		release = release[:0]
	}
	r.Release = release
	return nil
}

// RateLimitRequest converts r into the request a remote rate limit service
// is asked: each descriptor's cost as its hits_addend (the request's, 1,
// when the cost is 1), its per-request limit and its permit token.
func RateLimitRequest(r *decide.Request) (*rlsv3.RateLimitRequest, error) {
	req := &rlsv3.RateLimitRequest{Domain: r.Domain, HitsAddend: 1, Descriptors: make([]*rlv3.RateLimitDescriptor, len(r.Descriptors))}
	for i := range r.Descriptors {
		d := &r.Descriptors[i]
		pd := &rlv3.RateLimitDescriptor{Entries: make([]*rlv3.RateLimitDescriptor_Entry, len(d.Entries))}
		for j, e := range d.Entries {
			pd.Entries[j] = &rlv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value}
		}
		if i < len(r.Release) && r.Release[i] != "" {
			pd.Entries = append(pd.Entries, &rlv3.RateLimitDescriptor_Entry{Key: PermitKey, Value: r.Release[i]})
		}
		if d.Cost != 1 {
			if d.Cost < 0 {
				return nil, fmt.Errorf("%w: descriptor %d: negative cost %d", sluice.ErrInvalid, i, d.Cost)
			}
			pd.HitsAddend = wrapperspb.UInt64(uint64(d.Cost))
		}
		if ov := d.Override; ov != nil {
			pd.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: ov.RequestsPerUnit, Unit: typev3.RateLimitUnit(ov.Unit)}
			if ov.UnitMultiplier != 1 {
				pd.Limit.UnitMultiplier = wrapperspb.UInt32(ov.UnitMultiplier)
			}
		}
		req.Descriptors[i] = pd
	}
	return req, nil
}

// Response builds the RateLimitResponse of o, as envoyproxy/ratelimit
// answers: each limited descriptor with its deciding limit, the remaining
// count and the time until it resets (UntilReset); OVER_LIMIT for the
// descriptors and the request denied (a request that global shadow mode
// let through is OK overall, its descriptors still saying what their
// limits decided); the headers of o.Headers to add; the permit token of a
// request admitted with permits, in the dynamic metadata under PermitKey.
// A fail_open answer knows no limit to tell. A release descriptor is OK.
//
// exact is the dialect sluice's own client asks for (DialectKey): a
// limit's name as sluice names it (the rule's name:, else its stats key,
// with #i for one of several limits) and the reset to the nanosecond.
// Otherwise the response is envoyproxy/ratelimit's: a limit's name is the
// rule's name: (empty when it has none; Envoy adds a name it gets to its
// x-ratelimit-limit header), and the reset is whole seconds, rounded up.
//
// One allocation holds every status with its limit and duration, and with
// one status the response too.
func Response(o *decide.Outcome, exact bool) *rlsv3.RateLimitResponse {
	resp, blocks := newResponse(len(o.Descriptors))
	for i := range o.Descriptors {
		do := &o.Descriptors[i]
		b := &blocks[i]
		st := &b.status
		st.Code = rlsv3.RateLimitResponse_OK
		resp.Statuses[i] = st
		if do.Status == rules.Unlimited {
			// Envoy's answer for unlimited: nothing left to count.
			st.LimitRemaining = math.MaxUint32
			continue
		}
		if !do.Limited {
			if do.Over {
				// Denied with no limit known (a fail_closed answer
				// without rules, a remote's over-limit status
				// without one): come back after the decision's wait.
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
				st.DurationUntilReset = &b.reset
				b.reset.Seconds = WholeSeconds(do.Decision.RetryAfter)
			}
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
		if exact {
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
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if o.Degraded == rules.FailOpen {
		forgetLimits(resp)
	}
	resp.ResponseHeadersToAdd = headerValues(o.Headers)
	if o.PermitToken != "" {
		resp.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{PermitKey: structpb.NewStringValue(o.PermitToken)}}
	}
	return resp
}

// PermitToken is the permit token that resp, Response's answer, carries
// in its dynamic metadata (o.PermitToken), "" if none: what a client of a
// remote sluice serve gives back with PermitKey entries
// (decide.Request.Release) when the request ends. DynamicMetadata puts
// it in the same field.
func PermitToken(resp *rlsv3.RateLimitResponse) string {
	return resp.GetDynamicMetadata().GetFields()[PermitKey].GetStringValue()
}

// headerValues are hs as Envoy's header values: their strings in one
// allocation, the values and their pointers in two more; nil for none.
func headerValues(hs []decide.Header) []*corev3.HeaderValue {
	if len(hs) == 0 {
		return nil
	}
	n := 0
	for _, h := range hs {
		n += len(h.Value)
	}
	var all strings.Builder
	all.Grow(n)
	for _, h := range hs {
		all.Write(h.Value)
	}
	s := all.String()
	vals := make([]corev3.HeaderValue, len(hs))
	out := make([]*corev3.HeaderValue, len(hs))
	start := 0
	for i, h := range hs {
		vals[i].Key, vals[i].Value = h.Name, s[start:start+len(h.Value)]
		start += len(h.Value)
		out[i] = &vals[i]
	}
	return out
}

// newResponse returns a response of n statuses, OK, and the blocks its
// statuses point into.
func newResponse(n int) (*rlsv3.RateLimitResponse, []statusBlock) {
	if n == 1 {
		one := new(oneStatus)
		one.resp.Statuses = one.ptr[:]
		one.resp.OverallCode = rlsv3.RateLimitResponse_OK
		return &one.resp, one.block[:]
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
	return resp, make([]statusBlock, n)
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

// DynamicMetadata is envoyproxy/ratelimit's response dynamic metadata
// (RESPONSE_DYNAMIC_METADATA), for Envoy to route or log on, of req and
// its outcome o: the domain, the request's descriptors (their entries as
// "key=value", their limit and hits_addend when set), the request's
// hits_addend when set, and the metadata of the rules of the descriptors
// that passed, merged; and the permit token, as Response has it. A permit
// token a descriptor carries is not repeated.
func DynamicMetadata(req *rlsv3.RateLimitRequest, o *decide.Outcome) *structpb.Struct {
	fields := map[string]*structpb.Value{"domain": structpb.NewStringValue(req.GetDomain())}
	descs := make([]*structpb.Value, 0, len(req.GetDescriptors()))
	for _, pd := range req.GetDescriptors() {
		f := map[string]*structpb.Value{}
		entries := make([]*structpb.Value, 0, len(pd.GetEntries()))
		for _, e := range pd.GetEntries() {
			if e.GetKey() != PermitKey {
				entries = append(entries, structpb.NewStringValue(e.GetKey()+"="+e.GetValue()))
			}
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
	if o.PermitToken != "" {
		fields[PermitKey] = structpb.NewStringValue(o.PermitToken)
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

// forgetLimits takes out of resp what a fail_open answer cannot know: each
// descriptor's current limit, remaining count and reset.
func forgetLimits(resp *rlsv3.RateLimitResponse) {
	for _, st := range resp.Statuses {
		st.CurrentLimit, st.LimitRemaining, st.DurationUntilReset = nil, 0, nil
	}
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
		if m := limits.MoreAfter(l, *d); m < sluice.Never {
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
