package server_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/fault"
	"github.com/sluicehq/sluice/internal/decision/ratelimitheaders"
	"github.com/sluicehq/sluice/internal/edges/server"
	"github.com/sluicehq/sluice/internal/testsupport/logtest"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

// downStore is a memstore that a test takes down and brings back, and that
// reports its state with a Health method. Real Redis outages (a
// killed server, deadlines, the circuit breaker) are tested end to end with
// the Redis store; the server only sees Take's error and Health.
type downStore struct {
	inner sluice.Store
	mu    sync.Mutex
	err   error
}

func (s *downStore) Take(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	if err := s.Health(); err != nil {
		return err
	}
	return s.inner.Take(ctx, hits, out)
}

func (s *downStore) Health() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *downStore) set(err error) {
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
}

var errRedisDown = &fault.StoreError{Reason: fault.BreakerOpen, Err: errors.New("redis: circuit breaker open")}

// failoverEnv is a server over a downStore, with a decider whose failure
// handling is f (its Local, if any, a fresh memstore).
func failoverEnv(t *testing.T, f decide.Failover, cfg server.Config) (*env, *downStore) {
	t.Helper()
	mem := memstore.New(memstore.Config{SweepInterval: -1})
	local := memstore.New(memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { mem.Close(); local.Close() })
	store := &downStore{inner: mem}
	if f.Default == rules.FailLocal || f.Nodes > 0 {
		f.Local = sluice.NewLimiter(local)
	}
	cfg.Decide = decide.Config{Limiter: sluice.NewLimiter(store), Failover: f}
	cfg.StoreHealth = store.Health
	return newEnvStore(t, "", cfg, nil), store
}

// threeDomains: the default policy, local and fail_closed.
func threeDomains(t *testing.T) *rules.Config {
	t.Helper()
	var ds []*rules.Domain
	for _, src := range []string{
		"domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 10}\n",
		"domain: auth\nfailure_policy: local\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
		"domain: pay\nfailure_policy: fail_closed\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 10}\n",
	} {
		d, err := rules.Parse("test.yaml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	cfg, err := rules.NewConfig(ds...)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestFailurePolicies(t *testing.T) {
	var logs logtest.Buffer
	e, store := failoverEnv(t, decide.Failover{Nodes: 2}, server.Config{
		Headers: ratelimitheaders.HeadersAll,
		Logger:  slog.New(slog.NewTextHandler(&logs, nil)),
	})
	e.srv.ConfigLoaded(threeDomains(t), epoch)
	if got := metric(t, e.reg, "sluice_store_up"); got != 1 {
		t.Errorf("store up %v", got)
	}
	e.expect(req("api", d("user=a")), 1, "OK: OK")

	store.set(errRedisDown)
	if got := metric(t, e.reg, "sluice_store_up"); got != 0 {
		t.Errorf("store up %v while down", got)
	}
	// fail_open, the default: OK, and no quota advertised.
	for range 3 {
		resp := e.call(req("api", d("user=a")))
		if codes(resp) != "OK: OK" || len(resp.ResponseHeadersToAdd) != 0 || resp.Statuses[0].CurrentLimit != nil {
			t.Errorf("fail_open: %s %v", codes(resp), resp)
		}
	}
	// local: 5 per minute over 2 nodes is floor(5/2) = 2 on this one, and
	// the headers tell the configured limit.
	e.expect(req("auth", d("user=a")), 2, "OK: OK")
	resp := e.call(req("auth", d("user=a")))
	if codes(resp) != "OVER_LIMIT: OVER_LIMIT" || headers(resp)["X-RateLimit-Limit"] != "5" {
		t.Errorf("local: %s %v", codes(resp), headers(resp))
	}
	// fail_closed: denied, come back in a second.
	resp = e.call(req("pay", d("user=a")))
	if codes(resp) != "OVER_LIMIT: OVER_LIMIT" || headers(resp)["Retry-After"] != "1" {
		t.Errorf("fail_closed: %s %v", codes(resp), headers(resp))
	}
	// A request without limits needs no store and no policy.
	e.expect(req("api", d("nothing=1")), 1, "OK: OK")

	for _, c := range []struct {
		domain, policy string
		want           float64
	}{{"api", "fail_open", 3}, {"auth", "local", 3}, {"pay", "fail_closed", 1}} {
		if got := metric(t, e.reg, "sluice_failure_policy_total", "domain="+c.domain, "policy="+c.policy, "reason=breaker_open"); got != c.want {
			t.Errorf("%s %s: %v, want %v", c.domain, c.policy, got, c.want)
		}
	}
	if got := series(t, e.reg, "sluice_failure_policy_total"); got != 3 {
		t.Errorf("%d failure policy series", got)
	}
	if got := metric(t, e.reg, "sluice_store_errors_total"); got != 7 {
		t.Errorf("store errors %v, want 7", got)
	}
	if got := metric(t, e.reg, "sluice_decisions_total", "where=policy"); got != 7 {
		t.Errorf("decisions by the policy %v, want 7", got)
	}
	// The per-rule metrics still count the hits.
	if got := metric(t, e.reg, "sluice_rule_hits_total", "domain=api", "rule=api.user"); got != 4 {
		t.Errorf("api hits %v, want 4", got)
	}
	if got := metric(t, e.reg, "sluice_requests_total", "transport=grpc", "result=over_limit"); got != 2 {
		t.Errorf("over-limit requests %v, want 2", got)
	}
	// One log line at once, then at most one a minute: not one per
	// request, nor per domain.
	out := logs.String()
	if n := strings.Count(out, "the failure policy is answering"); n != 1 {
		t.Errorf("%d log lines:\n%s", n, out)
	}
	for _, want := range []string{"level=WARN", "domain=api policy=fail_open reason=breaker_open", "circuit breaker open", "answered_since_last_line=1"} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %q:\n%s", want, out)
		}
	}

	// Still ready: every node pulled out of the load balancer would turn
	// fail_open into an outage.
	code, body := e.get("/readyz")
	if code != http.StatusOK || !strings.Contains(body, "OK\nstore: down: redis: circuit breaker open") || !strings.Contains(body, "default is fail_open") ||
		!strings.Contains(body, "\nfailure policy: answered 7 requests since ") || !strings.Contains(body, "reason breaker_open") {
		t.Errorf("/readyz: %d %q", code, body)
	}
	if st, err := e.health.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil || st.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC health: %v %v", st, err)
	}

	// Recovery: the store's own answers, which counted one request.
	store.set(nil)
	resp = e.call(req("api", d("user=a")))
	if codes(resp) != "OK: OK" || resp.Statuses[0].LimitRemaining != 8 || headers(resp)["X-RateLimit-Remaining"] != "8" {
		t.Errorf("after recovery: %s %v", codes(resp), resp.Statuses[0])
	}
	// For a minute after its last answer, /readyz still tells.
	if code, body := e.get("/readyz"); code != http.StatusOK || !strings.HasPrefix(body, "OK\nstore: up\nfailure policy: answered 7 requests since ") {
		t.Errorf("/readyz after recovery: %d %q", code, body)
	}
}

// With fail_closed as the default, a node whose store is down answers
// nothing but denials: it is not ready, so that traffic goes to nodes that
// can decide.
func TestReadinessFailClosed(t *testing.T) {
	e, store := failoverEnv(t, decide.Failover{Default: rules.FailClosed}, server.Config{})
	e.srv.ConfigLoaded(rulestest.Config(t, hitsRules), epoch)
	check := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for _, name := range []string{"", "ratelimit"} {
			st, err := e.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
			if err != nil || st.Status != want {
				t.Errorf("gRPC health %q: %v %v, want %v", name, st, err, want)
			}
		}
	}
	check(healthpb.HealthCheckResponse_SERVING)
	store.set(errRedisDown)
	code, body := e.get("/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "not ready: store down (redis: circuit breaker open) and the default failure policy is fail_closed") || !strings.Contains(body, "store: down") {
		t.Errorf("/readyz: %d %q", code, body)
	}
	check(healthpb.HealthCheckResponse_NOT_SERVING)
	// Requests that still arrive are answered by the policy.
	e.expect(req("api", d("user=a")), 1, "OVER_LIMIT: OVER_LIMIT")
	store.set(nil)
	if code, body := e.get("/readyz"); code != http.StatusOK || !strings.HasPrefix(body, "OK\nstore: up\n") {
		t.Errorf("/readyz after recovery: %d %q", code, body)
	}
	check(healthpb.HealthCheckResponse_SERVING)
}

// Config.StoreHealth stands in for a store that does not report its
// health itself (one wrapped by another layer); without either there is no
// store line and no sluice_store_up.
func TestStoreHealthConfig(t *testing.T) {
	var mu sync.Mutex
	var storeErr error
	e := newEnv(t, hitsRules, server.Config{StoreHealth: func() error {
		mu.Lock()
		defer mu.Unlock()
		return storeErr
	}})
	if code, body := e.get("/readyz"); code != http.StatusOK || body != "OK\nstore: up\n" {
		t.Errorf("/readyz: %d %q", code, body)
	}
	mu.Lock()
	storeErr = errors.New("sentinel: no master")
	mu.Unlock()
	if got := metric(t, e.reg, "sluice_store_up"); got != 0 {
		t.Errorf("store up %v", got)
	}
	if code, body := e.get("/readyz"); code != http.StatusOK || !strings.Contains(body, "store: down: sentinel: no master") {
		t.Errorf("/readyz: %d %q", code, body)
	}

	e = newEnv(t, hitsRules, server.Config{})
	if code, body := e.get("/readyz"); code != http.StatusOK || body != "OK\n" {
		t.Errorf("/readyz without store health: %d %q", code, body)
	}
	if n := series(t, e.reg, "sluice_store_up"); n != 0 {
		t.Errorf("sluice_store_up without store health: %d series", n)
	}
}
