package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

const remotePermitRules = `domain: api
http:
  routes:
    - pattern: /
      name: all
      descriptors:
        - [{key: tenant, header: X-Tenant}]
        - [{key: remote_address}]
descriptors:
  - key: tenant
    concurrency: {max: 2, ttl: 30s}
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 1000}
`

// TestProxyE2ERemotePermits: sluice proxy --store remote in front of a
// slow upstream, deciding on a sluice serve --store redis
// --stream-done-release whose concurrency rule lets a tenant have 2
// requests in flight (ttl 30s). 2 slow requests are admitted and a 3rd is
// denied while they run; when they end, completed or with their clients
// gone, their slots come back at once, long before the TTL: the proxy
// sends the serve's permit token back (Envoy's stream-done descriptor).
// The proxy counts the permits acquired and released on the route, none
// held at the end; the serve counts the tokens issued and released, and
// refuses none (the token rides on the rate's descriptor too).
func TestProxyE2ERemotePermits(t *testing.T) {
	beside(t)
	srv := redistest.Standalone(t)
	started, hold := make(chan struct{}), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			started <- struct{}{}
			select {
			case <-hold:
			case <-r.Context().Done():
				return
			}
		}
		io.WriteString(w, "upstream")
	}))
	defer up.Close()
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, file, remotePermitRules)
	serve := startSluice(t, nil, "--config", file, "--stream-done-release", "--store", "redis", "--redis-url", srv.URL(), "--redis-prefix", t.Name()+":")
	p := startProxy(t, "--config", file, "--upstream", up.URL, "--store", "remote", "--rls-addr", serve.grpcAddr, "--failure-policy", "fail_closed")
	url := "http://" + p.addrs["proxy"]

	get := func(ctx context.Context, path string) int {
		req, _ := http.NewRequestWithContext(ctx, "GET", url+path, nil)
		req.Header.Set("X-Tenant", "acme")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	// slow sends a request to /slow: it returns when the upstream has
	// it (admitted, done receiving its status) or when it was answered
	// without reaching the upstream (its status).
	slow := func(ctx context.Context) (admitted bool, code int, done <-chan int) {
		c := make(chan int, 1)
		go func() { c <- get(ctx, "/slow") }()
		select {
		case <-started:
			return true, 0, c
		case code := <-c:
			return false, code, nil
		}
	}
	// two admits two slow requests, retrying a 429 (a release on its
	// way) for at most 5 s, a sixth of the TTL, and returns how long
	// that took and the channels of their statuses.
	two := func(ctx context.Context) (time.Duration, []<-chan int) {
		t.Helper()
		start := time.Now()
		var dones []<-chan int
		for len(dones) < 2 {
			ok, code, done := slow(ctx)
			switch {
			case ok:
				dones = append(dones, done)
			case code != http.StatusTooManyRequests:
				t.Fatalf("a slow request: %d, want 200 or 429", code)
			case time.Since(start) > 5*time.Second:
				t.Fatalf("%d of 2 slow requests admitted in %v: the slots of the requests that ended are still held (ttl 30s)", len(dones), time.Since(start))
			default:
				time.Sleep(20 * time.Millisecond)
			}
		}
		return time.Since(start), dones
	}

	for _, end := range []string{"completed", "client gone"} {
		ctx, cancel := context.WithCancel(context.Background())
		took, dones := two(ctx)
		t.Logf("before the round %q: 2 admitted in %v", end, took.Round(time.Millisecond))
		if code := get(context.Background(), "/"); code != http.StatusTooManyRequests {
			t.Fatalf("%s: a 3rd request while 2 run: %d, want 429", end, code)
		}
		if end == "completed" {
			hold <- struct{}{}
			hold <- struct{}{}
			for _, d := range dones {
				if code := <-d; code != http.StatusOK {
					t.Fatalf("a slow request: %d, want 200", code)
				}
			}
		} else {
			cancel()
			for _, d := range dones {
				<-d
			}
		}
		cancel()
	}
	took, dones := two(context.Background())
	t.Logf("after the clients hung up: 2 admitted in %v", took.Round(time.Millisecond))
	hold <- struct{}{}
	hold <- struct{}{}
	for _, d := range dones {
		<-d
	}

	admin := &proc{t: t, httpAddr: p.addrs["admin"]}
	route := `route="all"`
	poll(t, "the last releases counted", func() bool {
		return admin.metricSum("sluice_permits_released_total", route) == 6
	})
	for name, want := range map[string]float64{"sluice_permits_acquired_total": 6, "sluice_permits_held": 0, "sluice_permits_release_failures_total": 0} {
		if got := admin.metricSum(name, route); got != want {
			t.Errorf("the proxy's %s: %v, want %v", name, got, want)
		}
	}
	for event, want := range map[string]float64{"issued": 6, "released": 6, "refused": 0, "failed": 0} {
		if got := serve.metricSum("sluice_permit_tokens_total", `event="`+event+`"`); got != want {
			t.Errorf("the serve's sluice_permit_tokens_total{event=%q}: %v, want %v", event, got, want)
		}
	}
}

// failureRoutes is the http section of the failure permit tests: failed
// logins (401) counted per client address by the descriptor
// failed_login; RULES is replaced by the rules.
const failureRoutes = `domain: api
http:
  routes:
    - pattern: "POST /login"
      name: login
      failures:
        statuses: [401]
        descriptors: [[{key: failed_login, source: remote_address}]]
descriptors:
  - key: failed_login
RULES    rate_limit: {unit: minute, requests_per_unit: 3}
`

// failureConcurrency is a concurrency limit on failed_login.
const failureConcurrency = "    concurrency: {max: 10, ttl: 60s}\n"

// TestProxyE2ERemoteFailurePermits: sluice proxy --store remote, whose
// own rules put no concurrency limit on its failure descriptor, decides
// on a sluice serve --stream-done-release whose rules do. Each failure
// the proxy charges takes a permit on the serve; the proxy gives it back
// at once: after 3 failed logins (the 4th attempt denied: each failure
// counted) the proxy holds no permit and released every one it
// acquired, and the serve released every token it issued, long before
// the ttl (60s). A reload of the proxy's file that puts the concurrency
// limit in its own rules is refused, naming the route and the
// descriptor, and the configuration in force stays.
func TestProxyE2ERemoteFailurePermits(t *testing.T) {
	beside(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
	}))
	defer up.Close()
	dir := t.TempDir()
	serveFile, proxyFile := filepath.Join(dir, "serve.yaml"), filepath.Join(dir, "proxy.yaml")
	writeRules(t, serveFile, strings.Replace(failureRoutes, "RULES", failureConcurrency, 1))
	writeRules(t, proxyFile, strings.Replace(failureRoutes, "RULES", "", 1))
	serve := startSluice(t, nil, "--config", serveFile, "--stream-done-release")
	p := startProxy(t, "--config", proxyFile, "--upstream", up.URL, "--store", "remote", "--rls-addr", serve.grpcAddr)
	url := "http://" + p.addrs["proxy"] + "/login"

	for i, want := range []int{401, 401, 401, 429} {
		if code, _, body := fetch(t, "POST", url); code != want {
			t.Fatalf("attempt %d: %d %q, want %d", i, code, body, want)
		}
	}
	admin := &proc{t: t, httpAddr: p.addrs["admin"]}
	route := `route="login"`
	poll(t, "the proxy's failure permits released", func() bool {
		a := admin.metricSum("sluice_permits_acquired_total", route)
		return a > 0 && admin.metricSum("sluice_permits_released_total", route) == a
	})
	if h := admin.metricSum("sluice_permits_held", route); h != 0 {
		t.Errorf("the proxy holds %v permits after every request ended, want 0", h)
	}
	issued := serve.metricSum("sluice_permit_tokens_total", `event="issued"`)
	if r := serve.metricSum("sluice_permit_tokens_total", `event="released"`); issued == 0 || r != issued {
		t.Errorf("the serve issued %v permit tokens and released %v, want as many (and some)", issued, r)
	}

	writeRules(t, proxyFile, strings.Replace(failureRoutes, "RULES", failureConcurrency, 1))
	p.waitLog("configuration problem", `route \"login\"`, "failures.descriptors[0]", "concurrency")
	p.waitLog("keeping the rules in force")
	if n := strings.Count(p.log(), "configuration loaded"); n != 0 {
		t.Errorf("the refused file was loaded (%d loads):\n%s", n, p.log())
	}
}
