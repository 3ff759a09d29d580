// Package rlqs is a server of Envoy's Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3): Envoys stream usage reports of their
// quota buckets, and the server answers each report with an assignment per
// bucket, a share of the limit the bucket's id matches in the rules.
//
// A bucket id (a map of strings) is matched as one descriptor of the
// report's domain, with the same matching as a descriptor of Envoy's rate
// limit service: its entries in the order of the rules' nesting (sorted by
// key first; when that matches nothing, the other orders of up to five
// entries, in sorted order, until one reaches a rule with a rate limit).
// A bucket that matches no rule is abandoned (AbandonAction); one that
// reaches `unlimited: true`, or a rule in shadow mode, is ALLOW_ALL; a
// limit of zero is DENY_ALL. Every other bucket is a participant of the
// pools of its limits (the counter keys of the match, so buckets of
// several Envoys, or several buckets, that reach one counter share it):
// each participant gets a fair share of each limit by the demand it
// reports (allowed plus denied requests a second), recomputed at every
// report from the reports of every participant (Pools: in Redis, for every
// sluice node on it). Shares are sent as token buckets of the share's
// rate and burst (see strategyOf).
//
// Memory is bounded twice: the buckets of one stream (Config.MaxBuckets)
// and the estimated bytes of the buckets of every stream
// (Config.MaxBytes). A new bucket past either gets no answer, so that
// Envoy applies its no_assignment_behavior (abandoning it would make Envoy
// create it again, and report it, at its next request; ending the stream
// would take the assignments of its other buckets away).
//
// The bound, proved in docs/leases.md: the shares any Envoy may still
// enforce sum to at most 1 at every moment, however late reports arrive
// and whichever streams drop, provided an assignment reaches its Envoy
// within Policy.Grace of being decided.
//
// This package imports the root package, rules, go-control-plane, gRPC
// (with the codec of internal/grpcraw), rueidis and Prometheus' client; no other transport, no store and not
// the decision core: it decides no hits, and is given its Redis client.
package rlqs

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/entrytext"
	"github.com/sluicehq/sluice/internal/grpcraw"
	"github.com/sluicehq/sluice/internal/logsample"
	"github.com/sluicehq/sluice/rules"
)

// Defaults of Config.
const (
	DefaultTTL        = 5 * time.Second
	DefaultGrace      = 2 * time.Second
	DefaultMaxBuckets = 10000
	DefaultMaxBytes   = 64 << 20
	// MaxBucketEntries bounds the entries of a bucket id; a longer id is
	// abandoned.
	MaxBucketEntries = 64
	// minElapsed is the shortest time between two reports that makes a
	// demand estimate.
	minElapsed = 10 * time.Millisecond
	// maxPermuted is the most entries whose orders are all tried.
	maxPermuted = 5
)

// Config configures a Server. Zero fields mean their defaults.
type Config struct {
	// Rules returns the rules in force (a decide.Decider's Rules); nil
	// rules abandon every bucket.
	Rules func() *rules.Config

	// Pools keeps the shares: RedisPools for nodes sharing a Redis,
	// MemPools for one node. Nil: MemPools with Policy.
	Pools Pools

	// Policy: TTL is the assignment_time_to_live sent (DefaultTTL when
	// zero; it must exceed Envoy's reporting_interval), Grace the longest
	// an assignment may take to reach Envoy (DefaultGrace when zero).
	Policy Policy

	// Runtime returns the runtime overrides in force (a decide.Decider's
	// Runtime; nil: none): a bucket that reaches one gets the override's
	// limits, as a descriptor would. A bucket is matched again at its
	// next report after a change: one of the overrides' Generation
	// (overrides.Index), or, for a Runtime without one, a second after
	// its last match.
	Runtime func() rules.Runtime

	// FailurePolicy returns the failure policy of a domain (a
	// decide.Decider's FailurePolicy: its failure_policy, else the
	// server's default), which answers the buckets whose shares cannot be
	// computed (Redis failing): fail_open ALLOW_ALL, fail_closed
	// DENY_ALL, local no answer (Envoy keeps its assignments until their
	// time to live, then applies its expired_assignment_behavior). Nil: a
	// domain's failure_policy alone, no answer for the others.
	FailurePolicy func(domain string) rules.FailurePolicy

	// ShadowMode answers every bucket ALLOW_ALL (the server's global
	// shadow mode: nothing is denied).
	ShadowMode bool

	// Windows is how shares of window limits are sent.
	Windows WindowStrategy

	// MaxBuckets bounds the buckets of one stream (DefaultMaxBuckets when
	// zero), and MaxBytes the memory the buckets of every stream hold
	// together, as the server estimates it (DefaultMaxBytes when zero;
	// BucketBytes tells the estimate: a bucket of one short entry and one
	// limit counts some 1,170 bytes with MemPools, 1,010 without, for some
	// 950 and 800 bytes of heap). A new bucket past either gets no answer:
	// Envoy applies the bucket's no_assignment_behavior and reports it
	// again at its next reporting interval, when it is taken if there is
	// room then. The buckets held stay answered. A bucket dropped
	// (abandoned, or its stream ended) gives its bytes back at once, or,
	// with MemPools, once its pool records may be gone: 2·(TTL+Grace)
	// later.
	MaxBuckets int
	MaxBytes   int64

	Logger   *slog.Logger          // nil: discard
	Registry prometheus.Registerer // nil: no metrics

	// Now is the clock of demand estimates (time.Now when nil).
	Now func() time.Time
}

// Server answers StreamRateLimitQuotas.
type Server struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer

	cfg    Config
	log    *slog.Logger
	node   uint64 // random, part of every participant's id
	seed   maphash.Seed
	stream atomic.Uint64

	mem         budget
	recordBytes int64             // of a pool record in this process (MemPools), per limit of a bucket
	hold        time.Duration     // how long a dropped bucket's bytes still count (its pool records)
	fullLog     logsample.Sampler // the lines of buckets refused at MaxBytes

	streams  prometheus.Gauge
	reports  prometheus.Counter
	actions  *prometheus.CounterVec
	failures prometheus.Counter
	buckets  prometheus.Gauge
	refused  *prometheus.CounterVec
}

// PolicyDefaults returns p with its zero fields set to their defaults.
func PolicyDefaults(p Policy) Policy {
	if p.TTL <= 0 {
		p.TTL = DefaultTTL
	}
	if p.Grace <= 0 {
		p.Grace = DefaultGrace
	}
	return p
}

// New returns a Server for cfg.
func New(cfg Config) (*Server, error) {
	cfg.Policy = PolicyDefaults(cfg.Policy)
	if cfg.Pools == nil {
		cfg.Pools = NewMemPools(cfg.Policy, cfg.Now)
	}
	if cfg.MaxBuckets <= 0 {
		cfg.MaxBuckets = DefaultMaxBuckets
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Rules == nil {
		cfg.Rules = func() *rules.Config { return nil }
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: log, node: binary.LittleEndian.Uint64(b[:]), seed: maphash.MakeSeed(), mem: budget{max: cfg.MaxBytes}}
	s.fullLog.Interval = time.Minute
	if _, ok := cfg.Pools.(*MemPools); ok {
		// A record lives TTL+Grace after the bucket's last report, and
		// MemPools sweeps the expired ones every TTL+Grace.
		s.recordBytes, s.hold = poolRecord, 2*(cfg.Policy.TTL+cfg.Policy.Grace)
	}
	s.streams = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "sluice", Subsystem: "rlqs", Name: "streams",
		Help: "Rate Limit Quota Service streams open on this node."})
	s.reports = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "sluice", Subsystem: "rlqs", Name: "reports_total",
		Help: "Usage reports received."})
	s.actions = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "sluice", Subsystem: "rlqs", Name: "bucket_actions_total",
		Help: "Bucket actions sent, by kind: token_bucket, requests_per_time_unit, allow_all, deny_all, abandon."}, []string{"action"})
	s.failures = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "sluice", Subsystem: "rlqs", Name: "pool_failures_total",
		Help: "Reports whose shares could not be computed (Redis failed): answered by the domain's failure_policy, or not at all."})
	s.buckets = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "sluice", Subsystem: "rlqs", Name: "buckets",
		Help: "Buckets the streams of this node hold."})
	bytes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "sluice", Subsystem: "rlqs", Name: "bucket_bytes",
		Help: "Estimated memory of the buckets this node holds (and of their pool records, in memory), which --rlqs-max-bytes caps."},
		func() float64 { return float64(s.BucketBytes()) })
	s.refused = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "sluice", Subsystem: "rlqs", Name: "buckets_refused_total",
		Help: "Reports of new buckets left unanswered, by the cap they met: stream (the buckets of one stream) or node (--rlqs-max-bytes)."}, []string{"cap"})
	if cfg.Registry != nil {
		for _, c := range []prometheus.Collector{s.streams, s.reports, s.actions, s.failures, s.buckets, bytes, s.refused} {
			if err := cfg.Registry.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

// GRPCServerOptions returns the options a gRPC server needs to serve the
// service of Register: the codec that hands it the reports' bytes
// undecoded (the same as the rate limit service's, which
// server.GRPCServerOptions includes), so that a malformed report is
// answered InvalidArgument rather than gRPC's Internal.
func GRPCServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpcraw.ServerOption()}
}

// Register registers the service on g, which must be made with the
// options of GRPCServerOptions (or of server.GRPCServerOptions): without
// them, every stream ends at its first report.
func (s *Server) Register(g *grpc.Server) { g.RegisterService(&serviceDesc, s) }

// serviceDesc is Envoy's RateLimitQuotaService with its one stream
// decoded by streamRaw rather than by gRPC.
var serviceDesc = func() grpc.ServiceDesc {
	d := rlqsv3.RateLimitQuotaService_ServiceDesc
	d.Streams = []grpc.StreamDesc{{StreamName: "StreamRateLimitQuotas", Handler: streamRaw, ServerStreams: true, ClientStreams: true}}
	return d
}()

// streamRaw is the gRPC handler of StreamRateLimitQuotas: it decodes each
// report itself, so that bytes that are not a report end the stream with
// InvalidArgument.
func streamRaw(srv any, stream grpc.ServerStream) error {
	recv := func() (*rlqsv3.RateLimitQuotaUsageReports, error) {
		var raw grpcraw.Message
		if err := stream.RecvMsg(&raw); err != nil {
			return nil, err
		}
		rep := new(rlqsv3.RateLimitQuotaUsageReports)
		if err := proto.Unmarshal(raw.Bytes, rep); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "malformed RateLimitQuotaUsageReports: %v", err)
		}
		return rep, nil
	}
	send := func(resp *rlqsv3.RateLimitQuotaResponse) error { return stream.SendMsg(resp) }
	return srv.(*Server).serve(stream.Context(), recv, send)
}

// Stream is one stream's buckets: what the server keeps of an Envoy
// between its reports. StreamRateLimitQuotas keeps one per gRPC stream;
// NewStream, Report and CloseStream serve reports from elsewhere (a
// simulation).
type Stream struct {
	id      uint64
	domain  string
	buckets map[string]*bucketState
	full    bool // MaxBuckets reached (logged once)
}

// BucketBytes returns the estimated memory the buckets of every stream
// hold, which Config.MaxBytes caps.
func (s *Server) BucketBytes() int64 { return s.mem.bytes(s.cfg.Now()) }

// bucketState is one bucket of one stream.
type bucketState struct {
	id      *rlqsv3.BucketId
	client  string          // participant id: 32 hex digits
	rules   *rules.Config   // the rules the match was made with
	matched time.Time       // when, server time
	gen     uint64          // and the runtime's Generation then
	action  action          // what the match gave
	limits  []*sluice.Limit // for actAssign
	pools   []string        // the counter key of each limit
	last    time.Time       // the last report, server time
	demand  float64         // requests a second, smoothed
	reports int             // reports seen
	bytes   int64           // its memory as counted (bucketBytes), 0 until kept
}

type action uint8

const (
	actAbandon action = iota
	actAllow
	actDeny
	actAssign
)

// StreamRateLimitQuotas implements the service on a stream whose reports
// gRPC decodes (Register's handler decodes them itself): it answers every
// usage report, with an action for each of its buckets that has one.
func (s *Server) StreamRateLimitQuotas(stream grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) error {
	return s.serve(stream.Context(), stream.Recv, stream.Send)
}

// serve answers the reports of one stream until it ends: every report
// gets a response, one with no actions when none of its buckets has one
// (an empty report, buckets without ids), so that a client that waits for
// an answer gets one.
func (s *Server) serve(ctx context.Context, recv func() (*rlqsv3.RateLimitQuotaUsageReports, error), send func(*rlqsv3.RateLimitQuotaResponse) error) error {
	s.streams.Inc()
	defer s.streams.Dec()
	st := s.NewStream()
	defer s.CloseStream(st)
	for {
		rep, err := recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		s.reports.Inc()
		resp, err := s.Report(ctx, st, rep)
		if err != nil {
			return err
		}
		if err := send(resp); err != nil {
			return err
		}
	}
}

// NewStream returns the state of a new stream.
func (s *Server) NewStream() *Stream {
	return &Stream{id: s.stream.Add(1), buckets: make(map[string]*bucketState)}
}

// CloseStream drops the buckets of st, which ended, giving back what they
// count against Config.MaxBytes; st must not be used after.
func (s *Server) CloseStream(st *Stream) {
	var n int64
	for _, b := range st.buckets {
		n += b.bytes
	}
	s.buckets.Sub(float64(len(st.buckets)))
	st.buckets = nil
	s.mem.give(n, s.cfg.Now().Add(s.hold))
}

// Report answers one usage report of stream st: an action for each of its
// buckets (none for the buckets whose shares failed, unless the domain's
// failure policy says fail_open or fail_closed, and none for a usage
// without a bucket id); the response is never nil. An error
// (InvalidArgument) ends the stream. Reports of one stream must not be
// concurrent.
func (s *Server) Report(ctx context.Context, st *Stream, rep *rlqsv3.RateLimitQuotaUsageReports) (*rlqsv3.RateLimitQuotaResponse, error) {
	switch {
	case st.domain == "" && rep.Domain == "":
		return nil, status.Error(codes.InvalidArgument, "the first usage report of a stream must name its domain")
	case st.domain == "":
		st.domain = rep.Domain
	case rep.Domain != "" && rep.Domain != st.domain:
		return nil, status.Errorf(codes.InvalidArgument, "usage report for domain %q on a stream of domain %q: open a new stream to change domains", rep.Domain, st.domain)
	}
	now := s.cfg.Now()
	cfg := s.cfg.Rules()
	resp := &rlqsv3.RateLimitQuotaResponse{}
	var asks []Ask
	var assigned []*bucketState
	var first []int // per assigned bucket, its first ask
	for _, u := range rep.BucketQuotaUsages {
		if u.GetBucketId() == nil || len(u.BucketId.Bucket) == 0 {
			continue // nothing to name in an answer (Envoy never sends it)
		}
		key := canonical(u.BucketId.Bucket)
		b := st.buckets[key]
		fresh := b == nil
		if fresh {
			if len(st.buckets) >= s.cfg.MaxBuckets {
				s.refuseStream(st)
				continue
			}
			if !s.mem.fits(bucketBase, now) {
				s.refuseNode(now) // not worth matching: the smallest does not fit
				continue
			}
			b = &bucketState{id: u.BucketId, client: s.client(st.id, key)}
		}
		if gen, stale := s.runtimeChanged(b, now); stale || b.rules != cfg || cfg == nil {
			s.match(b, cfg, st.domain)
			b.matched, b.gen = now, gen
			if !s.keep(st, key, b, fresh, now) {
				continue
			}
		}
		elapsed := now.Sub(b.last)
		if b.last.IsZero() {
			elapsed = u.GetTimeElapsed().AsDuration()
		}
		b.last = now
		switch b.action {
		case actAssign:
			if s.cfg.ShadowMode {
				resp.BucketAction = append(resp.BucketAction, s.act(b.id, actAllow, nil))
				continue
			}
			if elapsed < minElapsed {
				// A bucket's first report (Envoy sends it with the
				// bucket's first request, and whole seconds of
				// time_elapsed): its count over a second.
				elapsed = time.Second
			}
			perSec := float64(u.NumRequestsAllowed+u.NumRequestsDenied) / elapsed.Seconds()
			// Smoothed over reports (half the last estimate, half the
			// new), so that the noise of short intervals moves shares,
			// and Envoy's buckets, less often.
			if b.reports > 0 {
				perSec = (b.demand + perSec) / 2
			}
			b.demand = perSec
			b.reports++
			assigned = append(assigned, b)
			first = append(first, len(asks))
			for i, l := range b.limits {
				asks = append(asks, Ask{Pool: b.pools[i], Client: b.client, Demand: perSec * l.Period.Seconds() / float64(l.Rate)})
			}
		case actAbandon:
			resp.BucketAction = append(resp.BucketAction, s.act(b.id, actAbandon, nil))
			s.drop(st, key, b, now)
		default:
			resp.BucketAction = append(resp.BucketAction, s.act(b.id, b.action, nil))
		}
	}
	if len(asks) == 0 {
		return resp, nil
	}
	shares := make([]Share, len(asks))
	if err := s.cfg.Pools.Assign(ctx, asks, shares); err != nil {
		s.failures.Inc()
		return s.failed(resp, cfg, st.domain, assigned, err), nil
	}
	fracs := make([]float64, 0, 4)
	for i, b := range assigned {
		fracs = fracs[:0]
		for j := range b.limits {
			fracs = append(fracs, shares[first[i]+j].Share)
		}
		resp.BucketAction = append(resp.BucketAction, s.act(b.id, actAssign, strategyOf(b.limits, fracs, s.cfg.Windows)))
	}
	return resp, nil
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
func (s *Server) failed(resp *rlqsv3.RateLimitQuotaResponse, cfg *rules.Config, domain string, assigned []*bucketState, err error) *rlqsv3.RateLimitQuotaResponse {
	policy := rules.FailDefault
	switch {
	case s.cfg.FailurePolicy != nil:
		policy = s.cfg.FailurePolicy(domain)
	case cfg != nil:
		if d := cfg.Domain(domain); d != nil {
			policy = d.FailurePolicy
		}
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

// canonical is a bucket id's map as one string, sorted by key, each key
// and value length-prefixed.
func canonical(m map[string]string) string {
	var b []byte
	for _, e := range sortedEntries(m) {
		b = entrytext.AppendField(entrytext.AppendField(b, e.Key), e.Value)
	}
	return string(b)
}

// sortedEntries is a bucket id's map as entries sorted by key.
func sortedEntries(m map[string]string) []rules.Entry {
	entries := make([]rules.Entry, 0, len(m))
	for k, v := range m {
		entries = append(entries, rules.Entry{Key: k, Value: v})
	}
	slices.SortFunc(entries, func(a, b rules.Entry) int { return strings.Compare(a.Key, b.Key) })
	return entries
}

// match sets what bucket b matches in cfg.
func (s *Server) match(b *bucketState, cfg *rules.Config, domain string) {
	b.rules, b.action, b.limits, b.pools = cfg, actAbandon, nil, nil
	m := b.id.Bucket
	if cfg == nil || len(m) > MaxBucketEntries {
		return
	}
	for k, v := range m {
		if len(k) == 0 || len(k) > rules.MaxEntryLen || len(v) > rules.MaxEntryLen {
			return
		}
	}
	entries := sortedEntries(m)
	plan := rules.Plan{Runtime: s.runtime()}
	for {
		if s.matchOrder(b, cfg, domain, entries, &plan) || len(entries) > maxPermuted || !nextPermutation(entries) {
			return
		}
	}
}

// runtime is the runtime overrides in force, nil if none.
func (s *Server) runtime() rules.Runtime {
	if s.cfg.Runtime == nil {
		return nil
	}
	return s.cfg.Runtime()
}

// runtimeChanged reports whether the runtime overrides may have changed
// since b was matched, and their Generation now (read before matching,
// so that a change during the match is seen at the next report).
func (s *Server) runtimeChanged(b *bucketState, now time.Time) (gen uint64, changed bool) {
	switch rt := s.runtime().(type) {
	case nil:
		return 0, false
	case interface{ Generation() uint64 }:
		gen = rt.Generation()
		return gen, gen != b.gen
	default:
		return 0, now.Sub(b.matched) >= rematchEvery
	}
}

// rematchEvery is how long a bucket's match is kept, with runtime
// overrides that tell no Generation, before its next report matches it
// again.
const rematchEvery = time.Second

// matchOrder matches entries in their order; true when they reached a rule
// with a rate limit.
func (s *Server) matchOrder(b *bucketState, cfg *rules.Config, domain string, entries []rules.Entry, plan *rules.Plan) bool {
	descs := []rules.Descriptor{{Entries: entries, Cost: 1}}
	if err := cfg.Plan(domain, descs, plan); err != nil {
		s.log.Debug("bucket id does not make a descriptor", "domain", domain, "err", err)
		return false
	}
	m := plan.Matches[0]
	switch m.Status {
	case rules.Unlimited, rules.Replaced:
		b.action = actAllow
		return true
	case rules.Limited:
	default:
		return false
	}
	if m.Runtime == "" && m.Rule != nil && m.Rule.ShadowMode { // an override is enforced, as in decisions
		b.action = actAllow
		return true
	}
	b.action = actAssign
	for _, h := range plan.Hits {
		if h.Limit.Rate == 0 {
			b.action, b.limits, b.pools = actDeny, nil, nil
			return true
		}
		b.limits = append(b.limits, h.Limit)
		b.pools = append(b.pools, poolKey(h))
	}
	return true
}

// poolKey names the pool of a hit: its counter key and limit.
func poolKey(h sluice.Hit) string {
	l := h.Limit
	return fmt.Sprintf("%s|%d|%d|%d|%d", h.Key, l.Algorithm, l.Rate, l.Period.Milliseconds(), l.Burst)
}

// nextPermutation advances e to its next order by key, false after the
// last.
func nextPermutation(e []rules.Entry) bool {
	i := len(e) - 2
	for i >= 0 && e[i].Key >= e[i+1].Key {
		i--
	}
	if i < 0 {
		return false
	}
	j := len(e) - 1
	for e[j].Key <= e[i].Key {
		j--
	}
	e[i], e[j] = e[j], e[i]
	slices.Reverse(e[i+1:])
	return true
}
