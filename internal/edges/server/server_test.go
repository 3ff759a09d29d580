package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/decision/ratelimitheaders"
	"github.com/sluicehq/sluice/internal/edges/server"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/storetest"
)

// epoch starts a minute, an hour and a day: fixed windows begin here.
var epoch = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

// env is a server on real listeners: gRPC on 127.0.0.1 with a real
// client, and HTTP.
type env struct {
	t      *testing.T
	clock  *storetest.Clock
	srv    *server.Server
	cfg    *rules.Config // loaded at the start
	reg    *prometheus.Registry
	conn   *grpc.ClientConn
	rls    rlsv3.RateLimitServiceClient
	health healthpb.HealthClient
	url    string
}

// newEnv starts a server with the rules yaml loaded (none if empty) and
// cfg's settings (its Decider and Registry are filled in).
func newEnv(t *testing.T, yaml string, cfg server.Config) *env {
	t.Helper()
	clock := storetest.NewClock(epoch)
	store := memstore.New(memstore.Config{Now: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	e := newEnvStore(t, yaml, cfg, store)
	e.clock = clock
	return e
}

// newEnvStore is newEnv on store, or on cfg.Decide.Limiter if set.
func newEnvStore(t *testing.T, yaml string, cfg server.Config, store sluice.Store) *env {
	t.Helper()
	e := &env{t: t}
	if cfg.Decide.Limiter == nil {
		cfg.Decide.Limiter = sluice.NewLimiter(store)
	}
	e.reg = prometheus.NewRegistry()
	cfg.Registry = e.reg
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.srv = srv
	if yaml != "" {
		e.cfg = rulestest.Config(t, yaml)
		srv.ConfigLoaded(e.cfg, epoch)
	}

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(server.GRPCServerOptions()...)
	srv.RegisterGRPC(g)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e.conn = conn
	e.rls = rlsv3.NewRateLimitServiceClient(conn)
	e.health = healthpb.NewHealthClient(conn)

	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	e.url = hs.URL
	return e
}

// d builds a descriptor from "key=value" entries.
var d = rulestest.Desc

func req(domain string, descs ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: descs}
}

// call sends r over gRPC and fails the test on error.
func (e *env) call(r *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	e.t.Helper()
	resp, err := e.rls.ShouldRateLimit(context.Background(), r)
	if err != nil {
		e.t.Fatalf("ShouldRateLimit(%v): %v", r, err)
	}
	return resp
}

// codes spells the overall code and the per-descriptor codes of resp, as
// "OK: OK OVER_LIMIT".
func codes(resp *rlsv3.RateLimitResponse) string {
	var b strings.Builder
	b.WriteString(resp.GetOverallCode().String())
	b.WriteByte(':')
	for _, st := range resp.GetStatuses() {
		b.WriteByte(' ')
		b.WriteString(st.GetCode().String())
	}
	return b.String()
}

// expect sends r n times and checks every answer's codes.
func (e *env) expect(r *rlsv3.RateLimitRequest, n int, want string) {
	e.t.Helper()
	for i := range n {
		if got := codes(e.call(r)); got != want {
			e.t.Fatalf("request %d of %v: %s, want %s", i+1, r, got, want)
		}
	}
}

// post sends body to /json.
func (e *env) post(body string) (*http.Response, []byte) {
	e.t.Helper()
	resp, err := http.Post(e.url+"/json", "application/json", strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp, b
}

func (e *env) get(path string) (int, string) {
	e.t.Helper()
	resp, err := http.Get(e.url + path)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

const matching = `
domain: api
descriptors:
  - key: user                 # value-less: a counter per user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: user
    value: vip
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    value: /api/*             # wildcard: one counter per path
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: client
    value: mobile
    descriptors:
      - key: region           # nested
        rate_limit: {unit: hour, requests_per_unit: 2}
  - key: free
    rate_limit: {unlimited: true}
  - key: menu                 # no rate_limit of its own
    descriptors:
      - key: item
        value: soup
        rate_limit: {unit: minute, requests_per_unit: 1}
`

func TestMatching(t *testing.T) {
	e := newEnv(t, matching, server.Config{})

	// Value-less: each value has its own counter of 3.
	e.expect(req("api", d("user=ana")), 3, "OK: OK")
	e.expect(req("api", d("user=ana")), 1, "OVER_LIMIT: OVER_LIMIT")
	e.expect(req("api", d("user=bob")), 3, "OK: OK")
	// Exact match beats the value-less rule.
	e.expect(req("api", d("user=vip")), 5, "OK: OK")
	e.expect(req("api", d("user=vip")), 1, "OVER_LIMIT: OVER_LIMIT")
	// Wildcard: one counter per matching value.
	e.expect(req("api", d("path=/api/a")), 2, "OK: OK")
	e.expect(req("api", d("path=/api/a")), 1, "OVER_LIMIT: OVER_LIMIT")
	e.expect(req("api", d("path=/api/b")), 2, "OK: OK")
	e.expect(req("api", d("path=/other")), 5, "OK: OK") // no rule
	// Nested: the limit at the last entry.
	e.expect(req("api", d("client=mobile", "region=eu")), 2, "OK: OK")
	e.expect(req("api", d("client=mobile", "region=eu")), 1, "OVER_LIMIT: OVER_LIMIT")
	e.expect(req("api", d("client=mobile")), 5, "OK: OK")               // stops short
	e.expect(req("api", d("client=desktop", "region=eu")), 5, "OK: OK") // no such value
	e.expect(req("api", d("menu=x", "item=soup")), 1, "OK: OK")
	e.expect(req("api", d("menu=x", "item=soup")), 1, "OVER_LIMIT: OVER_LIMIT")
	// Unlimited and an unknown domain.
	e.expect(req("api", d("free=1")), 10, "OK: OK")
	e.expect(req("nope", d("user=ana")), 3, "OK: OK")

	// Statuses: current_limit and remaining where a rule matched, none
	// where nothing did.
	resp := e.call(req("api", d("user=carol"), d("path=/other"), d("free=1")))
	st := resp.Statuses
	if st[0].CurrentLimit.GetRequestsPerUnit() != 3 || st[0].CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || st[0].LimitRemaining != 2 {
		t.Errorf("limited status %v", st[0])
	}
	if st[0].DurationUntilReset.AsDuration() != time.Minute {
		t.Errorf("duration until reset %v", st[0].DurationUntilReset.AsDuration())
	}
	if st[1].CurrentLimit != nil || st[2].CurrentLimit != nil {
		t.Errorf("unmatched statuses carry limits: %v %v", st[1], st[2])
	}
	// The window passes: the quota is back.
	e.clock.Advance(time.Minute)
	e.expect(req("api", d("user=ana")), 3, "OK: OK")
}

const hitsRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 10}
`

func TestHitsAddend(t *testing.T) {
	e := newEnv(t, hitsRules, server.Config{})
	remaining := func(resp *rlsv3.RateLimitResponse) []uint32 {
		var out []uint32
		for _, st := range resp.Statuses {
			out = append(out, st.LimitRemaining)
		}
		return out
	}
	// Request-level hits_addend applies to every descriptor.
	r := req("api", d("user=a"), d("ip=1"))
	r.HitsAddend = 4
	if got := remaining(e.call(r)); got[0] != 6 || got[1] != 6 {
		t.Fatalf("after 4 hits: %v", got)
	}
	// Per-descriptor hits_addend overrides it; 0 checks without consuming.
	r = req("api", d("user=a"), d("ip=1"))
	r.HitsAddend = 4
	r.Descriptors[0].HitsAddend = wrapperspb.UInt64(0)
	if got := remaining(e.call(r)); got[0] != 6 || got[1] != 2 {
		t.Fatalf("peek and 4 hits: %v", got)
	}
	// Request-level 0 means 1, as in Envoy.
	r = req("api", d("user=a"))
	if got := remaining(e.call(r)); got[0] != 5 {
		t.Fatalf("default hit: %v", got)
	}
	// More than is left: denied, and nothing is consumed.
	r = req("api", d("user=a"))
	r.Descriptors[0].HitsAddend = wrapperspb.UInt64(6)
	if got := codes(e.call(r)); got != "OVER_LIMIT: OVER_LIMIT" {
		t.Fatalf("6 of 5: %s", got)
	}
	r.Descriptors[0].HitsAddend = wrapperspb.UInt64(5)
	resp := e.call(r)
	if got := codes(resp); got != "OK: OK" || resp.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("5 of 5: %s %v", got, remaining(resp))
	}
	// A peek of an exhausted limit fits (0 more hits), as in Envoy.
	r.Descriptors[0].HitsAddend = wrapperspb.UInt64(0)
	if resp := e.call(r); codes(resp) != "OK: OK" || resp.Statuses[0].LimitRemaining != 0 {
		t.Errorf("peek of an exhausted limit: %s %v", codes(resp), resp.Statuses[0])
	}
}

func TestOverride(t *testing.T) {
	e := newEnv(t, hitsRules, server.Config{})
	r := req("api", d("user=a"))
	r.Descriptors[0].Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: 3 /* HOUR */}
	e.expect(r, 2, "OK: OK")
	resp := e.call(r)
	if codes(resp) != "OVER_LIMIT: OVER_LIMIT" {
		t.Fatalf("third request under an override of 2: %s", codes(resp))
	}
	if cl := resp.Statuses[0].CurrentLimit; cl.GetRequestsPerUnit() != 2 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR {
		t.Errorf("current limit %v", cl)
	}
	// The rule's own counter is untouched.
	if resp := e.call(req("api", d("user=a"))); resp.Statuses[0].LimitRemaining != 9 {
		t.Errorf("rule counter after overrides: %v", resp.Statuses[0])
	}
}

func TestReplacesShadowAndAllOrNothing(t *testing.T) {
	e := newEnv(t, `
domain: api
descriptors:
  - key: generic
    rate_limit: {name: generic, unit: minute, requests_per_unit: 1}
  - key: special
    rate_limit:
      unit: minute
      requests_per_unit: 3
      replaces: [{name: generic}]
  - key: probe
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: post
    rate_limits:
      - {unit: second, requests_per_unit: 1}
      - {unit: day, requests_per_unit: 2}
`, server.Config{})

	// generic alone: 1 per minute. With special, generic is replaced.
	e.expect(req("api", d("generic=x")), 1, "OK: OK")
	e.expect(req("api", d("generic=x")), 1, "OVER_LIMIT: OVER_LIMIT")
	both := req("api", d("generic=x"), d("special=y"))
	e.expect(both, 3, "OK: OK OK")
	e.expect(both, 1, "OVER_LIMIT: OK OVER_LIMIT")

	// Shadow mode: over the limit is reported in the remaining quota but
	// the code is OK.
	e.expect(req("api", d("probe=p")), 3, "OK: OK")

	// All-or-nothing: a denial by the per-second limit burns nothing of
	// the per-day one, nor of another descriptor of the request.
	e.expect(req("api", d("post=a")), 1, "OK: OK")
	pair := req("api", d("post=a"), d("special=z"))
	e.expect(pair, 2, "OVER_LIMIT: OVER_LIMIT OK")
	if resp := e.call(req("api", d("special=z"))); resp.Statuses[0].LimitRemaining != 2 {
		t.Errorf("special consumed by denied requests: %v", resp.Statuses[0])
	}
	e.clock.Advance(time.Second)
	e.expect(req("api", d("post=a")), 1, "OK: OK") // the day's second
	e.clock.Advance(time.Second)
	e.expect(req("api", d("post=a")), 1, "OVER_LIMIT: OVER_LIMIT")
}

func TestGlobalShadowMode(t *testing.T) {
	e := newEnv(t, hitsRules, server.Config{ShadowMode: true, Headers: ratelimitheaders.HeadersAll})
	r := req("api", d("user=a"))
	r.HitsAddend = 10
	e.expect(r, 1, "OK: OK")
	// As envoyproxy/ratelimit: OK overall, the descriptor still
	// OVER_LIMIT (its test/service/ratelimit_test.go,
	// TestServiceGlobalShadowMode).
	resp := e.call(r)
	if codes(resp) != "OK: OVER_LIMIT" || resp.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("over the limit in global shadow mode: %s %v", codes(resp), resp.Statuses[0])
	}
	for _, h := range resp.ResponseHeadersToAdd {
		if h.Key == "Retry-After" {
			t.Errorf("Retry-After on an OK response: %v", h)
		}
	}
	httpResp, body := e.post(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}`)
	if httpResp.StatusCode != http.StatusOK {
		t.Errorf("/json in global shadow mode: %d %s", httpResp.StatusCode, body)
	}
}

func TestJSON(t *testing.T) {
	e := newEnv(t, hitsRules, server.Config{})
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"a"}]}],"hitsAddend":9}`
	resp, b := e.post(body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("first: %d %s", resp.StatusCode, b)
	}
	var rr rlsv3.RateLimitResponse
	if err := protojson.Unmarshal(b, &rr); err != nil {
		t.Fatalf("response %s: %v", b, err)
	}
	if rr.OverallCode != rlsv3.RateLimitResponse_OK || rr.Statuses[0].LimitRemaining != 1 || rr.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 10 {
		t.Errorf("response %v", &rr)
	}
	resp, b = e.post(body)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second: %d %s", resp.StatusCode, b)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil || m["overallCode"] != "OVER_LIMIT" {
		t.Errorf("429 body %s: %v", b, err)
	}

	// Errors.
	for _, tc := range []struct {
		name, body string
		code       int
		want       string
	}{
		{"malformed", `{"domain":`, 400, "malformed"},
		{"unknown field", `{"domain":"api","bogus":1}`, 400, "bogus"},
		{"no domain", `{"descriptors":[{"entries":[{"key":"user","value":"a"}]}]}`, 400, "domain must not be empty"},
		{"no descriptors", `{"domain":"api"}`, 400, "descriptor list must not be empty"},
		{"negative hits", `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"a"}]}],"hitsAddend":-1}`, 400, "malformed"},
		{"too large", `{"domain":"` + strings.Repeat("x", server.MaxJSONBody) + `"}`, 413, "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := e.post(tc.body)
			if resp.StatusCode != tc.code {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.code, b)
			}
			var eb struct {
				Code  int    `json:"code"`
				Error string `json:"error"`
			}
			if err := json.Unmarshal(b, &eb); err != nil || eb.Code != tc.code || !strings.Contains(eb.Error, tc.want) {
				t.Errorf("error body %s (%v), want %q", b, err, tc.want)
			}
		})
	}
	r, err := http.Get(e.url + "/json")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusMethodNotAllowed || r.Header.Get("Allow") != "POST" {
		t.Errorf("GET /json: %d Allow %q", r.StatusCode, r.Header.Get("Allow"))
	}
	// Nothing above consumed anything: one hit is left.
	resp, b = e.post(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}`)
	if err := protojson.Unmarshal(b, &rr); err != nil || resp.StatusCode != http.StatusOK || rr.Statuses[0].LimitRemaining != 0 {
		t.Errorf("after the errors: %d %s", resp.StatusCode, b)
	}
}

func TestReadiness(t *testing.T) {
	var storeErr error
	var mu sync.Mutex
	e := newEnv(t, "", server.Config{Ready: func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		return storeErr
	}})
	ctx := context.Background()
	check := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		resp, err := e.health.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatalf("health check %q: %v", service, err)
		}
		return resp.Status
	}
	expectReady := func(ready bool, reason string) {
		t.Helper()
		code, body := e.get("/readyz")
		want, wantHealth := http.StatusOK, healthpb.HealthCheckResponse_SERVING
		if !ready {
			want, wantHealth = http.StatusServiceUnavailable, healthpb.HealthCheckResponse_NOT_SERVING
		}
		if code != want || !strings.Contains(body, reason) {
			t.Errorf("/readyz: %d %q, want %d with %q", code, body, want, reason)
		}
		if code, _ := e.get("/healthcheck"); code != want {
			t.Errorf("/healthcheck: %d, want %d", code, want)
		}
		for _, name := range []string{"", "envoy.service.ratelimit.v3.RateLimitService", "ratelimit"} {
			if got := check(name); got != wantHealth {
				t.Errorf("gRPC health %q: %v, want %v", name, got, wantHealth)
			}
		}
		if code, body := e.get("/healthz"); code != http.StatusOK {
			t.Errorf("/healthz: %d %s", code, body)
		}
	}

	watch, err := e.health.Watch(ctx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
	if err != nil {
		t.Fatal(err)
	}
	next := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		resp, err := watch.Recv()
		if err != nil || resp.Status != want {
			t.Fatalf("watch: %v %v, want %v", resp, err, want)
		}
	}
	next(healthpb.HealthCheckResponse_NOT_SERVING)

	// No configuration: not ready, and requests are Unavailable / 503.
	expectReady(false, "no rate limit configuration loaded")
	if _, err := e.rls.ShouldRateLimit(ctx, req("api", d("user=a"))); status.Code(err) != grpccodes.Unavailable {
		t.Errorf("request without configuration: %v", err)
	}
	if resp, b := e.post(`{"domain":"api","descriptors":[{"entries":[{"key":"user"}]}]}`); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/json without configuration: %d %s", resp.StatusCode, b)
	}

	e.srv.ConfigLoaded(rulestest.Config(t, hitsRules), epoch)
	next(healthpb.HealthCheckResponse_SERVING)
	expectReady(true, "OK")

	mu.Lock()
	storeErr = errors.New("store unreachable")
	mu.Unlock()
	expectReady(false, "store unreachable")
	mu.Lock()
	storeErr = nil
	mu.Unlock()
	expectReady(true, "OK")

	// A rejected configuration changes nothing.
	e.srv.ConfigRejected(errors.New("bad.yaml:3: nonsense"))
	expectReady(true, "OK")

	e.srv.SetDraining()
	next(healthpb.HealthCheckResponse_NOT_SERVING)
	expectReady(false, "draining")
	// Requests are still answered while draining.
	e.expect(req("api", d("user=a")), 1, "OK: OK")

	if _, err := e.health.Check(ctx, &healthpb.HealthCheckRequest{Service: "nope"}); status.Code(err) != grpccodes.NotFound {
		t.Errorf("unknown health service: %v", err)
	}
}

// limitedByOf returns the x-sluice-limited-by header of resp, "" if none.
func limitedByOf(resp *rlsv3.RateLimitResponse) string {
	for _, h := range resp.ResponseHeadersToAdd {
		if h.Key == server.LimitedByHeader {
			return h.Value
		}
	}
	return ""
}

// TestLimitedByHeader: with LimitedBy, an OVER_LIMIT answer says which
// rule denied it, over gRPC and HTTP, and stays clean of control
// characters from request values; an OK answer, or a server without it,
// says nothing.
func TestLimitedByHeader(t *testing.T) {
	const yaml = `
domain: api
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 1}
`
	on := newEnv(t, yaml, server.Config{LimitedBy: true})
	off := newEnv(t, yaml, server.Config{})
	header := limitedByOf
	r := req("api", d("user=bob\r\nX-Evil: 1"))
	if h := header(on.call(r)); h != "" {
		t.Errorf("an allowed request: %q", h)
	}
	resp := on.call(r)
	want := `rule="api.user_bob??X-Evil: 1"; descriptor=0; algorithm=fixed_window; limit=1/1h0m0s; remaining=0; reset=`
	if h := header(resp); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || !strings.HasPrefix(h, want) || !strings.HasSuffix(h, "s") {
		t.Errorf("a denied request: %v %q, want %q…s", resp.OverallCode, h, want)
	}
	off.call(r)
	if h := header(off.call(r)); h != "" {
		t.Errorf("without LimitedBy: %q", h)
	}
	// Over HTTP, as a response header.
	httpResp, err := http.Post(on.url+"/json", "application/json", strings.NewReader(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"bob"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	httpResp.Body.Close()
	httpResp, err = http.Post(on.url+"/json", "application/json", strings.NewReader(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"bob"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	httpResp.Body.Close()
	if h := httpResp.Header.Get(server.LimitedByHeader); httpResp.StatusCode != 429 || !strings.HasPrefix(h, `rule="api.user_bob"; descriptor=0;`) {
		t.Errorf("HTTP: %d %q", httpResp.StatusCode, h)
	}
}
