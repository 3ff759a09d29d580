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
// The bound, proved in docs/internals/leases-proof.md: the shares any Envoy may still
// enforce sum to at most 1 at every moment, however late reports arrive
// and whichever streams drop, provided an assignment reaches its Envoy
// within Policy.Grace of being decided.
//
// This package imports the root package, rules, go-control-plane, gRPC
// (with the codec of internal/edges/grpcraw), rueidis and Prometheus' client; no other transport, no store and not
// the decision core: it decides no hits, and is given its Redis client.
package rlqs

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"hash/maphash"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/logsample"
	"github.com/sluicehq/sluice/internal/edges/grpcraw"
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
	// time to live, then applies its expired_assignment_behavior). Nil:
	// no answer, for every domain. The server resolves no policy itself.
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
	until   time.Time       // when the match's schedule window changes, zero if never
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
