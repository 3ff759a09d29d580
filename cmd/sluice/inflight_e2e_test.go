package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

// adminToken is the bearer token of the in-flight tests' admin APIs.
const adminToken = "ops:0123456789abcdef0123456789abcdef\n"

// heldPermits is what sluice explain says of the concurrency limit of its
// first descriptor: the permits held and its summary.
type heldPermits struct {
	held    int64
	summary string
}

// explainHeld runs sluice explain against p's admin API for entry in
// domain and returns what it says of the descriptor's concurrency limit.
func explainHeld(t *testing.T, p *proc, tokens, domain, entry string) heldPermits {
	t.Helper()
	code, out, errOut := adminCLI(t, p, tokens, "explain", "--domain", domain, entry)
	if code != 0 {
		t.Fatalf("sluice explain: exit %d: %s%s", code, out, errOut)
	}
	var e struct {
		Descriptors []struct {
			Limits []struct {
				Algorithm string
				State     *struct {
					Held    *int64
					Summary string
				}
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &e); err != nil || len(e.Descriptors) != 1 {
		t.Fatalf("sluice explain: %v\n%s", err, out)
	}
	for _, l := range e.Descriptors[0].Limits {
		if l.Algorithm == "concurrency" {
			if l.State == nil || l.State.Held == nil {
				t.Fatalf("sluice explain: no permits held in the concurrency limit's state:\n%s", out)
			}
			return heldPermits{*l.State.Held, l.State.Summary}
		}
	}
	t.Fatalf("sluice explain: no concurrency limit:\n%s", out)
	return heldPermits{}
}

// dashboardInFlight is, from p's /dashboard/data (on its listener
// listener), the permits key holds as rule's in-flight list says, and
// whether the list has it.
func dashboardInFlight(t *testing.T, p *proc, listener, rule, key string) (int64, bool) {
	t.Helper()
	code, _, body := fetch(t, "GET", "http://"+p.addr(listener)+"/dashboard/data")
	var d struct {
		Rules []struct {
			Rule     string
			InFlight []struct {
				Key         string
				InFlight    *int64 `json:"in_flight"`
				InFlightMax int64  `json:"in_flight_max"`
			} `json:"in_flight"`
		}
	}
	if code != 200 || json.Unmarshal([]byte(body), &d) != nil {
		t.Fatalf("/dashboard/data: %d %s", code, body)
	}
	for _, r := range d.Rules {
		for _, it := range r.InFlight {
			if r.Rule == rule && it.Key == key && it.InFlight != nil {
				return *it.InFlight, true
			}
		}
	}
	return 0, false
}

// heldUpstream answers each request only once released: requests held in
// flight for as long as a test wants. Make one with newHeldUpstream.
type heldUpstream struct {
	arrived atomic.Int64
	release chan struct{}
	once    sync.Once
	clients sync.WaitGroup
}

func newHeldUpstream() *heldUpstream { return &heldUpstream{release: make(chan struct{})} }

func (u *heldUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.arrived.Add(1)
	select {
	case <-u.release:
	case <-r.Context().Done():
	}
	io.WriteString(w, "done")
}

// hold sends n requests of apiKey (X-Api-Key) to url in the background,
// each of which must be answered 200 once released, and waits until the
// upstream has them all (counting those held before).
func (u *heldUpstream) hold(t *testing.T, n int, url, apiKey string) {
	t.Helper()
	want := u.arrived.Load() + int64(n)
	for range n {
		u.clients.Go(func() {
			if code, body := getWithKey(t, url, apiKey); code != 200 || body != "done" {
				t.Errorf("a held request: %d %q", code, body)
			}
		})
	}
	poll(t, fmt.Sprintf("%d requests held at the upstream", want), func() bool { return u.arrived.Load() == want })
}

// end answers every request held, and waits until their clients have the
// answers.
func (u *heldUpstream) end() {
	u.once.Do(func() { close(u.release) })
	u.clients.Wait()
}

// getWithKey sends GET url with X-Api-Key apiKey and returns the answer's
// status and body (0 when it failed, reported).
func getWithKey(t *testing.T, url, apiKey string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("X-Api-Key", apiKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0, ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestProxyE2EPermitsInFlight: two proxies share a concurrency rule's permits in
// Redis; k slow requests held through the first show, on the second (its
// dashboard, whose top keys are the cluster's, and sluice explain against
// its admin API), k permits held of the key, read from Redis, and on the
// first too; once the requests end, 0. The admin API answers explain only
// with a token, and keeps no overrides.
func TestProxyE2EPermitsInFlight(t *testing.T) {
	beside(t)
	const k = 3
	srv := redistest.Standalone(t)
	up := newHeldUpstream()
	upstream := httptest.NewServer(up)
	defer upstream.Close()
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, file, `domain: llm
http:
  routes:
    - pattern: /
      descriptors: [[{key: api_key, header: X-Api-Key}]]
descriptors:
  - key: api_key
    concurrency: {max: 4, ttl: 30s}
    rate_limit: {unit: hour, requests_per_unit: 1000}
`)
	tokens := writeFile(t, "tokens", adminToken)
	args := []string{"--config", file, "--upstream", upstream.URL, "--store", "redis", "--redis-url", srv.URL(), "--redis-prefix", t.Name() + ":", "--admin-token-file", tokens}
	a, b := startProxy(t, args...), startProxy(t, args...)
	defer up.end()
	up.hold(t, k, "http://"+a.addr("proxy")+"/v1/chat", "acme")

	for _, c := range []struct {
		name string
		p    *proc
	}{{"the other proxy", b}, {"the proxy holding them", a}} {
		poll(t, fmt.Sprintf("%s's dashboard shows %d in flight for api_key=acme", c.name, k), func() bool {
			n, ok := dashboardInFlight(t, c.p, "admin", "llm.api_key", "api_key=acme")
			return ok && n == k
		})
		if got := explainHeld(t, c.p, tokens, "llm", "api_key=acme"); got.held != k || got.summary != fmt.Sprintf("%d of 4 permits held", k) {
			t.Errorf("%s: explain says %+v, want %d held", c.name, got, k)
		}
	}
	if got := explainHeld(t, b, tokens, "llm", "api_key=other"); got.held != 0 || got.summary != "0 of 4 permits held" {
		t.Errorf("explain of a key with nothing in flight: %+v", got)
	}

	// The admin API: a token is required, and overrides are not kept.
	if code, body := adminDo(t, b, "POST", "/v1/explain", "", `{"domain":"llm","descriptors":[[{"key":"api_key","value":"acme"}]]}`); code != 401 {
		t.Errorf("explain without a token: %d %s", code, body)
	}
	if code, body := adminDo(t, b, "GET", "/v1/overrides", "Bearer "+strings.TrimPrefix(strings.TrimSpace(adminToken), "ops:"), ""); code != 404 || !strings.Contains(body, "no runtime overrides") {
		t.Errorf("overrides on the proxy: %d %s", code, body)
	}

	up.end()
	for _, p := range []*proc{a, b} {
		poll(t, "the dashboard shows 0 in flight once the requests ended", func() bool {
			n, ok := dashboardInFlight(t, p, "admin", "llm.api_key", "api_key=acme")
			return ok && n == 0
		})
		if got := explainHeld(t, p, tokens, "llm", "api_key=acme"); got.held != 0 {
			t.Errorf("explain after the requests ended: %+v, want 0 held", got)
		}
	}
}

// TestServeE2EPermitsInFlight: sluice serve on Redis, with k permits of a key
// held by requests Envoy has not released yet: /hitters lists the key
// with its k acquisitions and k in flight of 4 (a key that gave its
// permit back with 0, a rate's key with none), and sluice explain against
// the admin API says k of 4 are held; once Envoy releases them, 0, and
// the releases are no hits.
func TestServeE2EPermitsInFlight(t *testing.T) {
	beside(t)
	const k = 3
	srv := redistest.Standalone(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, `domain: edge
descriptors:
  - key: api_key
    concurrency: {max: 4, ttl: 30s}
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000}
`)
	tokens := writeFile(t, "tokens", adminToken)
	p := startSluice(t, nil, "--config", rules, "--stream-done-release", "--store", "redis", "--redis-url", srv.URL(), "--redis-prefix", t.Name()+":",
		"--admin-addr", "127.0.0.1:0", "--admin-token-file", tokens)
	acquire := func(key string) string {
		t.Helper()
		r := p.must("edge", desc("api_key", key))
		if codesOf(r) != "OK:OK" || tokenOf(r) == "" {
			t.Fatalf("api_key=%s: %s, token %q; want OK with a token", key, codesOf(r), tokenOf(r))
		}
		return tokenOf(r)
	}
	release := func(key, token string) {
		t.Helper()
		if r := p.must("edge", desc("api_key", key, "sluice_permit", token)); codesOf(r) != "OK:OK" {
			t.Fatalf("release of api_key=%s: %s", key, codesOf(r))
		}
	}
	var held []string
	for range k {
		held = append(held, acquire("k1"))
	}
	release("k2", acquire("k2"))
	p.must("edge", desc("user", "bob"))

	// top is the requests' top keys of rule as /hitters lists them.
	type item struct {
		Key         string
		Count       uint64
		InFlight    *int64 `json:"in_flight"`
		InFlightMax int64  `json:"in_flight_max"`
	}
	top := func(rule string) map[string]item {
		t.Helper()
		code, _, body := fetch(t, "GET", "http://"+p.dbg+"/hitters?kind=requests&rule="+rule)
		var rs []struct{ Top []item }
		if code != 200 || json.Unmarshal([]byte(body), &rs) != nil || len(rs) != 1 {
			t.Fatalf("/hitters: %d %s", code, body)
		}
		out := map[string]item{}
		for _, it := range rs[0].Top {
			out[it.Key] = it
		}
		return out
	}
	inFlight := func(it item) string {
		if it.InFlight == nil {
			return fmt.Sprintf("%d asked, none in flight", it.Count)
		}
		return fmt.Sprintf("%d asked, %d of %d in flight", it.Count, *it.InFlight, it.InFlightMax)
	}
	keys := top("edge.api_key")
	if got, want := inFlight(keys["api_key=k1"]), fmt.Sprintf("%d asked, %d of 4 in flight", k, k); got != want {
		t.Errorf("/hitters: api_key=k1 %s, want %s", got, want)
	}
	if got := inFlight(keys["api_key=k2"]); got != "1 asked, 0 of 4 in flight" {
		t.Errorf("/hitters: api_key=k2 %s, want 1 asked, 0 of 4 in flight", got)
	}
	if got := inFlight(top("edge.user")["user=bob"]); got != "1 asked, none in flight" {
		t.Errorf("/hitters: a rate's key user=bob %s", got)
	}
	if got := explainHeld(t, p, tokens, "edge", "api_key=k1"); got.held != k || got.summary != fmt.Sprintf("%d of 4 permits held", k) {
		t.Errorf("explain: %+v, want %d of 4 held", got, k)
	}

	for _, tok := range held {
		release("k1", tok)
	}
	if got, want := inFlight(top("edge.api_key")["api_key=k1"]), fmt.Sprintf("%d asked, 0 of 4 in flight", k); got != want {
		t.Errorf("/hitters after the releases: api_key=k1 %s, want %s", got, want)
	}
	if got := explainHeld(t, p, tokens, "edge", "api_key=k1"); got.held != 0 || got.summary != "0 of 4 permits held" {
		t.Errorf("explain after the releases: %+v, want 0 of 4 held", got)
	}
}
