package proxy_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/edges/hitters"
	"github.com/sluicehq/sluice/internal/edges/httpconf"
	"github.com/sluicehq/sluice/internal/edges/proxy"
	"github.com/sluicehq/sluice/internal/testsupport/logtest"
	"github.com/sluicehq/sluice/internal/testsupport/loopback"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
)

// wait bounds every wait of these tests.
const wait = 10 * time.Second

// upstream is a real HTTP server behind the proxy that counts the requests
// it sees and keeps the last one's headers.
type upstream struct {
	*httptest.Server
	hits atomic.Int64
	mu   sync.Mutex
	last http.Header
}

// newUpstream starts an upstream answering with h, or "ok" when h is nil.
func newUpstream(t *testing.T, h http.HandlerFunc) *upstream {
	t.Helper()
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		u.mu.Lock()
		u.last = r.Header.Clone()
		u.mu.Unlock()
		if h != nil {
			h(w, r)
			return
		}
		io.WriteString(w, "ok")
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) header() http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.last
}

// fixture is a proxy on a real loopback listener in front of an upstream.
type fixture struct {
	t     *testing.T
	up    *upstream
	p     *proxy.Proxy
	srv   *httptest.Server
	reg   *prometheus.Registry
	dec   *decide.Decider
	store sluice.Store
	logs  *logtest.Buffer // the proxy's log

	inflight atomic.Int64 // requests in the proxy's handler
	closed   sync.Map     // the clients' addresses of the connections the server closed
}

// start runs a proxy whose rules and http section are src, in front of up,
// deciding with a memstore.
func start(t *testing.T, src string, up *upstream) *fixture {
	t.Helper()
	store := memstore.New(memstore.Config{})
	t.Cleanup(func() { store.Close() })
	return startWith(t, src, up, store, nil)
}

func startWith(t *testing.T, src string, up *upstream, store sluice.Store, top *hitters.Tracker) *fixture {
	t.Helper()
	return startEdited(t, src, up, store, top, nil)
}

// startEdited is startWith, with the proxy's Config changed by edit
// (when not nil) before the proxy is made.
func startEdited(t *testing.T, src string, up *upstream, store sluice.Store, top *hitters.Tracker, edit func(*proxy.Config)) *fixture {
	t.Helper()
	section, err := httpconf.Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	dec := mustDecider(sluice.NewLimiter(store), rulestest.Config(t, src))
	reg := prometheus.NewRegistry()
	m, err := proxy.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(up.URL)
	logs := new(logtest.Buffer)
	cfg := proxy.Config{Upstream: u, Decider: dec, Domain: "api", HTTP: section, Metrics: m, Hitters: top, Logger: logs.Logger()}
	if edit != nil {
		edit(&cfg)
	}
	p, err := proxy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, up: up, p: p, reg: reg, dec: dec, store: store, logs: logs}
	// The proxy counts a request when its handler returns, after the
	// client may have its answer: count waits for the handlers to return.
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.inflight.Add(1)
		defer f.inflight.Add(-1)
		p.ServeHTTP(w, r)
	}))
	f.srv.Config.MaxHeaderBytes = 2 << 20 // room for a 1 MB X-Forwarded-For
	f.srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			f.closed.Store(c.RemoteAddr().String(), true)
		}
	}
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	return f
}

// do sends a request through the proxy with the given header lines
// ("Name: value") and returns the response with its body read.
func (f *fixture) do(c *http.Client, method, path string, lines ...string) (*http.Response, string) {
	f.t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	for _, l := range lines {
		name, value, _ := strings.Cut(l, ": ")
		if name == "Host" {
			req.Host = value
			continue
		}
		req.Header.Add(name, value)
	}
	if c == nil {
		c = f.srv.Client()
	}
	resp, err := c.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		f.t.Fatal(err)
	}
	return resp, string(body)
}

func (f *fixture) get(path string, lines ...string) (*http.Response, string) {
	f.t.Helper()
	return f.do(nil, http.MethodGet, path, lines...)
}

// count returns the value of the counter name with the given labels.
func (f *fixture) count(name string, labels ...string) float64 {
	f.t.Helper()
	for deadline := time.Now().Add(wait); f.inflight.Load() > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			f.t.Fatalf("requests still in the proxy after %v", wait)
		}
	}
	return f.metric(name, labels...)
}

func matches(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, lp := range m.GetLabel() {
			found = found || lp.GetName() == labels[i] && lp.GetValue() == labels[i+1]
		}
		if !found {
			return false
		}
	}
	return true
}

// clientFrom returns an HTTP client whose connections come from ip.
var clientFrom = loopback.Client

// The test rules limit by sliding_log over an hour: a fixed window would
// start afresh, and let a request through, when a test crosses its edge.
const perIP = `domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: sliding_log}
`

// A limit of the rules denies with 429 and a problem body before the
// upstream sees the request; the remaining count goes down to 0.
func TestLimitBeforeUpstream(t *testing.T) {
	up := newUpstream(t, nil)
	f := start(t, perIP, up)
	for i, want := range []string{"2", "1", "0"} {
		resp, body := f.get("/any/path?q=1")
		if resp.StatusCode != http.StatusOK || body != "ok" {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
		if got := resp.Header.Get("X-RateLimit-Remaining"); got != want {
			t.Errorf("request %d: X-RateLimit-Remaining %q, want %q", i, got, want)
		}
		if got := resp.Header.Get("X-RateLimit-Limit"); got != "3" {
			t.Errorf("request %d: X-RateLimit-Limit %q", i, got)
		}
	}
	resp, body := f.get("/any/path")
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("4th request: %d %q", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q", ct)
	}
	if resp.Header.Get("Retry-After") == "" || resp.Header.Get("X-RateLimit-Remaining") != "0" {
		t.Errorf("denial headers: %v", resp.Header)
	}
	var p struct {
		Status     int   `json:"status"`
		RetryAfter int64 `json:"retry-after"`
	}
	if err := json.Unmarshal([]byte(body), &p); err != nil || p.Status != 429 || p.RetryAfter < 1 {
		t.Errorf("problem body %q: %+v, %v", body, p, err)
	}
	if n := up.hits.Load(); n != 3 {
		t.Errorf("upstream saw %d requests, want 3", n)
	}
	if a, d := f.count("sluice_proxy_requests_total", "route", "/", "result", "allowed"), f.count("sluice_proxy_requests_total", "route", "/", "result", "denied"); a != 3 || d != 1 {
		t.Errorf("metrics: %v allowed, %v denied", a, d)
	}
	if n := f.count("sluice_proxy_request_duration_seconds", "route", "/"); n != 4 {
		t.Errorf("duration histogram has %v samples, want 4", n)
	}
}

const routed = `domain: api
http:
  routes:
    - pattern: "POST /login"
      name: login
      descriptors:
        - [{key: login, source: remote_address}]
    - pattern: "/api/"
      name: api
descriptors:
  - key: login
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: sliding_log}
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: sliding_log}
`

// Each route has its own descriptors and so its own limits; a request that
// matches no route is proxied unlimited.
func TestRoutes(t *testing.T) {
	up := newUpstream(t, nil)
	f := start(t, routed, up)
	status := func(method, path string) int {
		resp, _ := f.do(nil, method, path)
		return resp.StatusCode
	}
	if s := status("POST", "/login"); s != 200 {
		t.Errorf("first login: %d", s)
	}
	if s := status("POST", "/login"); s != 429 {
		t.Errorf("second login: %d, want 429", s)
	}
	// The api route's limit is another: two requests, then 429.
	if s1, s2, s3 := status("GET", "/api/a"), status("GET", "/api/b"), status("GET", "/api/c"); s1 != 200 || s2 != 200 || s3 != 429 {
		t.Errorf("api: %d %d %d, want 200 200 429", s1, s2, s3)
	}
	// GET /login and /other match no route: never limited.
	for range 5 {
		if s1, s2 := status("GET", "/login"), status("GET", "/other"); s1 != 200 || s2 != 200 {
			t.Fatalf("unmatched: %d %d", s1, s2)
		}
	}
	if n := up.hits.Load(); n != 1+2+10 {
		t.Errorf("upstream saw %d requests, want 13", n)
	}
	if n := f.count("sluice_proxy_requests_total", "route", "_unmatched", "result", "unlimited"); n != 10 {
		t.Errorf("unlimited: %v", n)
	}
	if n := f.count("sluice_proxy_requests_total", "route", "login", "result", "denied"); n != 1 {
		t.Errorf("login denied: %v", n)
	}
	// A path that is not clean is redirected, never proxied: its route is
	// chosen by the clean path.
	c := f.srv.Client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	before := up.hits.Load()
	resp, _ := f.do(c, "POST", "/x/../login")
	if resp.StatusCode/100 != 3 || up.hits.Load() != before {
		t.Errorf("unclean path: %d, upstream hits %d -> %d", resp.StatusCode, before, up.hits.Load())
	}
	// An encoded separator keeps a path off its route (ServeMux reads
	// "api%2Fa" as one segment) where an upstream that decodes first
	// would serve /api/a: refused, never proxied unlimited.
	for _, path := range []string{"/api%2Fa", "/api%2fb", "/x/..%2F..%2Flogin", "/api%5Cc", "/api%5cd"} {
		resp, _ := f.do(nil, "GET", path)
		if resp.StatusCode != 400 || up.hits.Load() != before {
			t.Errorf("%s: %d, upstream hits %d -> %d; want 400 and never proxied", path, resp.StatusCode, before, up.hits.Load())
		}
	}
	// Other escapes are read as ServeMux reads them: %61 is an a.
	if s := status("GET", "/%61pi/d"); s != 429 {
		t.Errorf("/%%61pi/d: %d, want 429 (the api route's limit, spent above)", s)
	}
}

const trusting = `domain: api
http:
  client_ip:
    trusted_proxies: [127.0.0.2]
  routes:
    - pattern: /
      descriptors:
        - [{key: remote_address}]
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: sliding_log}
`

// A forwarding header from an untrusted peer changes neither the client's
// key nor what the upstream is told; a trusted peer's chain is extended.
func TestForwardingHeaders(t *testing.T) {
	up := newUpstream(t, nil)
	f := start(t, trusting, up)

	// From 127.0.0.1, untrusted: the spoofed headers are dropped or
	// replaced, and the limit is 127.0.0.1's.
	resp, _ := f.get("/", "X-Forwarded-For: 203.0.113.1", "X-Forwarded-Host: evil.example", "X-Forwarded-Proto: https",
		"X-Real-IP: 203.0.113.1", "Forwarded: for=203.0.113.1", "Host: api.example")
	if resp.StatusCode != 200 {
		t.Fatalf("first: %d", resp.StatusCode)
	}
	h := up.header()
	for name, want := range map[string]string{
		"X-Forwarded-For": "127.0.0.1", "X-Forwarded-Host": "api.example", "X-Forwarded-Proto": "http", "X-Real-Ip": "", "Forwarded": "",
	} {
		if got := strings.Join(h.Values(name), "|"); got != want {
			t.Errorf("untrusted peer: upstream got %s %q, want %q", name, got, want)
		}
	}
	// Another spoofed address does not escape 127.0.0.1's limit.
	if resp, _ := f.get("/", "X-Forwarded-For: 203.0.113.2"); resp.StatusCode != 429 {
		t.Errorf("spoofed X-Forwarded-For escaped the limit: %d", resp.StatusCode)
	}

	// From 127.0.0.2, trusted: the client is the right-most untrusted
	// address of the chain, with a limit of its own (203.0.113.1 was
	// never charged above), and the chain goes on extended.
	trusted := clientFrom(t, "127.0.0.2")
	resp, _ = f.do(trusted, "GET", "/", "X-Forwarded-For: 198.51.100.7, 203.0.113.1", "X-Forwarded-Host: api.example",
		"X-Forwarded-Proto: https", "X-Real-IP: 203.0.113.1", "Forwarded: for=203.0.113.1")
	if resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("trusted: %d %v", resp.StatusCode, resp.Header)
	}
	h = up.header()
	for name, want := range map[string]string{
		"X-Forwarded-For":   "198.51.100.7, 203.0.113.1, 127.0.0.2",
		"X-Forwarded-Host":  "api.example",
		"X-Forwarded-Proto": "https",
		"X-Real-Ip":         "203.0.113.1",
		"Forwarded":         "for=203.0.113.1|for=127.0.0.2;proto=http",
	} {
		if got := strings.Join(h.Values(name), "|"); got != want {
			t.Errorf("trusted peer: upstream got %s %q, want %q", name, got, want)
		}
	}
	if resp, _ := f.do(trusted, "GET", "/", "X-Forwarded-For: 203.0.113.1"); resp.StatusCode != 429 {
		t.Errorf("203.0.113.1 through the trusted proxy again: %d, want 429", resp.StatusCode)
	}
	if resp, _ := f.do(trusted, "GET", "/", "X-Forwarded-For: 203.0.113.3"); resp.StatusCode != 200 {
		t.Errorf("another client through the trusted proxy: %d, want 200", resp.StatusCode)
	}
}

// A response chunk reaches the client before the upstream finishes: the
// upstream blocks until the client has read it. Both for a response of
// unknown length (chunked) and one with a Content-Length.
func TestStreamingResponse(t *testing.T) {
	for _, length := range []bool{false, true} {
		name := "chunked"
		if length {
			name = "content-length"
		}
		t.Run(name, func(t *testing.T) {
			read := make(chan struct{})
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				if length {
					w.Header().Set("Content-Length", "12")
				}
				io.WriteString(w, "first\n")
				http.NewResponseController(w).Flush()
				select {
				case <-read:
					io.WriteString(w, "last.\n")
				case <-time.After(wait):
					io.WriteString(w, "late!\n")
				}
			})
			f := start(t, perIP, up)
			resp, err := f.srv.Client().Get(f.srv.URL + "/stream")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			line, err := br.ReadString('\n')
			if err != nil || line != "first\n" {
				t.Fatalf("first chunk: %q, %v", line, err)
			}
			close(read)
			rest, err := io.ReadAll(br)
			if err != nil || string(rest) != "last.\n" {
				t.Errorf("rest: %q, %v (the first chunk came only when the upstream finished)", rest, err)
			}
		})
	}
}

// A request body reaches the upstream as the client sends it: the client
// sends its second chunk only once the upstream has read the first.
func TestStreamingRequest(t *testing.T) {
	got := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		br := bufio.NewReader(r.Body)
		line, err := br.ReadString('\n')
		if err != nil || line != "one\n" {
			http.Error(w, "first line "+line, http.StatusBadRequest)
			return
		}
		close(got)
		rest, _ := io.ReadAll(br)
		io.WriteString(w, line+string(rest))
	})
	f := start(t, perIP, up)
	pr, pw := io.Pipe()
	go func() {
		io.WriteString(pw, "one\n")
		select {
		case <-got:
			io.WriteString(pw, "two\n")
		case <-time.After(wait):
			io.WriteString(pw, "late\n")
		}
		pw.Close()
	}()
	resp, err := f.srv.Client().Post(f.srv.URL+"/upload", "text/plain", pr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(body) != "one\ntwo\n" {
		t.Errorf("%d %q: the body was not streamed", resp.StatusCode, body)
	}
}

// An upgrade (as WebSocket's) passes through the limit and the proxy:
// 101 Switching Protocols, then bytes both ways over the hijacked
// connections.
func TestUpgrade(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "sluice-test" {
			http.Error(w, "no upgrade", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: sluice-test\r\nConnection: Upgrade\r\n\r\nwelcome\n")
		line, err := brw.ReadString('\n')
		if err != nil {
			return
		}
		io.WriteString(conn, "echo "+line)
	})
	f := start(t, perIP, up)
	conn, err := net.DialTimeout("tcp", f.srv.Listener.Addr().String(), wait)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(wait))
	io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: api.example\r\nConnection: Upgrade\r\nUpgrade: sluice-test\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("X-RateLimit-Remaining") != "2" {
		t.Fatalf("upgrade answered %d, headers %v", resp.StatusCode, resp.Header)
	}
	if line, err := br.ReadString('\n'); err != nil || line != "welcome\n" {
		t.Fatalf("from upstream: %q, %v", line, err)
	}
	io.WriteString(conn, "ping\n")
	if line, err := br.ReadString('\n'); err != nil || line != "echo ping\n" {
		t.Fatalf("echo: %q, %v", line, err)
	}
}

// A dead upstream is a 502 with a problem body that says nothing of why.
func TestDeadUpstream(t *testing.T) {
	withFailures := `domain: api
http:
  routes:
    - pattern: /
      failures:
        statuses: [401]
        descriptors: [[{key: remote_address}]]
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: sliding_log}
`
	// A route with failure limits sees the status through the
	// middleware's own writer: the upstream error is counted all the same.
	for name, src := range map[string]string{"per IP": perIP, "failures": withFailures} {
		t.Run(name, func(t *testing.T) {
			up := newUpstream(t, nil)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			dead := ln.Addr().String()
			ln.Close()
			up.URL = "http://" + dead
			f := start(t, src, up)
			resp, body := f.get("/x")
			if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("%d %v %q", resp.StatusCode, resp.Header, body)
			}
			_, port, _ := net.SplitHostPort(dead)
			for _, leak := range []string{"dial", "refused", "connect", port, "127.0.0.1"} {
				if strings.Contains(body, leak) {
					t.Errorf("body leaks %q: %s", leak, body)
				}
			}
			if !strings.Contains(body, proxy.ProblemBadGateway) {
				t.Errorf("body %s", body)
			}
			if n := f.count("sluice_proxy_upstream_errors_total", "route", "/"); n != 1 {
				t.Errorf("upstream errors: %v", n)
			}
		})
	}
}

// Shadow mode lets denials through, counted as shadow, without
// Retry-After.
func TestShadowMode(t *testing.T) {
	up := newUpstream(t, nil)
	f := start(t, "domain: api\nhttp:\n  shadow_mode: true\n"+perIP[len("domain: api\n"):], up)
	for i := range 5 {
		resp, _ := f.get("/")
		if resp.StatusCode != 200 || resp.Header.Get("Retry-After") != "" {
			t.Errorf("request %d: %d %v", i, resp.StatusCode, resp.Header)
		}
	}
	if n := up.hits.Load(); n != 5 {
		t.Errorf("upstream saw %d", n)
	}
	if a, s := f.count("sluice_proxy_requests_total", "result", "allowed"), f.count("sluice_proxy_requests_total", "result", "shadow"); a != 3 || s != 2 {
		t.Errorf("%v allowed, %v shadow", a, s)
	}
}

// The top keys see what the proxy did: in the http section's shadow mode
// a request over the limit is let through, so it is counted as
// shadow-denied, not denied; without it, denied.
func TestHittersOutcomes(t *testing.T) {
	for _, shadow := range []bool{false, true} {
		up := newUpstream(t, nil)
		top := hitters.New(hitters.Config{})
		defer top.Close()
		src := perIP
		if shadow {
			src = "domain: api\nhttp:\n  shadow_mode: true\n" + perIP[len("domain: api\n"):]
		}
		store := memstore.New(memstore.Config{})
		defer store.Close()
		f := startWith(t, src, up, store, top)
		for range 5 {
			f.get("/")
		}
		var allowed, denied, shadowed int64
		for _, r := range top.Rules() {
			for _, p := range top.Series(r) {
				allowed, denied, shadowed = allowed+p.Allowed, denied+p.Denied, shadowed+p.Shadow
			}
		}
		want := [3]int64{3, 2, 0}
		if shadow {
			want = [3]int64{3, 0, 2}
		}
		if got := [3]int64{allowed, denied, shadowed}; got != want {
			t.Errorf("shadow mode %v: allowed, denied, shadow-denied %v, want %v", shadow, got, want)
		}
		if items, _ := top.Top(top.Rules()[0], hitters.Denials, false, 1); shadow != (len(items) == 0) {
			t.Errorf("shadow mode %v: top denials %v", shadow, items)
		}
	}
}

// SetRoutes swaps the whole table; a table that does not build keeps the
// one in force.
func TestSetRoutes(t *testing.T) {
	up := newUpstream(t, nil)
	f := start(t, routed, up)
	if resp, _ := f.get("/elsewhere"); resp.Header.Get("X-RateLimit-Limit") != "" {
		t.Fatalf("unmatched request limited: %v", resp.Header)
	}
	s, err := httpconf.Parse("test.yaml", []byte(perIP))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.p.SetRoutes("api", s); err != nil {
		t.Fatal(err)
	}
	if resp, _ := f.get("/elsewhere"); resp.Header.Get("X-RateLimit-Limit") != "2" {
		t.Errorf("after the swap, / is not limited: %v", resp.Header)
	}
	// The login route's series went with it.
	if n := f.count("sluice_proxy_requests_total", "route", "login"); n != 0 {
		t.Errorf("login series still there: %v", n)
	}
	for _, bad := range []*httpconf.Section{
		{Routes: []httpconf.Route{{Pattern: "/", Name: "a"}, {Pattern: "/", Name: "b"}}},
		{Routes: []httpconf.Route{{Pattern: "get", Name: "a"}}},
		{Routes: nil},
	} {
		if err := f.p.SetRoutes("api", bad); !errors.Is(err, proxy.ErrConfig) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
	if resp, _ := f.get("/elsewhere"); resp.Header.Get("X-RateLimit-Limit") != "2" {
		t.Errorf("a bad table replaced the good one: %v", resp.Header)
	}
}

func TestNewErrors(t *testing.T) {
	dec := mustDecider(sluice.NewLimiter(memstore.New(memstore.Config{})), rulestest.Config(t, perIP))
	for _, tc := range []struct {
		name     string
		upstream string
		domain   string
	}{
		{"no scheme", "localhost:8080", "api"},
		{"ftp", "ftp://host/", "api"},
		{"no host", "http:///x", "api"},
		{"no domain", "http://127.0.0.1:1", ""},
	} {
		u, _ := url.Parse(tc.upstream)
		if _, err := proxy.New(proxy.Config{Upstream: u, Decider: dec, Domain: tc.domain}); !errors.Is(err, proxy.ErrConfig) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	u, _ := url.Parse("http://127.0.0.1:1")
	if _, err := proxy.New(proxy.Config{Upstream: u, Domain: "api"}); !errors.Is(err, proxy.ErrConfig) {
		t.Errorf("no decider: %v", err)
	}
	if _, err := proxy.New(proxy.Config{Domain: "api", Decider: dec}); !errors.Is(err, proxy.ErrConfig) {
		t.Errorf("no upstream: %v", err)
	}
}

// TestHittersOncePerRequest: the top keys count each request once, by the
// decision that settled it, however many decisions the middleware made
// for it: a failure limit's peeks and charges, the failure limits denying
// first, a shaped request decided again while it waits.
func TestHittersOncePerRequest(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/login" {
			w.WriteHeader(http.StatusUnauthorized)
		}
	})
	top := hitters.New(hitters.Config{})
	defer top.Close()
	store := memstore.New(memstore.Config{})
	defer store.Close()
	f := startWith(t, `domain: api
http:
  routes:
    - pattern: "POST /login"
      failures:
        statuses: [401]
        descriptors: [[{key: failed_login, source: remote_address}]]
      descriptors: [[{key: remote_address}]]
    - pattern: "/shaped"
      shaping: {max_delay: 3s}
      descriptors: [[{key: generic_key, value: shaped}]]
descriptors:
  - key: failed_login
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: sliding_log}
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: generic_key
    value: shaped
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: gcra}
`, up, store, top)
	var got []string
	for range 4 {
		resp, _ := f.do(nil, "POST", "/login")
		got = append(got, resp.Status[:3])
	}
	for range 2 {
		resp, _ := f.get("/shaped")
		got = append(got, resp.Status[:3])
	}
	if want := "401,401,429,429,200,200"; strings.Join(got, ",") != want {
		t.Fatalf("answers %s, want %s", strings.Join(got, ","), want)
	}
	counts := map[string][2]int64{}
	for _, r := range top.Rules() {
		var c [2]int64
		for _, p := range top.Series(r) {
			c[0], c[1] = c[0]+p.Allowed, c[1]+p.Denied+p.Shadow
		}
		counts[r] = c
	}
	want := map[string][2]int64{
		"api.remote_address":     {2, 0}, // the two logins the failure limits let through
		"api.failed_login":       {0, 2}, // the two they denied first
		"api.generic_key_shaped": {2, 0}, // the second waited, and was admitted
	}
	if fmt.Sprint(counts) != fmt.Sprint(want) {
		t.Errorf("allowed and denied by rule %v, want %v", counts, want)
	}
}
