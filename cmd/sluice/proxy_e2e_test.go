package main

// End-to-end tests of sluice proxy: the real binary (built once, as for
// sluice serve's tests) on loopback ports it picks itself, in front of a
// real upstream, driven by a real HTTP client.

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

const proxyRules = `domain: api
http:
  routes:
    - pattern: "POST /login"
      name: login
      descriptors:
        - [{key: login, source: remote_address}]
    - pattern: /
descriptors:
  - key: login
    rate_limit: {unit: hour, requests_per_unit: LOGIN, algorithm: sliding_log}
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: sliding_log}
`

// startProxy runs sluice proxy with args and waits until it is ready.
func startProxy(t *testing.T, args ...string) *proc {
	t.Helper()
	p := launchCommand(t, "proxy", []string{"listen", "admin-listen"}, nil, args...)
	p.waitReady()
	if p.addrs["proxy"] == "" || p.addrs["admin"] == "" {
		t.Fatalf("no listening addresses in the log:\n%s", p.log())
	}
	return p
}

// fetch sends a request and returns the status and body of the answer.
func fetch(t *testing.T, method, url string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(body)
}

func TestProxyE2E(t *testing.T) {
	beside(t)
	var hits atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.WriteString(w, "upstream "+r.URL.Path)
	}))
	defer up.Close()
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	write := func(src string) {
		t.Helper()
		// Write and rename, as editors and ConfigMaps replace files.
		tmp := filepath.Join(dir, ".rules.tmp")
		if err := os.WriteFile(tmp, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	write(strings.Replace(proxyRules, "LOGIN", "2", 1))
	p := startProxy(t, "--config", file, "--upstream", up.URL)
	front, admin := "http://"+p.addrs["proxy"], "http://"+p.addrs["admin"]

	for i, want := range []int{200, 200, 429} {
		code, h, body := fetch(t, "POST", front+"/login")
		if code != want {
			t.Fatalf("login %d: %d %q", i, code, body)
		}
		if code == 429 && (h.Get("Content-Type") != "application/problem+json" || h.Get("Retry-After") == "") {
			t.Errorf("denial: %v %q", h, body)
		}
	}
	if code, _, body := fetch(t, "GET", front+"/docs"); code != 200 || body != "upstream /docs" {
		t.Errorf("GET /docs: %d %q", code, body)
	}
	if n := hits.Load(); n != 3 {
		t.Errorf("upstream saw %d requests, want 3", n)
	}
	// The upstream's own /metrics and /healthz are not shadowed.
	if _, _, body := fetch(t, "GET", front+"/metrics"); body != "upstream /metrics" {
		t.Errorf("/metrics on the proxy listener: %q", body)
	}

	for _, path := range []string{"/healthz", "/readyz"} {
		if code, _, body := fetch(t, "GET", admin+path); code != 200 || body != "OK\n" {
			t.Errorf("%s: %d %q", path, code, body)
		}
	}
	// The proxy counts a request when its handler returns, which may be
	// after the client has its answer: wait for the counts to arrive.
	wantMetrics := []string{
		`sluice_proxy_requests_total{result="denied",route="login"} 1`,
		`sluice_proxy_requests_total{result="allowed",route="login"} 2`,
		`sluice_proxy_requests_total{result="allowed",route="/"} 2`,
		`sluice_proxy_request_duration_seconds_count{route="login"} 3`,
		`sluice_config_loads_total{result="success"} 1`,
		`sluice_store_evictions_total 0`, // the embedded store's own metrics, as serve has them
		`sluice_store_keys `,
		`go_goroutines`,
	}
	var metrics string
	poll(t, "the proxy's metrics", func() bool {
		_, _, metrics = fetch(t, "GET", admin+"/metrics")
		for _, want := range wantMetrics {
			if !strings.Contains(metrics, want) {
				return false
			}
		}
		return true
	})

	// A bad file keeps the configuration in force, with its problem at
	// its line; a good one replaces it.
	bad := strings.Replace(proxyRules, "    - pattern: /\n", "    - pattern: /\n      shaping: true\n", 1)
	write(strings.Replace(bad, "LOGIN", "5", 1))
	p.waitLog("configuration problem", `"line":9`, "shaping")
	p.waitLog("keeping the rules in force")
	if strings.Contains(p.log(), "rules reloaded") {
		t.Errorf("a rejected file logged as reloaded:\n%s", p.log())
	}
	if code, _, _ := fetch(t, "POST", front+"/login"); code != 429 {
		t.Errorf("after a bad reload, login: %d, want 429", code)
	}
	write(strings.Replace(proxyRules, "LOGIN", "5", 1))
	p.waitLog("configuration loaded")
	if code, h, _ := fetch(t, "POST", front+"/login"); code != 200 || h.Get("X-RateLimit-Limit") != "5" {
		t.Errorf("after a good reload, login: %d %v", code, h)
	}

	if code := p.stop(syscall.SIGTERM); code != 0 {
		t.Errorf("exit status %d after SIGTERM", code)
	}
	if !strings.Contains(p.log(), "stopped") {
		t.Errorf("no clean stop in the log")
	}
}

// A bad file at start: exit 1, every problem with its line.
func TestProxyE2EBadConfig(t *testing.T) {
	beside(t)
	file := filepath.Join(t.TempDir(), "rules.yaml")
	src := "domain: api\nhttp:\n  routes:\n    - pattern: get /x\n  shadow: true\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	p := launchCommand(t, "proxy", []string{"listen", "admin-listen"}, nil, "--config", file, "--upstream", "http://127.0.0.1:1")
	if code := p.wait(); code != 1 {
		t.Errorf("exit status %d, want 1", code)
	}
	for _, want := range []string{`"line":4`, `"line":5`, `"line":8`, "fortnight", "upper case"} {
		if !strings.Contains(p.log(), want) {
			t.Errorf("log lacks %s", want)
		}
	}
}

func TestProxySettings(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string // "" for success
	}{
		{[]string{"--config", "r.yaml", "--upstream", "http://api:8080"}, nil, ""},
		{nil, map[string]string{"SLUICE_CONFIG": "r.yaml", "SLUICE_UPSTREAM": "https://api"}, ""},
		{[]string{"--config", "r.yaml"}, nil, "usage"},
		{[]string{"--config", "r.yaml", "--upstream", "api:8080"}, nil, "want http:// or https:// and a host"},
		{[]string{"--config", "r.yaml", "--upstream", "ftp://api"}, nil, "want http:// or https://"},
		{[]string{"--config", "r.yaml", "--upstream", "http://u:p@api"}, nil, "credentials in the URL"},
		{[]string{"--config", "r.yaml", "--upstream", "http://api", "--store", "redis"}, nil, "--store redis needs --redis-url"},
		{[]string{"--config", "r.yaml", "--upstream", "http://api", "--listen", "nope"}, nil, "--listen"},
		{[]string{"--config", t.TempDir(), "--upstream", "http://api"}, nil, "is a directory"},
		{[]string{"--config", "r.yaml", "--upstream", "http://api", "--store", "remote"}, nil, "--store remote needs --rls-addr"},
		{[]string{"--config", "r.yaml", "--upstream", "http://api", "--store", "remote", "--rls-addr", "rls:8081", "--rls-timeout", "0s"}, nil, "--rls-timeout must be positive"},
		{[]string{"--config", "r.yaml", "--upstream", "http://api", "--rls-addr", "rls:8081"}, nil, "apply to --store remote only"},
		{[]string{"--config", "r.yaml", "--upstream", "http://api", "--store", "remote", "--rls-addr", "rls:8081", "--max-bytes", "1GB"}, nil, "--max-bytes applies to --store memory only"},
		{[]string{"--config", "r.yaml", "--upstream", "http://api", "--store", "dynamo"}, nil, "supported: memory, redis, remote"},
		{[]string{"--config", "r.yaml", "--upstream", "http://api", "--store", "remote", "--rls-addr", "rls:8081", "--admin-token-file", "t"}, nil, "--admin-token-file serves explain, which reads the store the proxy decides on"},
		{[]string{"--config", "r.yaml", "--upstream", "http://api", "--admin-token-file", "t"}, nil, ""},
	} {
		s, err := parseProxy(tc.args, envMap(tc.env), &bytes.Buffer{})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v %v: %v", tc.args, tc.env, err)
		case tc.want == "" && (s.listen != ":8090" || s.adminListen != ":9090" || s.store != "memory"):
			t.Errorf("%v: defaults %+v", tc.args, s)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v %v: error %v, want %q", tc.args, tc.env, err, tc.want)
		}
	}
}

// Two proxies deciding on one sluice serve (--store remote) share its
// limits; when it dies, each answers by its failure policy with the rules
// of its own file: fail_closed denies, local limits in memory with the
// limit divided by --local-nodes.
func TestProxyE2ERemote(t *testing.T) {
	beside(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "upstream")
	}))
	defer up.Close()
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, file, strings.Replace(proxyRules, "LOGIN", "4", 1))
	serve := startSluice(t, nil, "--config", file)
	a := startProxy(t, "--config", file, "--upstream", up.URL, "--store", "remote", "--rls-addr", serve.grpcAddr, "--failure-policy", "fail_closed")
	b := startProxy(t, "--config", file, "--upstream", up.URL, "--store", "remote", "--rls-addr", serve.grpcAddr, "--failure-policy", "local", "--local-nodes", "2")
	login := func(p *proc) (int, http.Header) {
		code, h, _ := fetch(t, "POST", "http://"+p.addrs["proxy"]+"/login")
		return code, h
	}
	var got []int
	for _, p := range []*proc{a, b, a, b, a, b} {
		code, _ := login(p)
		got = append(got, code)
	}
	if want := []int{200, 200, 200, 200, 429, 429}; !slices.Equal(got, want) {
		t.Errorf("logins through two proxies on one serve: %v, want %v (one shared limit of 4)", got, want)
	}
	if code, _, body := fetch(t, "GET", "http://"+a.addrs["admin"]+"/metrics"); code != 200 || !strings.Contains(body, `sluice_remote_calls_total{result="ok"} 3`) {
		t.Errorf("proxy metrics lack 3 ok remote calls: %d\n%s", code, grepLines(body, "sluice_remote"))
	}

	serve.cmd.Process.Kill()
	serve.wait()
	if code, h := login(a); code != 429 || h.Get("Retry-After") == "" {
		t.Errorf("fail_closed with the remote gone: %d %v, want 429 with Retry-After", code, h)
	}
	got = got[:0]
	for range 3 {
		code, _ := login(b)
		got = append(got, code)
	}
	if want := []int{200, 200, 429}; !slices.Equal(got, want) {
		t.Errorf("local with the remote gone: %v, want %v (4 / --local-nodes 2)", got, want)
	}
	poll(t, "readiness of the fail_closed proxy to fail", func() bool {
		code, _, _ := fetch(t, "GET", "http://"+a.addrs["admin"]+"/readyz")
		return code == http.StatusServiceUnavailable
	})
	if code, _, _ := fetch(t, "GET", "http://"+b.addrs["admin"]+"/readyz"); code != 200 {
		t.Errorf("the local proxy's readiness: %d, want 200 (it still limits)", code)
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestServeAndProxyDefaultsApart: sluice serve and sluice proxy run side
// by side on one machine with their defaults: no port of one is a port of
// the other.
func TestServeAndProxyDefaultsApart(t *testing.T) {
	sv, err := parseServe([]string{"--config", "r.yaml"}, envMap(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	px, err := parseProxy([]string{"--config", "r.yaml", "--upstream", "http://api"}, envMap(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	ports := map[string]string{}
	for _, a := range []struct{ who, addr string }{
		{"serve --grpc-addr", sv.grpcAddr}, {"serve --http-addr", sv.httpAddr}, {"serve --debug-addr", sv.debugAddr},
		{"proxy --listen", px.listen}, {"proxy --admin-listen", px.adminListen},
	} {
		_, port, err := net.SplitHostPort(a.addr)
		if err != nil {
			t.Fatalf("%s %q: %v", a.who, a.addr, err)
		}
		if other, ok := ports[port]; ok {
			t.Errorf("%s and %s both default to port %s", other, a.who, port)
		}
		ports[port] = a.who
	}
}

// TestProxyExample runs the README's proxy example, examples/proxy.yaml,
// as it is: every client is limited by its address out of the box.
func TestProxyExample(t *testing.T) {
	beside(t)
	var hits atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
	}))
	defer up.Close()
	p := startProxy(t, "--config", filepath.Join("..", "..", "examples", "proxy.yaml"), "--upstream", up.URL)
	front := "http://" + p.addrs["proxy"]
	for i, want := range []int{200, 200, 200, 200, 200, 429} {
		code, h, body := fetch(t, "GET", front+"/items")
		if code != want {
			t.Fatalf("request %d: %d %q, want %d", i+1, code, body, want)
		}
		if code == 429 && (h.Get("Retry-After") == "" || h.Get("RateLimit-Policy") == "") {
			t.Errorf("denial without its headers: %v", h)
		}
	}
	for i, want := range []int{200, 200, 200, 429} {
		if code, _, body := fetch(t, "POST", front+"/login"); code != want {
			t.Fatalf("login %d: %d %q, want %d", i+1, code, body, want)
		}
	}
	if n := hits.Load(); n != 8 {
		t.Errorf("upstream saw %d requests, want 8", n)
	}
}

// TestProxyExampleResetIsRetry runs examples/proxy.yaml as it is, 5
// requests a minute per address in a sliding window, and reads the rate
// limit headers of the sixth: the RateLimit field's t, X-RateLimit-Reset
// and Retry-After all say when it will be admitted (12 s into the next
// minute, when the 5 weigh 5 × 48/60 = 4), they count down to it, and a
// client that waits t is admitted.
func TestProxyExampleResetIsRetry(t *testing.T) {
	besideFromTheStart(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	p := startProxy(t, "--config", filepath.Join("..", "..", "examples", "proxy.yaml"), "--upstream", up.URL)
	front := "http://" + p.addrs["proxy"]

	// The 5 and the sixth in one minute (a fresh proxy: the minute before
	// is empty).
	if left := time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)); left < 5*time.Second {
		time.Sleep(left + 50*time.Millisecond)
	}
	minute := time.Now().Truncate(time.Minute)
	for i := range 5 {
		if code, _, body := fetch(t, "GET", front+"/items"); code != 200 {
			t.Fatalf("request %d: %d %q", i+1, code, body)
		}
	}
	fits := minute.Add(time.Minute + 12*time.Second)
	// denied fetches a request that must be denied, checks that its three
	// fields agree and say when fits comes, and returns t and the time the
	// answer came.
	denied := func(what string) (int64, time.Time) {
		t.Helper()
		before := time.Now()
		code, h, body := fetch(t, "GET", front+"/items")
		after := time.Now()
		if code != 429 {
			t.Fatalf("%s: %d %q, want 429", what, code, body)
		}
		reset, retry := resetOf(t, h.Get("RateLimit")), h.Get("Retry-After")
		if strconv.FormatInt(reset, 10) != retry || h.Get("X-RateLimit-Reset") != retry {
			t.Errorf("%s: RateLimit %q, X-RateLimit-Reset %q, Retry-After %q: t is not Retry-After", what, h.Get("RateLimit"), h.Get("X-RateLimit-Reset"), retry)
		}
		if lo, hi := ceilSeconds(fits.Sub(after)), ceilSeconds(fits.Sub(before)); reset < lo || reset > hi {
			t.Errorf("%s: t=%d, want %d to %d (until %s)", what, reset, lo, hi, fits.Format(time.TimeOnly))
		}
		return reset, after
	}
	denied("the sixth")
	if now := time.Now().Truncate(time.Minute); !now.Equal(minute) {
		t.Fatalf("the requests began in the minute of %s and ended in that of %s", minute.Format(time.TimeOnly), now.Format(time.TimeOnly))
	}
	time.Sleep(time.Until(minute.Add(time.Minute + time.Second)))
	wait, at := denied("a second into the next minute")
	time.Sleep(time.Until(at.Add(time.Duration(wait) * time.Second)))
	if code, h, body := fetch(t, "GET", front+"/items"); code != 200 {
		t.Errorf("after waiting t=%d: %d %q %v", wait, code, body, h)
	}
}

// resetOf returns the t of a RateLimit field of one item.
func resetOf(t *testing.T, field string) int64 {
	t.Helper()
	for _, param := range strings.Split(field, ";")[1:] {
		if v, ok := strings.CutPrefix(param, "t="); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				break
			}
			return n
		}
	}
	t.Fatalf("RateLimit %q has no t", field)
	return 0
}

// ceilSeconds is d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}
