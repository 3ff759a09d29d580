package rlqs

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"hash/maphash"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/rules"
)

// Report answers one usage report of stream st: an action for each of its
// buckets (none for the buckets whose shares failed, unless the domain's
// failure policy says fail_open or fail_closed, and none for a usage
// without a bucket id); the response is never nil. An error
// (InvalidArgument) ends the stream. Reports of one stream must not be
// concurrent.
func (s *Server) Report(ctx context.Context, st *Stream, rep *rlqsv3.RateLimitQuotaUsageReports) (*rlqsv3.RateLimitQuotaResponse, error) {
	if err := st.setDomain(rep.Domain); err != nil {
		return nil, err
	}
	now := s.cfg.Now()
	cfg := s.cfg.Rules()
	resp := &rlqsv3.RateLimitQuotaResponse{}
	var r assignment
	for _, u := range rep.BucketQuotaUsages {
		if u.GetBucketId() == nil || len(u.BucketId.Bucket) == 0 {
			continue // nothing to name in an answer (Envoy never sends it)
		}
		key := canonical(u.BucketId.Bucket)
		b := s.bucket(st, key, u.BucketId, cfg, now)
		if b == nil {
			continue
		}
		elapsed := now.Sub(b.last)
		if b.last.IsZero() {
			elapsed = u.GetTimeElapsed().AsDuration()
		}
		b.last = now
		switch {
		case b.action == actAssign && !s.cfg.ShadowMode:
			r.add(b, u, elapsed)
		case b.action == actAssign: // shadow mode: counted, never enforced
			resp.BucketAction = append(resp.BucketAction, s.act(b.id, actAllow, nil))
		case b.action == actAbandon:
			resp.BucketAction = append(resp.BucketAction, s.act(b.id, actAbandon, nil))
			s.drop(st, key, b, now)
		default:
			resp.BucketAction = append(resp.BucketAction, s.act(b.id, b.action, nil))
		}
	}
	return s.assign(ctx, resp, &r, st.domain), nil
}

// setDomain checks the domain of a report of st: the first names the
// stream's, the others name the same or none.
func (st *Stream) setDomain(domain string) error {
	switch {
	case st.domain == "" && domain == "":
		return status.Error(codes.InvalidArgument, "the first usage report of a stream must name its domain")
	case st.domain == "":
		st.domain = domain
	case domain != "" && domain != st.domain:
		return status.Errorf(codes.InvalidArgument, "usage report for domain %q on a stream of domain %q: open a new stream to change domains", domain, st.domain)
	}
	return nil
}

// bucket returns the bucket of st under key (id's canonical form), matched
// against cfg when it is new, its rules changed or the runtime overrides
// may have; nil when a new bucket is refused (Config.MaxBuckets,
// Config.MaxBytes), which gets no answer.
func (s *Server) bucket(st *Stream, key string, id *rlqsv3.BucketId, cfg *rules.Config, now time.Time) *bucketState {
	b := st.buckets[key]
	fresh := b == nil
	if fresh {
		if len(st.buckets) >= s.cfg.MaxBuckets {
			s.refuseStream(st)
			return nil
		}
		if !s.mem.fits(bucketBase, now) {
			s.refuseNode(now) // not worth matching: the smallest does not fit
			return nil
		}
		b = &bucketState{id: id, client: s.client(st.id, key)}
	}
	// A bucket is matched again when the rules or the runtime overrides
	// changed, or when the window of a schedule it matched has ended.
	if gen, stale := s.runtimeChanged(b, now); stale || b.rules != cfg || cfg == nil || (!b.until.IsZero() && !now.Before(b.until)) {
		s.match(b, cfg, st.domain)
		b.matched, b.gen = now, gen
		if !s.keep(st, key, b, fresh, now) {
			return nil
		}
	}
	return b
}

// assignment is what the assigned buckets of one report ask of the pools:
// one Ask per limit of each bucket, first[i] the first of buckets[i].
type assignment struct {
	asks    []Ask
	buckets []*bucketState
	first   []int
}

// add asks for the limits of bucket b, whose usage u was reported elapsed
// after its last.
func (r *assignment) add(b *bucketState, u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, elapsed time.Duration) {
	if elapsed < minElapsed {
		// A bucket's first report (Envoy sends it with the bucket's
		// first request, and whole seconds of time_elapsed): its count
		// over a second.
		elapsed = time.Second
	}
	perSec := float64(u.NumRequestsAllowed+u.NumRequestsDenied) / elapsed.Seconds()
	// Smoothed over reports (half the last estimate, half the new), so
	// that the noise of short intervals moves shares, and Envoy's
	// buckets, less often.
	if b.reports > 0 {
		perSec = (b.demand + perSec) / 2
	}
	b.demand = perSec
	b.reports++
	r.buckets = append(r.buckets, b)
	r.first = append(r.first, len(r.asks))
	for i, l := range b.limits {
		r.asks = append(r.asks, Ask{Pool: b.pools[i], Client: b.client, Demand: perSec * l.Period.Seconds() / float64(l.Rate)})
	}
}

// assign answers the buckets of r with their shares of the pools, or by
// the failure policy of domain when the shares cannot be computed.
func (s *Server) assign(ctx context.Context, resp *rlqsv3.RateLimitQuotaResponse, r *assignment, domain string) *rlqsv3.RateLimitQuotaResponse {
	if len(r.asks) == 0 {
		return resp
	}
	shares := make([]Share, len(r.asks))
	if err := s.cfg.Pools.Assign(ctx, r.asks, shares); err != nil {
		s.failures.Inc()
		return s.failed(resp, domain, r.buckets, err)
	}
	fracs := make([]float64, 0, 4)
	for i, b := range r.buckets {
		fracs = fracs[:0]
		for j := range b.limits {
			fracs = append(fracs, shares[r.first[i]+j].Share)
		}
		resp.BucketAction = append(resp.BucketAction, s.act(b.id, actAssign, strategyOf(b.limits, fracs, s.cfg.Windows)))
	}
	return resp
}

// keep counts bucket b of st, under key, just matched, at the size of its
// match, and returns false when it is fresh and does not fit in
// Config.MaxBytes: then it is not kept, and gets no answer. A fresh bucket
// that is abandoned is not kept either, but it is answered.
func (s *Server) keep(st *Stream, key string, b *bucketState, fresh bool, now time.Time) bool {
	if b.action == actAbandon {
		return true // answered, then dropped
	}
	n := s.bucketBytes(b, key)
	switch {
	case !fresh:
		s.mem.resize(n - b.bytes)
	case s.mem.take(n, now):
		st.buckets[key] = b
		s.buckets.Inc()
	default:
		s.refuseNode(now)
		return false
	}
	b.bytes = n
	return true
}

// refuseNode counts a fresh bucket refused at Config.MaxBytes, and logs
// one line a minute of those.
func (s *Server) refuseNode(now time.Time) {
	s.refused.WithLabelValues("node").Inc()
	if dropped, ok := s.fullLog.Allow(now); ok {
		s.log.Warn("RLQS buckets are at the node's memory cap: new buckets get no assignment until some are dropped",
			"max_bytes", s.cfg.MaxBytes, "bytes", s.mem.bytes(now), "refused_since_last_line", dropped)
	}
}

// refuseStream counts a fresh bucket of st refused at Config.MaxBuckets,
// and logs the first of each stream.
func (s *Server) refuseStream(st *Stream) {
	s.refused.WithLabelValues("stream").Inc()
	if !st.full {
		st.full = true
		s.log.Warn("RLQS stream has reached its maximum of buckets: new ones get no assignment", "domain", st.domain, "max", s.cfg.MaxBuckets)
	}
}

// drop drops bucket b of st, under key, if it is kept.
func (s *Server) drop(st *Stream, key string, b *bucketState, now time.Time) {
	if st.buckets[key] != b {
		return
	}
	delete(st.buckets, key)
	s.buckets.Dec()
	s.mem.give(b.bytes, now.Add(s.hold))
}

// failed answers the assigned buckets of a report whose shares could not be
// computed: by the domain's failure policy (Config.FailurePolicy) when it
// is fail_open or fail_closed; else not at all, so that Envoy keeps its
// assignments until their TTL and then does what its
// expired_assignment_behavior says.
func (s *Server) failed(resp *rlqsv3.RateLimitQuotaResponse, domain string, assigned []*bucketState, err error) *rlqsv3.RateLimitQuotaResponse {
	policy := rules.FailDefault
	if s.cfg.FailurePolicy != nil {
		policy = s.cfg.FailurePolicy(domain)
	}
	s.log.Warn("shares not computed", "domain", domain, "buckets", len(assigned), "failure_policy", policy, "err", err)
	var act action
	switch policy {
	case rules.FailOpen:
		act = actAllow
	case rules.FailClosed:
		act = actDeny
	default:
		return resp
	}
	for _, b := range assigned {
		resp.BucketAction = append(resp.BucketAction, s.act(b.id, act, nil))
	}
	return resp
}

// act builds one bucket action.
func (s *Server) act(id *rlqsv3.BucketId, a action, strategy *typev3.RateLimitStrategy) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	ba := &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: id}
	name := "abandon"
	switch a {
	case actAbandon:
		ba.BucketAction = &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}
		s.actions.WithLabelValues(name).Inc()
		return ba
	case actAllow:
		strategy = blanket(typev3.RateLimitStrategy_ALLOW_ALL)
	case actDeny:
		strategy = blanket(typev3.RateLimitStrategy_DENY_ALL)
	}
	switch st := strategy.Strategy.(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
		name = "allow_all"
		if st.BlanketRule == typev3.RateLimitStrategy_DENY_ALL {
			name = "deny_all"
		}
	case *typev3.RateLimitStrategy_TokenBucket:
		name = "token_bucket"
	case *typev3.RateLimitStrategy_RequestsPerTimeUnit_:
		name = "requests_per_time_unit"
	}
	s.actions.WithLabelValues(name).Inc()
	ba.BucketAction = &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
		QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(s.cfg.Policy.TTL),
			RateLimitStrategy:    strategy,
		},
	}
	return ba
}

// client returns the participant id of a bucket of a stream: 32 hex
// digits, the node's and stream's in the first 16, the bucket's hash in
// the others (hex digits only, so that ids sort the same in Go and in
// Redis's Lua, whatever its locale).
func (s *Server) client(stream uint64, key string) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], s.node+stream)
	binary.BigEndian.PutUint64(b[8:], maphash.String(s.seed, key))
	return hex.EncodeToString(b[:])
}
