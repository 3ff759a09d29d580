package rlqs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/decision/overrides"
	"github.com/sluicehq/sluice/internal/edges/grpcraw"
	"github.com/sluicehq/sluice/internal/edges/rlqs"
	"github.com/sluicehq/sluice/internal/testsupport/metrictest"
	"github.com/sluicehq/sluice/internal/testsupport/rlqstest"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

const testRules = `
domain: quota
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000}
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 600}
  - key: free
    rate_limit: {unlimited: true}
  - key: banned
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: bucketed
    rate_limit: {algorithm: token_bucket, unit: second, requests_per_unit: 200, burst: 50}
`

// serve starts an RLQS server on a real loopback listener and returns a
// client of go-control-plane connected to it.
func serve(t *testing.T, cfg rlqs.Config) rlqsv3.RateLimitQuotaServiceClient {
	t.Helper()
	return rlqsv3.NewRateLimitQuotaServiceClient(listen(t, cfg))
}

// listen starts an RLQS server on a real loopback listener and returns a
// connection to it.
func listen(t *testing.T, cfg rlqs.Config) *grpc.ClientConn {
	t.Helper()
	s, err := rlqs.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(rlqs.GRPCServerOptions()...)
	s.Register(g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(ln)
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func usage(bucket map[string]string, allowed, denied uint64, elapsed time.Duration) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		BucketId:           &rlqsv3.BucketId{Bucket: bucket},
		TimeElapsed:        durationpb.New(elapsed),
		NumRequestsAllowed: allowed,
		NumRequestsDenied:  denied,
	}
}

// describe turns an action into a short string for comparisons.
func describe(a *rlqsv3.RateLimitQuotaResponse_BucketAction) string {
	if a.GetAbandonAction() != nil {
		return "abandon"
	}
	qa := a.GetQuotaAssignmentAction()
	if qa == nil {
		return "none"
	}
	s := qa.GetRateLimitStrategy()
	var b strings.Builder
	switch {
	case s.GetTokenBucket() != nil:
		tb := s.GetTokenBucket()
		b.WriteString("token_bucket max=" + strconv.FormatUint(uint64(tb.MaxTokens), 10) + " per_fill=" + strconv.FormatUint(uint64(tb.GetTokensPerFill().GetValue()), 10) + " fill=" + tb.GetFillInterval().AsDuration().String())
	case s.GetRequestsPerTimeUnit() != nil:
		r := s.GetRequestsPerTimeUnit()
		b.WriteString("per_unit " + strconv.FormatUint(r.RequestsPerTimeUnit, 10) + "/" + r.TimeUnit.String())
	default:
		b.WriteString(s.GetBlanketRule().String())
	}
	b.WriteString(" ttl=" + qa.GetAssignmentTimeToLive().AsDuration().String())
	return b.String()
}

// TestActions: each kind of bucket gets its action, on a real gRPC stream:
// a share of a limited rule as a token bucket (alone, all of it), ids
// matched whatever the order of the rules' nesting, ALLOW_ALL for
// unlimited and shadow rules, DENY_ALL for a limit of zero, abandon for
// what matches nothing.
func TestActions(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := rulestest.Config(t, testRules)
	client := serve(t, rlqs.Config{Rules: func() *rules.Config { return cfg }, Policy: rlqs.Policy{TTL: 3 * time.Second}, Registry: reg})
	stream, err := client.StreamRateLimitQuotas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		bucket map[string]string
		want   string
	}{
		{map[string]string{"tenant": "acme"}, "token_bucket max=1000 per_fill=1000 fill=1s ttl=3s"},
		// sorted, path comes first, which the rules do not nest that way:
		// the other order matches tenant -> path (600 a minute: 10 a
		// second, so the fill interval is 10 s for 100 tokens, and the
		// bucket holds one fill interval's tokens, not the minute's 600).
		{map[string]string{"tenant": "acme", "path": "/x"}, "token_bucket max=100 per_fill=100 fill=10s ttl=3s"},
		{map[string]string{"free": "yes"}, "ALLOW_ALL ttl=3s"},
		{map[string]string{"trial": "t1"}, "ALLOW_ALL ttl=3s"},
		{map[string]string{"banned": "b"}, "DENY_ALL ttl=3s"},
		{map[string]string{"bucketed": "k"}, "token_bucket max=50 per_fill=200 fill=1s ttl=3s"},
		{map[string]string{"nobody": "x"}, "abandon"},
		{map[string]string{"tenant": "acme", "path": "/x", "extra": "1"}, "abandon"},
	}
	rep := &rlqsv3.RateLimitQuotaUsageReports{Domain: "quota"}
	for _, c := range cases {
		rep.BucketQuotaUsages = append(rep.BucketQuotaUsages, usage(c.bucket, 1, 0, 0))
	}
	if err := stream.Send(rep); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.BucketAction) != len(cases) {
		t.Fatalf("%d actions for %d buckets: %v", len(resp.BucketAction), len(cases), resp)
	}
	got := map[string]string{}
	for _, a := range resp.BucketAction {
		got[strings.Join(sortedPairs(a.BucketId.Bucket), ",")] = describe(a)
	}
	for _, c := range cases {
		k := strings.Join(sortedPairs(c.bucket), ",")
		if got[k] != c.want {
			t.Errorf("bucket %s: %q, want %q", k, got[k], c.want)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "sluice_rlqs_bucket_actions_total" {
			for _, m := range mf.Metric {
				counts[m.Label[0].GetValue()] = m.Counter.GetValue()
			}
		}
	}
	if want := map[string]float64{"token_bucket": 3, "allow_all": 2, "deny_all": 1, "abandon": 2}; !maps.Equal(counts, want) {
		t.Errorf("sluice_rlqs_bucket_actions_total %v, want %v", counts, want)
	}
}

// answers sends rep on stream and returns the actions of its answer,
// described, each after its bucket's value of key when key is not empty.
func answers(t *testing.T, stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient, rep *rlqsv3.RateLimitQuotaUsageReports, key string) []string {
	t.Helper()
	if err := stream.Send(rep); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range resp.BucketAction {
		if key != "" {
			got = append(got, a.BucketId.Bucket[key]+" "+describe(a))
			continue
		}
		got = append(got, describe(a))
	}
	return got
}

func sortedPairs(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// TestBadStreams: a stream whose first report names no domain, or that
// changes domains, ends with InvalidArgument (after answering the reports
// before); buckets without ids are skipped.
func TestBadStreams(t *testing.T) {
	cfg := rulestest.Config(t, testRules)
	client := serve(t, rlqs.Config{Rules: func() *rules.Config { return cfg }})
	for _, reps := range [][]*rlqsv3.RateLimitQuotaUsageReports{
		{{BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"tenant": "a"}, 1, 0, 0)}}},
		{{Domain: "quota"}, {Domain: "other"}},
	} {
		stream, err := client.StreamRateLimitQuotas(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range reps {
			if err := stream.Send(r); err != nil && !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
		}
		// Every report before the bad one is answered.
		for range len(reps) - 1 {
			if _, err := stream.Recv(); err != nil {
				t.Fatal(err)
			}
		}
		_, err = stream.Recv()
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("reports %v: %v, want InvalidArgument", reps, err)
		}
	}
	stream, err := client.StreamRateLimitQuotas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rep := &rlqsv3.RateLimitQuotaUsageReports{Domain: "quota", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		{}, usage(nil, 1, 0, 0), usage(map[string]string{"tenant": strings.Repeat("x", 10<<10)}, 1, 0, 0), usage(map[string]string{"tenant": "a"}, 1, 0, 0),
	}}
	if err := stream.Send(rep); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.BucketAction) != 2 || describe(resp.BucketAction[0]) != "abandon" || resp.BucketAction[1].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() == nil {
		t.Fatalf("want an abandon for the 10 KB value and a token bucket for tenant=a, got %v", resp)
	}
}

// TestMalformedReports: bytes that are not a usage report, on a real
// gRPC stream, end it with InvalidArgument (as a malformed request to the
// rate limit service), never Internal; before or after good reports.
func TestMalformedReports(t *testing.T) {
	cfg := rulestest.Config(t, testRules)
	conn := listen(t, rlqs.Config{Rules: func() *rules.Config { return cfg }})
	good, err := proto.Marshal(&rlqsv3.RateLimitQuotaUsageReports{Domain: "quota",
		BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"tenant": "a"}, 1, 0, 0)}})
	if err != nil {
		t.Fatal(err)
	}
	desc := &grpc.StreamDesc{StreamName: "StreamRateLimitQuotas", ClientStreams: true, ServerStreams: true}
	for _, tc := range []struct {
		name   string
		before int // good reports first
		b      []byte
	}{
		{"garbage", 0, []byte("GET / HTTP/1.1\r\n\r\n")},
		{"bad tag", 0, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
		{"truncated", 1, good[:len(good)-3]},
		{"length past the end", 2, []byte{0x12, 0x7f, 0x0a}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stream, err := conn.NewStream(context.Background(), desc, rlqsv3.RateLimitQuotaService_StreamRateLimitQuotas_FullMethodName, grpc.ForceCodecV2(grpcraw.Codec()))
			if err != nil {
				t.Fatal(err)
			}
			for i := range tc.before {
				if err := stream.SendMsg(&grpcraw.Message{Bytes: good}); err != nil {
					t.Fatal(err)
				}
				if err := stream.RecvMsg(&grpcraw.Message{}); err != nil {
					t.Fatalf("good report %d: %v", i+1, err)
				}
			}
			if err := stream.SendMsg(&grpcraw.Message{Bytes: tc.b}); err != nil && !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			if err := stream.RecvMsg(&grpcraw.Message{}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "malformed") {
				t.Errorf("%x: %v, want InvalidArgument: malformed", tc.b, err)
			}
		})
	}
}

// TestEveryReportAnswered: a report with no buckets, or whose only usage
// has no bucket id, gets a response with no actions, in its turn (before
// the answer to the good report sent after it), and the stream goes on.
func TestEveryReportAnswered(t *testing.T) {
	cfg := rulestest.Config(t, testRules)
	client := serve(t, rlqs.Config{Rules: func() *rules.Config { return cfg }})
	stream, err := client.StreamRateLimitQuotas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	good := &rlqsv3.RateLimitQuotaUsageReports{BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"tenant": "a"}, 1, 0, 0)}}
	for i, rep := range []*rlqsv3.RateLimitQuotaUsageReports{
		{Domain: "quota"},
		{BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{}}},
		{BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(nil, 3, 0, time.Second)}},
		{},
	} {
		for _, r := range []*rlqsv3.RateLimitQuotaUsageReports{rep, good} {
			if err := stream.Send(r); err != nil {
				t.Fatal(err)
			}
		}
		for j, want := range []int{0, 1} {
			resp, err := stream.Recv()
			if err != nil {
				t.Fatalf("report %d, answer %d: %v", i+1, j+1, err)
			}
			if len(resp.BucketAction) != want {
				t.Fatalf("report %d, answer %d: %d actions, want %d: %v", i+1, j+1, len(resp.BucketAction), want, resp)
			}
		}
	}
}

// liveHeap is the heap's live bytes, after collecting the garbage.
func liveHeap() int64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// TestMemoryCapAcrossStreams: 30 streams of 10,000 new buckets each (the
// most one stream may hold), on real gRPC streams at once, as the probe
// that found 30 such streams holding 354 MB: the buckets held across
// them stay within Config.MaxBytes, in the server's estimate and in the
// heap; the buckets past it get no answer (Envoy applies its
// no_assignment_behavior) and are counted; the buckets held are answered
// at their next reports; and the buckets of streams that end make room
// for new ones once their pool records may be gone.
func TestMemoryCapAcrossStreams(t *testing.T) {
	const streams, perStream, maxBytes = 30, 10000, 8 << 20
	var clock atomic.Int64
	clock.Store(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC).UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	policy := rlqs.PolicyDefaults(rlqs.Policy{})
	cfg := rulestest.Config(t, testRules)
	reg := prometheus.NewRegistry()
	before := liveHeap()
	client := serve(t, rlqs.Config{Rules: func() *rules.Config { return cfg }, Pools: rlqs.NewMemPools(policy, now), Policy: policy,
		Now: now, MaxBytes: maxBytes, Registry: reg})

	flood, err := rlqstest.Start(context.Background(), client, "quota", streams, perStream)
	if err != nil {
		t.Fatal(err)
	}
	grown := liveHeap() - before
	total := flood.Total()
	estimate := metrictest.Value(t, reg, "sluice_rlqs_bucket_bytes")
	t.Logf("%d of %d buckets held in %d streams, estimated %.0f bytes; the heap grew by %d bytes", total, streams*perStream, streams, estimate, grown)
	// The heap holds the buckets, their pool records, and 30 gRPC streams
	// on both ends; not 30 streams' worth of buckets.
	if grown > 2*maxBytes {
		t.Errorf("the heap grew by %d bytes with the buckets held, over twice the cap of %d", grown, maxBytes)
	}
	if total == 0 || total >= perStream*streams/10 {
		t.Fatalf("%d of %d buckets answered: want some, and far from all, under a cap of %d bytes", total, streams*perStream, maxBytes)
	}
	if estimate > maxBytes {
		t.Errorf("sluice_rlqs_bucket_bytes %.0f, over the cap %d", estimate, maxBytes)
	}
	if got := metrictest.Value(t, reg, "sluice_rlqs_buckets"); got != float64(total) {
		t.Errorf("sluice_rlqs_buckets %v, want %d", got, total)
	}
	if got, want := metrictest.Value(t, reg, "sluice_rlqs_buckets_refused_total", "cap=node"), float64(streams*perStream-total); got != want {
		t.Errorf("sluice_rlqs_buckets_refused_total{cap=node} %v, want %v", got, want)
	}

	// At their next reports, the buckets held are answered, and only they.
	most, fewest := flood.Extremes()
	for _, k := range []int{most, fewest} {
		if n, err := flood.Send(flood.Streams[k], k); err != nil || n != flood.Held[k] {
			t.Errorf("stream %d again: %d buckets answered (%v), want the %d it holds", k, n, err, flood.Held[k])
		}
	}

	// Streams that end give their buckets back once their pool records
	// may be gone (2·(TTL+Grace)).
	for k, stream := range flood.Streams {
		if err := stream.CloseSend(); err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("stream %d after CloseSend: %v, want EOF", k, err)
		}
	}
	if got := metrictest.Value(t, reg, "sluice_rlqs_buckets"); got != 0 {
		t.Errorf("sluice_rlqs_buckets %v once every stream ended, want 0", got)
	}
	late, err := client.StreamRateLimitQuotas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n, err := flood.Send(late, streams); err != nil || n != 0 {
		t.Errorf("a new stream at once: %d buckets answered (%v), want none: the pool records of the ended streams still count", n, err)
	}
	clock.Add(int64(2*(policy.TTL+policy.Grace) + time.Second))
	if n, err := flood.Send(late, streams); err != nil || n == 0 {
		t.Errorf("a new stream once the ended streams' records are gone: %d buckets answered (%v), want some", n, err)
	}
}

// TestStreamCap: past Config.MaxBuckets, a stream's new buckets get no
// answer (not an abandon, which Envoy would follow by creating the bucket
// again, and reporting it, at its next request), and are counted; the
// buckets it holds are answered at every report.
func TestStreamCap(t *testing.T) {
	cfg := rulestest.Config(t, testRules)
	reg := prometheus.NewRegistry()
	client := serve(t, rlqs.Config{Rules: func() *rules.Config { return cfg }, MaxBuckets: 3, Registry: reg})
	stream, err := client.StreamRateLimitQuotas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rep := &rlqsv3.RateLimitQuotaUsageReports{Domain: "quota"}
	for i := range 5 {
		rep.BucketQuotaUsages = append(rep.BucketQuotaUsages, usage(map[string]string{"tenant": fmt.Sprint(i)}, 1, 0, time.Second))
	}
	for round := 1; round <= 2; round++ {
		got := answers(t, stream, rep, "tenant")
		const tb = " token_bucket max=1000 per_fill=1000 fill=1s ttl=5s"
		if want := []string{"0" + tb, "1" + tb, "2" + tb}; !slices.Equal(got, want) {
			t.Errorf("report %d: %q, want %q", round, got, want)
		}
		if got := metrictest.Value(t, reg, "sluice_rlqs_buckets_refused_total", "cap=stream"); got != float64(2*round) {
			t.Errorf("report %d: sluice_rlqs_buckets_refused_total{cap=stream} %v, want %d", round, got, 2*round)
		}
	}
}

// TestSharesFollowDemand: two streams on one bucket of 1000 a second
// reporting 900 and 100 requests a second get 900 and 100 a second once
// both have reported twice (max-min fair: the rest of the pool spread
// evenly, none of it here); with the demand reversed, they follow, as
// fast as the smoothing of demand (half the last estimate each report)
// lets them.
func TestSharesFollowDemand(t *testing.T) {
	cfg := rulestest.Config(t, testRules)
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	client := serve(t, rlqs.Config{Rules: func() *rules.Config { return cfg }, Policy: rlqs.Policy{TTL: 5 * time.Second, Grace: time.Second}, Now: clock,
		Pools: rlqs.NewMemPools(rlqs.PolicyDefaults(rlqs.Policy{TTL: 5 * time.Second, Grace: time.Second}), clock)})
	var streams [2]rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	for i := range streams {
		s, err := client.StreamRateLimitQuotas(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		streams[i] = s
	}
	bucket := map[string]string{"tenant": "acme"}
	report := func(i int, perSec uint64) uint32 {
		t.Helper()
		if err := streams[i].Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "quota",
			BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(bucket, perSec, 0, time.Second)}}); err != nil {
			t.Fatal(err)
		}
		resp, err := streams[i].Recv()
		if err != nil {
			t.Fatal(err)
		}
		s := resp.BucketAction[0].GetQuotaAssignmentAction().GetRateLimitStrategy()
		if s.GetBlanketRule() == typev3.RateLimitStrategy_DENY_ALL && s.GetTokenBucket() == nil {
			return 0
		}
		return s.GetTokenBucket().GetTokensPerFill().GetValue()
	}
	var got [2]uint32
	for round := range 3 {
		now = now.Add(time.Second)
		got[0], got[1] = report(0, 900), report(1, 100)
		if round == 0 && got[0] != 1000 {
			t.Fatalf("first report alone: %d a second, want all 1000", got[0])
		}
	}
	if got != [2]uint32{900, 100} {
		t.Fatalf("demand 900 and 100: shares %v a second, want [900 100]", got)
	}
	for range 8 {
		now = now.Add(time.Second)
		got[0], got[1] = report(0, 100), report(1, 900)
	}
	// Within the hysteresis (a share within 10% of its target is kept).
	if !near(got[0], 100) || !near(got[1], 900) {
		t.Fatalf("demand reversed: shares %v a second, want [100 900] within 10%%", got)
	}
}

// failingPools is Redis down.
type failingPools struct{}

func (failingPools) Assign(context.Context, []rlqs.Ask, []rlqs.Share) error {
	return errors.New("redis: connection refused")
}

// TestPoolsDown: when the shares cannot be computed, each domain is
// answered by the policy a decide.Decider resolves for it (the one
// resolver): fail_closed DENY_ALL, fail_open ALLOW_ALL, local no answer at
// all (Envoy keeps its assignment until it expires), and a domain that
// says nothing by the server's default (--failure-policy); buckets that
// need no share are answered as ever.
func TestPoolsDown(t *testing.T) {
	cfg := rulestest.Config(t, "domain: closed\nfailure_policy: fail_closed\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 5}}]\n",
		"domain: open\nfailure_policy: fail_open\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 5}}]\n",
		"domain: quiet\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 5}}, {key: free, rate_limit: {unlimited: true}}]\n")
	local := sluice.NewLimiter(memstore.New(memstore.Config{SweepInterval: -1}))
	for _, c := range []struct {
		def   rules.FailurePolicy
		quiet []string
	}{
		{rules.FailDefault, []string{"ALLOW_ALL ttl=5s", "ALLOW_ALL ttl=5s"}}, // fail_open, as envoyproxy/ratelimit
		{rules.FailClosed, []string{"ALLOW_ALL ttl=5s", "DENY_ALL ttl=5s"}},
		{rules.FailLocal, []string{"ALLOW_ALL ttl=5s"}}, // only free=1: k=v has no answer
	} {
		dec, err := decide.New(decide.Config{Limiter: local, Rules: cfg, Failover: decide.Failover{Default: c.def, Local: local}})
		if err != nil {
			t.Fatal(err)
		}
		client := serve(t, rlqs.Config{Rules: dec.Rules, Pools: failingPools{}, FailurePolicy: dec.FailurePolicy})
		for domain, want := range map[string][]string{
			"closed": {"DENY_ALL ttl=5s"},
			"open":   {"ALLOW_ALL ttl=5s"},
			"quiet":  c.quiet,
		} {
			stream, err := client.StreamRateLimitQuotas(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			rep := &rlqsv3.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"k": "v"}, 1, 0, 0)}}
			if domain == "quiet" {
				rep.BucketQuotaUsages = append(rep.BucketQuotaUsages, usage(map[string]string{"free": "1"}, 1, 0, 0))
			}
			if got := answers(t, stream, rep, ""); !slices.Equal(got, want) {
				t.Errorf("default %v, %s: %v, want %v", c.def, domain, got, want)
			}
		}
	}
}

// near reports whether got is want within 10% (and a token of rounding).
func near(got uint32, want float64) bool {
	return float64(got) >= 0.9*want-1 && float64(got) <= 1.1*want+1
}

// TestRuntimeOverrides: a bucket that reaches a runtime override gets the
// override's limits, as a descriptor does (an unlimited one ALLOW_ALL,
// one on a shadow rule's path enforced). A change to the overrides
// reaches the buckets at their next report: at once with an index that
// counts its changes (overrides.Index.Generation), a second after the
// last match with a Runtime that does not.
func TestRuntimeOverrides(t *testing.T) {
	for _, counted := range []bool{true, false} {
		var clock atomic.Int64
		clock.Store(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC).UnixNano())
		now := func() time.Time { return time.Unix(0, clock.Load()) }
		idx := overrides.NewIndex(now)
		put := func(path, limit string) {
			p, err := overrides.ParsePath(path)
			if err != nil {
				t.Fatal(err)
			}
			o := &overrides.Override{Domain: "quota", Path: p, Limit: json.RawMessage(limit)}
			if err := o.Compile(); err != nil {
				t.Fatal(err)
			}
			idx.Put(o)
		}
		put("tenant=acme", `{"unit":"second","requests_per_unit":50}`)
		put("tenant=vip", `{"unlimited":true}`)
		put("trial=t1", `{"unit":"second","requests_per_unit":5}`)
		var runtime rules.Runtime = idx
		if !counted {
			runtime = struct{ rules.Runtime }{idx} // Match only
		}
		cfg := rulestest.Config(t, testRules)
		client := serve(t, rlqs.Config{
			Rules:   func() *rules.Config { return cfg },
			Runtime: func() rules.Runtime { return runtime },
			Policy:  rlqs.Policy{TTL: 3 * time.Second},
			Now:     now,
		})
		stream, err := client.StreamRateLimitQuotas(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		report := func(want map[string]string) {
			t.Helper()
			rep := &rlqsv3.RateLimitQuotaUsageReports{Domain: "quota"}
			for k := range want {
				key, value, _ := strings.Cut(k, "=")
				rep.BucketQuotaUsages = append(rep.BucketQuotaUsages, usage(map[string]string{key: value}, 1, 0, time.Second))
			}
			if err := stream.Send(rep); err != nil {
				t.Fatal(err)
			}
			resp, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range resp.BucketAction {
				k := strings.Join(sortedPairs(a.BucketId.Bucket), ",")
				if got := describe(a); got != want[k] {
					t.Errorf("generation counted %v: bucket %s: %q, want %q", counted, k, got, want[k])
				}
			}
			if len(resp.BucketAction) != len(want) {
				t.Errorf("%d actions for %d buckets", len(resp.BucketAction), len(want))
			}
		}
		const rule, fifty = "token_bucket max=1000 per_fill=1000 fill=1s ttl=3s", "token_bucket max=50 per_fill=50 fill=1s ttl=3s"
		report(map[string]string{
			"tenant=acme":  fifty,
			"tenant=vip":   "ALLOW_ALL ttl=3s",
			"trial=t1":     "token_bucket max=5 per_fill=5 fill=1s ttl=3s",
			"tenant=other": rule,
		})
		p, _ := overrides.ParsePath("tenant=acme")
		idx.Delete("quota", p)
		put("tenant=other", `{"unit":"second","requests_per_unit":50}`)
		changed := map[string]string{"tenant=acme": rule, "tenant=other": fifty}
		if counted {
			report(changed) // at once
		} else {
			clock.Add(int64(500 * time.Millisecond))
			report(map[string]string{"tenant=acme": fifty, "tenant=other": rule}) // not yet
			clock.Add(int64(500 * time.Millisecond))
			report(changed)
		}
	}
}
