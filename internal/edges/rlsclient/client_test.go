package rlsclient_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/edges/rls"
	"github.com/sluicehq/sluice/internal/edges/rlsclient"
	"github.com/sluicehq/sluice/internal/edges/server"
	"github.com/sluicehq/sluice/internal/testsupport/logtest"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/storetest"
)

// epoch starts a minute, an hour and a day: fixed windows begin here.
var epoch = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

const testRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: post
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {name: daily, unit: day, requests_per_unit: 5}
  - key: report
    rate_limit: {period: 90s, requests_per_unit: 2}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 60, algorithm: token_bucket, burst: 4}
  - key: free
    unlimited: true
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
`

// remote is a real sluice serve gRPC service on a loopback listener, over
// a memstore on a fixed clock, that can be stopped and started again on
// the same address.
type remote struct {
	t     testing.TB
	srv   *server.Server
	cfg   *rules.Config
	clock *storetest.Clock
	addr  string
	reg   *prometheus.Registry // the service's metrics

	mu sync.Mutex
	g  *grpc.Server
}

// startRemote starts a remote of the rules yaml; opts change the
// server's configuration.
func startRemote(t testing.TB, yaml string, opts ...func(*server.Config)) *remote {
	t.Helper()
	r := &remote{t: t, clock: storetest.NewClock(epoch), reg: prometheus.NewRegistry()}
	store := memstore.New(memstore.Config{Now: r.clock.Now, SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	cfg := server.Config{Decide: decide.Config{Limiter: sluice.NewLimiter(store)}, Registry: r.reg}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.srv = srv
	r.cfg = rulestest.Config(t, yaml)
	srv.ConfigLoaded(r.cfg, epoch)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.addr = lis.Addr().String()
	r.serve(lis)
	t.Cleanup(r.stop)
	return r
}

func (r *remote) serve(lis net.Listener) {
	g := grpc.NewServer(server.GRPCServerOptions()...)
	r.srv.RegisterGRPC(g)
	go g.Serve(lis)
	r.mu.Lock()
	r.g = g
	r.mu.Unlock()
}

// stop stops the service: its connections close and new ones are refused.
func (r *remote) stop() {
	r.mu.Lock()
	g := r.g
	r.g = nil
	r.mu.Unlock()
	if g != nil {
		g.Stop()
	}
}

// restart serves again on the same address.
func (r *remote) restart() {
	r.t.Helper()
	var lis net.Listener
	var err error
	for range 50 {
		if lis, err = net.Listen("tcp", r.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		r.t.Fatalf("listen again on %s: %v", r.addr, err)
	}
	r.serve(lis)
}

// local is a Decider of the remote's rules on a memstore of its own, on
// the remote's clock.
func (r *remote) local() *decide.Decider {
	store := memstore.New(memstore.Config{Now: r.clock.Now, SweepInterval: -1})
	r.t.Cleanup(func() { store.Close() })
	dec, err := decide.New(decide.Config{Limiter: sluice.NewLimiter(store), Rules: r.cfg})
	if err != nil {
		r.t.Fatal(err)
	}
	return dec
}

// viaRemote is a Decider that decides on c's remote, and answers what
// the remote cannot by f, with the rules cfg (nil: none).
func viaRemote(t testing.TB, c *rlsclient.Client, cfg *rules.Config, f decide.Failover) *decide.Decider {
	t.Helper()
	store := memstore.New(memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	dec, err := decide.New(decide.Config{Limiter: sluice.NewLimiter(store), Rules: cfg, Remote: c, Failover: f})
	if err != nil {
		t.Fatal(err)
	}
	return dec
}

func newClient(t testing.TB, cfg rlsclient.Config) *rlsclient.Client {
	t.Helper()
	c, err := rlsclient.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// d builds a descriptor from "key=value" entries.
var d = rulestest.Desc

func req(descs ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "api", Descriptors: descs}
}

// outcome is an answer as sluice serve's codec tells it: the core's
// outcome and the response built from it, in the exact dialect the
// client asks the remote for (names as sluice gives them, resets to the
// nanosecond), so that a local decision compares with a remote one.
type outcome struct {
	decide.Outcome
	Response *rlsv3.RateLimitResponse
}

// ask decides r with dec, through the codec.
func ask(t testing.TB, dec *decide.Decider, r *rlsv3.RateLimitRequest) *outcome {
	t.Helper()
	o := new(outcome)
	var dr decide.Request
	if err := rls.Request(r, &dr); err != nil {
		t.Fatal(err)
	}
	if err := dec.Decide(context.Background(), &dr, &o.Outcome); err != nil {
		t.Fatalf("Decide(%v): %v", r, err)
	}
	o.Response = rls.Response(&o.Outcome, true)
	return o
}

// askRaw asks c alone, as its Decider does.
func askRaw(c *rlsclient.Client, ctx context.Context, r *rlsv3.RateLimitRequest, o *decide.Outcome) error {
	var dr decide.Request
	if err := rls.Request(r, &dr); err != nil {
		return err
	}
	return c.Ask(ctx, &dr, o)
}

// codes spells the overall and per-descriptor codes: "OVER_LIMIT: OK OVER_LIMIT".
func codes(o *outcome) string {
	s := o.Response.GetOverallCode().String() + ":"
	for _, st := range o.Response.GetStatuses() {
		s += " " + st.Code.String()
	}
	return s
}

// The remote decides as a local Decider of the same rules: the same
// responses, and outcomes that say the same of every limited descriptor.
func TestMatchesLocal(t *testing.T) {
	r := startRemote(t, testRules)
	c := viaRemote(t, newClient(t, rlsclient.Config{Target: r.addr, Timeout: 5 * time.Second}), nil, decide.Failover{})
	local := r.local()
	override := d("user=o")
	override.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: 2 /* minute */}
	cost3 := d("bucket=c")
	cost3.HitsAddend = wrapperspb.UInt64(3)
	seq := []*rlsv3.RateLimitRequest{
		req(d("user=a")),
		req(d("user=a"), d("post=p")),
		req(d("post=p"), d("report=r")),
		req(d("user=a")),
		req(d("user=a")), // over
		req(d("post=p"), d("user=b")),
		req(d("post=p")), // over the second's limit
		req(d("report=r"), d("report=r")),
		req(d("bucket=b"), d("free=x"), d("nothing=y")),
		req(cost3),
		req(cost3), // over the burst
		req(override),
		req(override),
		{Domain: "unknown", Descriptors: []*rlv3.RateLimitDescriptor{d("user=a")}},
	}
	for i, rq := range seq {
		if i == 7 {
			r.clock.Advance(1500 * time.Millisecond) // a new second
		}
		want, got := ask(t, local, rq), ask(t, c, rq)
		if !proto.Equal(got.Response, want.Response) {
			t.Errorf("request %d: response\n%v\nwant\n%v", i, got.Response, want.Response)
		}
		if got.Overall.Allowed != want.Overall.Allowed || got.Degraded != rules.FailDefault {
			t.Errorf("request %d: overall %+v, degraded %v; want %+v", i, got.Overall, got.Degraded, want.Overall)
		}
		if len(got.Descriptors) != len(want.Descriptors) {
			t.Fatalf("request %d: %d descriptors, want %d", i, len(got.Descriptors), len(want.Descriptors))
		}
		for j := range got.Descriptors {
			g, w := &got.Descriptors[j], &want.Descriptors[j]
			if g.Limited != w.Limited || g.Over != w.Over || g.Cost != w.Cost {
				t.Errorf("request %d descriptor %d: limited %v over %v cost %d, want %v %v %d", i, j, g.Limited, g.Over, g.Cost, w.Limited, w.Over, w.Cost)
			}
			if !w.Limited {
				continue
			}
			if g.Status != w.Status {
				t.Errorf("request %d descriptor %d: status %v, want %v", i, j, g.Status, w.Status)
			}
			// The remote's reset is its duration_until_reset: when the
			// limit has more quota.
			gd, wd := g.Decision, w.Decision
			if gd.Allowed != wd.Allowed || gd.Limit != w.Limit.Rate || gd.Remaining != wd.Remaining || gd.ResetAfter != rls.UntilReset(w.Limit, &wd) {
				t.Errorf("request %d descriptor %d: decision %+v, want %+v", i, j, gd, wd)
			}
			// The remote's reset is never earlier than the limit
			// allows; a window's is exactly its retry time.
			if !wd.Allowed && gd.RetryAfter < wd.RetryAfter || gd.Allowed && gd.RetryAfter != 0 {
				t.Errorf("request %d descriptor %d: retry after %v, local %v", i, j, gd.RetryAfter, wd.RetryAfter)
			}
			if g.Limit.Name != w.Limit.Name || g.Limit.Rate != w.Limit.Rate || g.Limit.Period != w.Limit.Period {
				t.Errorf("request %d descriptor %d: limit %+v, want %+v", i, j, *g.Limit, *w.Limit)
			}
		}
	}
}

// Several descriptors: one limit outcome per limited descriptor, the
// overall decision against the denying one.
func TestMultipleDescriptors(t *testing.T) {
	r := startRemote(t, testRules)
	c := viaRemote(t, newClient(t, rlsclient.Config{Target: r.addr, Timeout: 5 * time.Second}), nil, decide.Failover{})
	for range 3 {
		ask(t, c, req(d("user=a")))
	}
	o := ask(t, c, req(d("report=r"), d("free=x"), d("user=a"), d("post=p")))
	if got := codes(o); got != "OVER_LIMIT: OK OK OVER_LIMIT OK" {
		t.Fatalf("codes %s", got)
	}
	if len(o.Limits) != 3 {
		t.Fatalf("%d limits, want 3: %+v", len(o.Limits), o.Limits)
	}
	for i, want := range []struct {
		desc      int
		name      string
		rate      int64
		period    time.Duration
		allowed   bool
		remaining int64
	}{
		{0, "", 2, 90 * time.Second, true, 2},
		{2, "", 3, time.Minute, false, 0},
		{3, "", 2, time.Second, true, 2},
	} {
		lo := o.Limits[i]
		if lo.Descriptor != want.desc || lo.Limit.Rate != want.rate || lo.Limit.Period != want.period || lo.Decision.Allowed != want.allowed || lo.Decision.Remaining != want.remaining || lo.Decision.Index != i {
			t.Errorf("limit %d: %+v %+v, want %+v", i, lo, *lo.Limit, want)
		}
	}
	// Nothing was consumed by the denied request (all-or-nothing, on
	// the remote); the overall decision is the denying limit's.
	if o.Overall.Allowed || o.Overall.Index != 1 || o.Overall.RetryAfter != time.Minute || o.Overall.Limit != 3 {
		t.Errorf("overall %+v", o.Overall)
	}
	if o := ask(t, c, req(d("report=r"))); o.Limits[0].Decision.Remaining != 1 {
		t.Errorf("report after the denied request: %+v", o.Limits[0].Decision)
	}
	// The daily limit, named, decides when it has the least left.
	for range 4 {
		ask(t, c, req(d("post=q")))
		r.clock.Advance(time.Second)
	}
	o = ask(t, c, req(d("post=q")))
	if !strings.HasPrefix(o.Limits[0].Limit.Name, "daily") || o.Limits[0].Limit.Period != 24*time.Hour || o.Overall.Remaining != 0 || !o.Overall.Allowed || o.Overall.Index != 0 {
		t.Errorf("post: %+v %+v", *o.Limits[0].Limit, o.Overall)
	}
	// The limits are cached: the same Limit every time.
	if o2 := ask(t, c, req(d("post=q"))); o2.Limits[0].Limit != o.Limits[0].Limit {
		t.Error("a new Limit for the same remote limit")
	}
}

// Descriptors without a limit (unlimited, no rule, an unknown domain)
// are unlimited: allowed, no limit outcome.
func TestUnlimited(t *testing.T) {
	r := startRemote(t, testRules)
	c := viaRemote(t, newClient(t, rlsclient.Config{Target: r.addr, Timeout: 5 * time.Second}), nil, decide.Failover{})
	for _, rq := range []*rlsv3.RateLimitRequest{
		req(d("free=x"), d("nothing=y"), d("user=a", "more=b")),
		{Domain: "unknown", Descriptors: []*rlv3.RateLimitDescriptor{d("user=a")}},
	} {
		for range 5 {
			o := ask(t, c, rq)
			if len(o.Limits) != 0 || !o.Overall.Allowed || o.Overall.Index != -1 || o.Degraded != rules.FailDefault {
				t.Fatalf("%v: limits %+v, overall %+v", rq, o.Limits, o.Overall)
			}
			for i, do := range o.Descriptors {
				if do.Limited || do.Over || do.Limit != nil || !do.Decision.Allowed || do.Cost != 1 {
					t.Errorf("%v: descriptor %d %+v", rq, i, do)
				}
			}
		}
	}
}

// While the remote is down, the failure policy answers; when it is back,
// the remote answers again.
func TestRemoteDown(t *testing.T) {
	for _, tc := range []struct {
		name string
		// fallback is what answers while the remote is down: rules
		// (nil: none) and a failure policy.
		fallback func(r *remote) (*rules.Config, decide.Failover)
		// check checks the answers while the remote is down, with the
		// user limit of 3 a minute.
		check func(t *testing.T, os []*outcome)
	}{
		{"fail_open", func(r *remote) (*rules.Config, decide.Failover) { return nil, decide.Failover{} }, func(t *testing.T, os []*outcome) {
			for i, o := range os {
				if o.Degraded != rules.FailOpen || codes(o) != "OK: OK" || !o.Overall.Allowed || len(o.Limits) != 0 {
					t.Errorf("request %d: %v %s %+v", i, o.Degraded, codes(o), o.Overall)
				}
			}
		}},
		{"fail_closed", func(r *remote) (*rules.Config, decide.Failover) {
			return nil, decide.Failover{Default: rules.FailClosed}
		}, func(t *testing.T, os []*outcome) {
			for i, o := range os {
				reset := o.Response.Statuses[0].GetDurationUntilReset().AsDuration()
				if o.Degraded != rules.FailClosed || codes(o) != "OVER_LIMIT: OVER_LIMIT" || o.Overall.Allowed || o.Overall.RetryAfter != time.Second || reset != time.Second {
					t.Errorf("request %d: %v %s %+v, reset %v", i, o.Degraded, codes(o), o.Overall, reset)
				}
			}
		}},
		{"fallback_local", func(r *remote) (*rules.Config, decide.Failover) {
			store := memstore.New(memstore.Config{Now: r.clock.Now, SweepInterval: -1})
			t.Cleanup(func() { store.Close() })
			return r.cfg, decide.Failover{Default: rules.FailLocal, Local: sluice.NewLimiter(store), Nodes: 2}
		}, func(t *testing.T, os []*outcome) {
			// floor(3/2) = 1 a minute on this node.
			for i, o := range os {
				want := "OK: OK"
				if i >= 1 {
					want = "OVER_LIMIT: OVER_LIMIT"
				}
				if o.Degraded != rules.FailLocal || codes(o) != want || o.Overall.Limit != 3 || o.Limits[0].Limit.Rate != 3 {
					t.Errorf("request %d: %v %s %+v", i, o.Degraded, codes(o), o.Overall)
				}
				if !errors.Is(o.StoreErr, rlsclient.ErrUnavailable) {
					t.Errorf("request %d: store error %v", i, o.StoreErr)
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startRemote(t, testRules)
			// A long timeout: a call that the remote counts must not
			// time out here (a refused connection fails at once).
			cl := newClient(t, rlsclient.Config{Target: r.addr, Timeout: 5 * time.Second, BreakerCooldown: 20 * time.Millisecond})
			c := viaRemote(t, cl, nil, decide.Failover{})
			if rc, f := tc.fallback(r); true {
				c = viaRemote(t, cl, rc, f)
			}
			if o := ask(t, c, req(d("user=a"))); o.Degraded != rules.FailDefault || o.Response.Statuses[0].LimitRemaining != 2 {
				t.Fatalf("remote up: %v %v", o.Degraded, o.Response.Statuses[0])
			}
			r.stop()
			var os []*outcome
			for range 8 { // more than the breaker's 5 failures
				o := ask(t, c, req(d("user=a")))
				if !errors.Is(o.StoreErr, rlsclient.ErrUnavailable) {
					t.Errorf("store error %v", o.StoreErr)
				}
				os = append(os, o)
			}
			tc.check(t, os)
			if err := cl.Health(); !errors.Is(err, rlsclient.ErrUnavailable) {
				t.Errorf("Health while down: %v", err)
			}

			r.restart()
			o := waitRemote(t, c, req(d("user=a")))
			// The remote's own count, as it stood: 1 of 3 used.
			if codes(o) != "OK: OK" || o.Response.Statuses[0].LimitRemaining != 1 {
				t.Errorf("remote back: %s %v", codes(o), o.Response.Statuses[0])
			}
			if err := cl.Health(); err != nil {
				t.Errorf("Health after recovery: %v", err)
			}
		})
	}
}

// waitRemote decides r until the remote answers it (not the policy), for
// at most 20 seconds: gRPC reconnects with backoff and the breaker probes
// after its cooldown.
func waitRemote(t *testing.T, c *decide.Decider, r *rlsv3.RateLimitRequest) *outcome {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		o := ask(t, c, r)
		if o.Degraded == rules.FailDefault {
			return o
		}
		if time.Now().After(deadline) {
			t.Fatalf("the remote does not answer again: %v", o.StoreErr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// hangingService answers no request: it waits for the caller to give up.
type hangingService struct {
	rlsv3.UnimplementedRateLimitServiceServer
	calls chan struct{}
}

func (h *hangingService) ShouldRateLimit(ctx context.Context, _ *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	select {
	case h.calls <- struct{}{}:
	case <-ctx.Done():
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// serveRLS serves svc on a loopback listener and returns its address.
func serveRLS(t testing.TB, svc rlsv3.RateLimitServiceServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(g, svc)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

// A remote that never answers: the policy answers within the timeout,
// and the breaker opens.
func TestRemoteHangs(t *testing.T) {
	addr := serveRLS(t, &hangingService{calls: make(chan struct{}, 1)})
	cl := newClient(t, rlsclient.Config{Target: addr})
	c := viaRemote(t, cl, nil, decide.Failover{Default: rules.FailClosed})
	reg := prometheus.NewRegistry()
	reg.MustRegister(cl.Collector("sluice"))
	for i := range 7 {
		start := time.Now()
		o := ask(t, c, req(d("user=a")))
		// A generous bound: the default timeout is 500ms.
		if el := time.Since(start); el > 2*time.Second {
			t.Errorf("request %d answered after %v", i, el)
		}
		if o.Degraded != rules.FailClosed || codes(o) != "OVER_LIMIT: OVER_LIMIT" || !errors.Is(o.StoreErr, rlsclient.ErrUnavailable) {
			t.Errorf("request %d: %v %s %v", i, o.Degraded, codes(o), o.StoreErr)
		}
	}
	m := gather(t, reg)
	if m["sluice_remote_calls_total{result=timeout}"] != 5 || m["sluice_remote_calls_total{result=breaker_open}"] != 2 {
		t.Errorf("calls: %v", m)
	}
	if m["sluice_remote_up"] != 0 || m["sluice_remote_breaker_state"] != 2 || m["sluice_remote_call_duration_seconds_count"] != 5 {
		t.Errorf("metrics: %v", m)
	}
}

// The caller's own cancellation is an error, never a policy's answer, and
// does not count against the remote.
func TestCallerCanceled(t *testing.T) {
	svc := &hangingService{calls: make(chan struct{})}
	addr := serveRLS(t, svc)
	c := newClient(t, rlsclient.Config{Target: addr, Timeout: time.Minute, BreakerFailures: 2})
	reg := prometheus.NewRegistry()
	reg.MustRegister(c.Collector(""))

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var o decide.Outcome
	if err := askRaw(c, ctx, req(d("user=a")), &o); !errors.Is(err, context.Canceled) || len(o.Descriptors) != 0 {
		t.Errorf("canceled before: %v, %+v", err, o)
	}
	for i := range 5 {
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			<-svc.calls // the remote has the call
			cancel()
		}()
		err := askRaw(c, ctx, req(d("user=a")), &o)
		cancel()
		if !errors.Is(err, context.Canceled) || len(o.Descriptors) != 0 || o.Degraded != rules.FailDefault {
			t.Errorf("canceled during call %d: %v, %+v", i, err, o)
		}
	}
	if err := c.Health(); err != nil {
		t.Errorf("Health: %v", err)
	}
	m := gather(t, reg)
	if m["remote_calls_total{result=canceled}"] != 5 || m["remote_breaker_state"] != 0 || m["remote_up"] != 1 {
		t.Errorf("metrics: %v", m)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  rlsclient.Config
		want string
	}{
		{rlsclient.Config{}, "Target is required"},
		{rlsclient.Config{Target: "localhost"}, "neither host:port nor a gRPC target URI"},
		{rlsclient.Config{Target: ":8081"}, "has no host"},
		{rlsclient.Config{Target: "localhost:0"}, "not a number from 1 to 65535"},
		{rlsclient.Config{Target: "localhost:http"}, "not a number from 1 to 65535"},
		{rlsclient.Config{Target: "localhost:8081", Timeout: -time.Second}, "negative Timeout"},
		{rlsclient.Config{Target: "localhost:8081", BreakerFailures: -1}, "negative BreakerFailures"},
		{rlsclient.Config{Target: "localhost:8081", BreakerCooldown: -1}, "negative BreakerCooldown"},
	} {
		c, err := rlsclient.New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error containing %q", tc.cfg, err, tc.want)
		}
		if c != nil {
			t.Errorf("New(%+v) returned a client with its error", tc.cfg)
		}
	}
	for _, target := range []string{"127.0.0.1:8081", "[::1]:8081", "ratelimit.svc:8081", "dns:///ratelimit:8081", "unix:///run/sluice.sock"} {
		c, err := rlsclient.New(rlsclient.Config{Target: target})
		if err != nil {
			t.Errorf("New(%q): %v", target, err)
			continue
		}
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := c.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		if err := askRaw(c, context.Background(), req(d("user=a")), new(decide.Outcome)); !errors.Is(err, rlsclient.ErrClosed) {
			t.Errorf("Ask after Close: %v", err)
		}
	}
}

// Invalid requests are errors wrapping sluice.ErrInvalid, whether refused
// here or by the remote, with the remote up or down; nothing is degraded
// and the breaker hears no failure.
func TestInvalidRequest(t *testing.T) {
	r := startRemote(t, testRules)
	c := newClient(t, rlsclient.Config{Target: r.addr, Timeout: 5 * time.Second, BreakerFailures: 1})
	negative := d("user=a")
	negative.IsNegativeHits = true
	check := func(when string) {
		for _, rq := range []*rlsv3.RateLimitRequest{
			nil,
			{Descriptors: []*rlv3.RateLimitDescriptor{d("user=a")}},
			{Domain: "api"},
			{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{nil}},
		} {
			var o decide.Outcome
			if err := askRaw(c, context.Background(), rq, &o); !errors.Is(err, sluice.ErrInvalid) || len(o.Descriptors) != 0 {
				t.Errorf("%s: %v: %v", when, rq, err)
			}
		}
	}
	check("remote up")
	// What only the remote refuses.
	for _, rq := range []*rlsv3.RateLimitRequest{req(d())} {
		var o decide.Outcome
		if err := askRaw(c, context.Background(), rq, &o); !errors.Is(err, sluice.ErrInvalid) || len(o.Descriptors) != 0 || o.Degraded != rules.FailDefault {
			t.Errorf("%v: %v, %+v", rq, err, o)
		}
	}
	if err := c.Health(); err != nil {
		t.Errorf("Health after InvalidArgument: %v", err)
	}
	r.stop()
	check("remote down")
}

// wrongService answers with one status too many.
type wrongService struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (wrongService) ShouldRateLimit(_ context.Context, r *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	for range len(r.Descriptors) + 1 {
		resp.Statuses = append(resp.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK})
	}
	return resp, nil
}

func TestMalformedResponse(t *testing.T) {
	c := newClient(t, rlsclient.Config{Target: serveRLS(t, wrongService{}), Timeout: 5 * time.Second})
	var o decide.Outcome
	err := askRaw(c, context.Background(), req(d("user=a"), d("user=b")), &o)
	if !errors.Is(err, rlsclient.ErrUnavailable) || !strings.Contains(err.Error(), "3 descriptor statuses for 2 descriptors") || len(o.Descriptors) != 0 {
		t.Errorf("%v, %+v", err, o)
	}
}

// The failures answered by the policy are logged, at most once a second
// of each kind.
func TestLogsFailures(t *testing.T) {
	r := startRemote(t, testRules)
	var buf logtest.Buffer
	c := viaRemote(t, newClient(t, rlsclient.Config{Target: r.addr, Logger: slog.New(slog.NewTextHandler(&buf, nil))}), nil, decide.Failover{})
	r.stop()
	for range 20 {
		ask(t, c, req(d("user=a")))
	}
	lines := buf.String()
	policy := strings.Count(lines, "the failure policy answers")
	if n := strings.Count(lines, "result=error"); n < 1 || n > 2 {
		t.Errorf("%d lines of errors:\n%s", n, lines)
	}
	if n := strings.Count(lines, "result=breaker_open"); n < 1 || n > 2 || policy > 4 {
		t.Errorf("%d lines of breaker_open, %d in all:\n%s", n, policy, lines)
	}
	if !strings.Contains(lines, "circuit breaker") || !strings.Contains(lines, "to=open") {
		t.Errorf("log:\n%s", lines)
	}
}

// gather returns the values of reg's metrics by name{label=value}: the
// value of a counter or gauge, name_count for a histogram.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += fmt.Sprintf("{%s=%s}", l.GetName(), l.GetValue())
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[name] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[name] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[name+"_count"] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}
