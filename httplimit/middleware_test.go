package httplimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/decision/ratelimitheaders"
	"github.com/sluicehq/sluice/internal/testsupport/logtest"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

// fixedNow is 20.25 s into a minute: a fixed window of a minute ends 39.75 s
// later, which headers round up to 40.
var fixedNow = time.Unix(1_700_000_000, 250_000_000)

// decider returns a Decider over a memstore whose clock stands at fixedNow.
func decider(t testing.TB, yaml string) *decide.Decider {
	t.Helper()
	store := memstore.New(memstore.Config{Now: func() time.Time { return fixedNow }})
	t.Cleanup(func() { store.Close() })
	return mustDecider(sluice.NewLimiter(store), rulestest.Config(t, yaml))
}

// okHandler answers 200 "ok".
var okHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	io.WriteString(w, "ok")
})

// limited starts a server of okHandler behind the middleware of cfg.
func limited(t testing.TB, cfg httplimit.Config) *httptest.Server {
	t.Helper()
	mw, err := httplimit.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return server(t, mw(okHandler))
}

// server starts a server of h on a loopback listener.
func server(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.MaxHeaderBytes = 4 << 20 // room for a 1 MB header
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// reply is a response with its body read.
type reply struct {
	status int
	header http.Header
	body   string
}

func (r reply) String() string {
	return strconv.Itoa(r.status) + " " + r.header.Get("X-RateLimit-Remaining")
}

func do(t testing.TB, client *http.Client, method, url string, header http.Header) reply {
	t.Helper()
	return readReply(t, send(t, client, method, url, header))
}

// rawDo is rawRequest's response as a reply.
func rawDo(t testing.TB, addr, path string, lines ...string) reply {
	t.Helper()
	return readReply(t, rawRequest(t, addr, path, lines))
}

func readReply(t testing.TB, resp *http.Response) reply {
	t.Helper()
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, string(body)}
}

const ipRules = `
domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
`

// With no Descriptors, the client address is Envoy's remote_address, and
// a client from an untrusted peer cannot change it with X-Forwarded-For.
func TestRemoteAddressByDefault(t *testing.T) {
	srv := limited(t, httplimit.Config{Decider: decider(t, ipRules), Domain: "api"})
	var got []string
	for _, spoof := range []string{"192.0.2.1", "192.0.2.2", "198.51.100.7", "junk"} {
		r := do(t, srv.Client(), "GET", srv.URL, http.Header{"X-Forwarded-For": {spoof}})
		got = append(got, r.String())
	}
	if want := "[200 2 200 1 200 0 429 0]"; strings.Join(got, " ") != strings.Trim(want, "[]") {
		t.Errorf("got %v, want %s", got, want)
	}
}

// Through a real httputil.ReverseProxy that the middleware trusts, each
// original client has its own limit; the proxy's address is nobody's.
func TestRemoteAddressThroughTrustedProxy(t *testing.T) {
	alice := clientFrom(t, "127.0.0.2")
	bob := clientFrom(t, "127.0.0.4")
	proxyOut := clientFrom(t, "127.0.0.3").Transport

	upstream := limited(t, httplimit.Config{
		Decider:  decider(t, ipRules),
		Domain:   "api",
		ClientIP: httplimit.ClientIP{TrustedProxies: mustProxies(t, "127.0.0.3")},
	})
	proxy := appendingProxy(t, upstream.URL, proxyOut)

	spoof := http.Header{"X-Forwarded-For": {"127.0.0.4"}} // alice poses as bob
	var got []string
	for range 4 {
		got = append(got, do(t, alice, "GET", proxy.URL, spoof).String())
	}
	got = append(got, do(t, bob, "GET", proxy.URL, nil).String())
	if want := "200 2,200 1,200 0,429 0,200 2"; strings.Join(got, ",") != want {
		t.Errorf("alice ×4, bob: got %v, want %s", got, want)
	}
}

// Every header value at the boundaries of a limit of 3 a minute, with the
// clock 20.25 s into the minute: the window ends in 39.75 s, rounded up.
func TestHeadersAtBoundaries(t *testing.T) {
	const (
		policy = `"api.remote_address";q=3;w=60`
		reset  = "40"
	)
	want := []map[string]string{
		{"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "2", "X-RateLimit-Reset": reset,
			"RateLimit-Policy": policy, "RateLimit": `"api.remote_address";r=2;t=40`},
		{"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": reset,
			"RateLimit-Policy": policy, "RateLimit": `"api.remote_address";r=1;t=40`},
		{"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": reset,
			"RateLimit-Policy": policy, "RateLimit": `"api.remote_address";r=0;t=40`},
		{"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": reset,
			"RateLimit-Policy": policy, "RateLimit": `"api.remote_address";r=0;t=40`, "Retry-After": reset},
	}
	families := map[ratelimitheaders.HeaderMode][]string{
		ratelimitheaders.HeadersIETF:       {"RateLimit-Policy", "RateLimit"},
		ratelimitheaders.HeadersXRateLimit: {"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"},
		ratelimitheaders.HeadersRetryAfter: {"Retry-After"},
	}
	for _, mode := range []ratelimitheaders.HeaderMode{
		0, ratelimitheaders.HeadersAll, ratelimitheaders.HeadersNone,
		ratelimitheaders.HeadersIETF, ratelimitheaders.HeadersXRateLimit, ratelimitheaders.HeadersRetryAfter,
		ratelimitheaders.HeadersAll &^ ratelimitheaders.HeadersIETF,
	} {
		on := mode
		switch mode {
		case 0:
			on = ratelimitheaders.HeadersAll
		case ratelimitheaders.HeadersNone:
			on = 0
		}
		t.Run(strconv.Itoa(int(mode)), func(t *testing.T) {
			srv := limited(t, httplimit.Config{Decider: decider(t, ipRules), Domain: "api", Headers: mode})
			for i, w := range want {
				r := do(t, srv.Client(), "GET", srv.URL, nil)
				if wantStatus := []int{200, 200, 200, 429}[i]; r.status != wantStatus {
					t.Fatalf("request %d: status %d, want %d", i+1, r.status, wantStatus)
				}
				for fam, names := range families {
					for _, name := range names {
						wv, ok := w[name]
						if on&fam == 0 {
							wv, ok = "", false
						}
						if gv := r.header.Values(name); len(gv) > 1 || r.header.Get(name) != wv || (len(gv) == 1) != ok {
							t.Errorf("request %d: %s: %q, want %q", i+1, name, gv, wv)
						}
					}
				}
			}
		})
	}
}

// problemBody is the documented denial body.
type problemBody struct {
	Type       string `json:"type"`
	Title      string `json:"title"`
	Status     int    `json:"status"`
	Detail     string `json:"detail"`
	RetryAfter *int64 `json:"retry-after"`
	Violated   []struct {
		Name   string `json:"name"`
		Quota  int64  `json:"quota"`
		Window int64  `json:"window"`
	} `json:"violated-policies"`
}

func decodeProblem(t *testing.T, r reply) problemBody {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q", ct)
	}
	var p problemBody
	dec := json.NewDecoder(strings.NewReader(r.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("body %q: %v", r.body, err)
	}
	if p.Status != r.status {
		t.Errorf("body status %d, response %d", p.Status, r.status)
	}
	return p
}

const twoLimitRules = `
domain: api
descriptors:
  - key: remote_address
    rate_limits:
      - {unit: minute, requests_per_unit: 1}
      - {unit: hour, requests_per_unit: 100}
  - key: generic_key
    value: all
    rate_limit: {unit: day, requests_per_unit: 1000}
`

func TestDenialBody(t *testing.T) {
	for _, status := range []int{0, http.StatusServiceUnavailable} {
		srv := limited(t, httplimit.Config{
			Decider:     decider(t, twoLimitRules),
			Domain:      "api",
			DenyStatus:  status,
			Descriptors: []httplimit.Descriptor{{{Source: httplimit.RemoteAddress()}}, {{Source: httplimit.Const("all")}}},
		})
		if r := do(t, srv.Client(), "GET", srv.URL, nil); r.status != 200 {
			t.Fatalf("first request: %d", r.status)
		}
		r := do(t, srv.Client(), "GET", srv.URL, nil)
		want := max(status, 429)
		if r.status != want {
			t.Fatalf("status %d, want %d", r.status, want)
		}
		p := decodeProblem(t, r)
		if p.Type != httplimit.ProblemRateLimited || p.Title == "" || !strings.Contains(p.Detail, "40 seconds") {
			t.Errorf("problem %+v", p)
		}
		if p.RetryAfter == nil || *p.RetryAfter != 40 || r.header.Get("Retry-After") != "40" {
			t.Errorf("retry-after %v, header %q, want 40", p.RetryAfter, r.header.Get("Retry-After"))
		}
		if len(p.Violated) != 1 || p.Violated[0].Name != "api.remote_address#0" || p.Violated[0].Quota != 1 || p.Violated[0].Window != 60 {
			t.Errorf("violated-policies %+v", p.Violated)
		}
		if got, want := r.header.Get("RateLimit-Policy"), `"api.remote_address#0";q=1;w=60, "api.remote_address#1";q=100;w=3600, "api.generic_key_all";q=1000;w=86400`; got != want {
			t.Errorf("RateLimit-Policy %q, want %q", got, want)
		}
	}
}

func TestOnDeny(t *testing.T) {
	srv := limited(t, httplimit.Config{
		Decider: decider(t, ipRules),
		Domain:  "api",
		OnDeny: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusTeapot)
			io.WriteString(w, "slow down, retry in "+w.Header().Get("Retry-After"))
		}),
	})
	var r reply
	for range 4 {
		r = do(t, srv.Client(), "GET", srv.URL, nil)
	}
	if r.status != http.StatusTeapot || r.body != "slow down, retry in 40" || r.header.Get("X-RateLimit-Remaining") != "0" {
		t.Errorf("got %d %q %v", r.status, r.body, r.header)
	}
}

// failingStore fails every decision with an error that must not reach
// clients.
type failingStore struct{}

const secret = "redis: auth failed for 10.1.2.3:6379"

func (failingStore) Take(context.Context, []sluice.Hit, []sluice.Decision) error {
	return errors.New(secret)
}

func TestStoreFailure(t *testing.T) {
	newDecider := func(policy string) *decide.Decider {
		return mustDecider(sluice.NewLimiter(failingStore{}), rulestest.Config(t, ipRules+"failure_policy: "+policy+"\n"))
	}
	t.Run("fail_open", func(t *testing.T) {
		srv := limited(t, httplimit.Config{Decider: newDecider("fail_open"), Domain: "api"})
		r := do(t, srv.Client(), "GET", srv.URL, nil)
		if r.status != 200 || r.body != "ok" || r.header.Get("X-RateLimit-Limit") != "" || r.header.Get("RateLimit") != "" {
			t.Errorf("got %d %q %v, want 200 without rate limit headers", r.status, r.body, r.header)
		}
	})
	t.Run("fail_closed", func(t *testing.T) {
		srv := limited(t, httplimit.Config{Decider: newDecider("fail_closed"), Domain: "api"})
		r := do(t, srv.Client(), "GET", srv.URL, nil)
		if r.status != 429 || r.header.Get("Retry-After") != "1" || strings.Contains(r.body, "redis") {
			t.Errorf("got %d %q %v, want 429, Retry-After 1", r.status, r.body, r.header)
		}
	})
	t.Run("no policy answers: default OnError", func(t *testing.T) {
		// local without a Local limiter answers with the store's error.
		srv := limited(t, httplimit.Config{Decider: newDecider("local"), Domain: "api"})
		r := do(t, srv.Client(), "GET", srv.URL, nil)
		if r.status != 503 {
			t.Fatalf("status %d, want 503", r.status)
		}
		p := decodeProblem(t, r)
		if p.Type != httplimit.ProblemUnavailable || strings.Contains(r.body, "redis") || strings.Contains(r.body, "10.1.2.3") {
			t.Errorf("body %q leaks or lacks the type", r.body)
		}
	})
	t.Run("no rules: OnError", func(t *testing.T) {
		var got error
		mw, err := httplimit.New(httplimit.Config{
			Decider: mustDecider(sluice.NewLimiter(failingStore{}), nil),
			Domain:  "api",
			OnError: func(w http.ResponseWriter, r *http.Request, err error) {
				got = err
				w.WriteHeader(http.StatusBadGateway)
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(mw(okHandler))
		defer srv.Close()
		if r := do(t, srv.Client(), "GET", srv.URL, nil); r.status != http.StatusBadGateway || !errors.Is(got, decide.ErrNoRules) {
			t.Errorf("got %d, OnError saw %v", r.status, got)
		}
	})
}

// A request whose peer is not an IP address (a hand-made request, a Unix
// socket) cannot be keyed by address: OnError, without details.
func TestPeerNotAnAddress(t *testing.T) {
	mw, err := httplimit.New(httplimit.Config{Decider: decider(t, ipRules), Domain: "api"})
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "@"
	mw(okHandler).ServeHTTP(w, r)
	if w.Code != 503 || strings.Contains(w.Body.String(), "@") {
		t.Errorf("got %d %q", w.Code, w.Body)
	}
}

func TestShadowMode(t *testing.T) {
	t.Run("global", func(t *testing.T) {
		var logs logtest.Buffer
		srv := limited(t, httplimit.Config{Decider: decider(t, ipRules), Domain: "api", ShadowMode: true, Logger: logs.Logger()})
		var got []string
		for i := range 5 {
			r := do(t, srv.Client(), "GET", srv.URL, nil)
			got = append(got, r.String()+" "+r.header.Get("Retry-After"))
			if shadowed := strings.Contains(logs.String(), "exceeded in shadow mode"); shadowed != (i >= 3) {
				t.Errorf("request %d: logged a shadow denial: %v\n%s", i+1, shadowed, logs.String())
			}
		}
		if want := "200 2 ,200 1 ,200 0 ,200 0 ,200 0 "; strings.Join(got, ",") != want {
			t.Errorf("got %q, want %q", got, want)
		}
		// At most a line a second: the fifth request's is not logged.
		if n := strings.Count(logs.String(), "exceeded in shadow mode"); n != 1 || !strings.Contains(logs.String(), "limit=api.remote_address") {
			t.Errorf("%d shadow lines, want 1 naming the limit:\n%s", n, logs.String())
		}
	})
	t.Run("rule", func(t *testing.T) {
		const yaml = `
domain: api
descriptors:
  - key: remote_address
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`
		var logs logtest.Buffer
		srv := limited(t, httplimit.Config{Decider: decider(t, yaml), Domain: "api", Logger: logs.Logger()})
		for i := range 3 {
			r := do(t, srv.Client(), "GET", srv.URL, nil)
			if r.status != 200 || r.header.Get("X-RateLimit-Remaining") != "" || r.header.Get("Retry-After") != "" {
				t.Errorf("request %d: %d %v; shadow limits are not advertised", i+1, r.status, r.header)
			}
		}
		if !strings.Contains(logs.String(), "exceeded in shadow mode") {
			t.Errorf("no shadow line logged:\n%s", logs.String())
		}
	})
}

const endpointRules = `
domain: api
descriptors:
  - key: method
    value: POST
    descriptors:
      - key: path
        value: /login
        rate_limit: {unit: minute, requests_per_unit: 2}
      - key: path
        value: /v1/*
        rate_limit: {unit: minute, requests_per_unit: 100}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
`

func TestPerEndpoint(t *testing.T) {
	srv := limited(t, httplimit.Config{
		Decider:     decider(t, endpointRules),
		Domain:      "api",
		Descriptors: []httplimit.Descriptor{{{Source: httplimit.Method()}, {Source: httplimit.Path()}}},
	})
	var got []string
	for _, req := range []string{"POST /login", "POST /login?x=1", "POST /login", "GET /login", "POST /search", "POST /v1/items"} {
		method, path, _ := strings.Cut(req, " ")
		r := do(t, srv.Client(), method, srv.URL+path, nil)
		got = append(got, r.String())
	}
	if want := "200 1,200 0,429 0,200 ,200 ,200 99"; strings.Join(got, ",") != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// Per user and per IP, decided together: a request denied by the per-IP
// limit consumes nothing of the user's.
func TestPerUserAndPerIP(t *testing.T) {
	srv := limited(t, httplimit.Config{
		Decider:  decider(t, endpointRules),
		Domain:   "api",
		ClientIP: httplimit.ClientIP{TrustedProxies: mustProxies(t, "127.0.0.0/8")},
		Descriptors: []httplimit.Descriptor{
			{{Key: "user", Source: httplimit.Header("X-User")}},
			{{Source: httplimit.RemoteAddress()}},
		},
	})
	from := func(ip, user string) string {
		h := http.Header{"X-Forwarded-For": {ip}}
		if user != "" {
			h["X-User"] = []string{user}
		}
		r := do(t, srv.Client(), "GET", srv.URL, h)
		return r.String()
	}
	var got []string
	for range 5 { // user 5 → 4..0 but IP 3 → 2..0, then denied by IP
		got = append(got, from("192.0.2.1", "alice"))
	}
	// From another address: the user has 2 left (5 − 3 admitted), not 0.
	got = append(got, from("192.0.2.2", "alice"), from("192.0.2.2", "alice"), from("192.0.2.2", "alice"))
	// Without the header, only the per-IP limit applies.
	got = append(got, from("192.0.2.3", ""))
	if want := "200 2,200 1,200 0,429 0,429 0,200 1,200 0,429 0,200 2"; strings.Join(got, ",") != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
}

const keyRules = `
domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: country
    value: FR
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 10}
`

// Garbage, enormous or ambiguous values never panic, never reach a counter
// and never charge anyone: the request is answered 400 and the limits of
// the sender and of everyone else are as before.
func TestBadInput(t *testing.T) {
	srv := limited(t, httplimit.Config{
		Decider:  decider(t, keyRules),
		Domain:   "api",
		ClientIP: httplimit.ClientIP{TrustedProxies: mustProxies(t, "127.0.0.0/8")},
		Descriptors: []httplimit.Descriptor{
			{{Source: httplimit.APIKey("X-Api-Key")}},
			{{Source: httplimit.RemoteAddress()}},
			{{Source: httplimit.Path()}},
		},
	})
	addr := srv.Listener.Addr().String()
	mb := strings.Repeat("k", 1<<20)
	for _, tt := range []struct {
		name  string
		path  string
		lines []string
	}{
		{"1 MB key", "/", []string{"X-Api-Key: " + mb}},
		{"257-byte key", "/", []string{"X-Api-Key: " + mb[:257]}},
		{"control character", "/", []string{"X-Api-Key: victim\x01"}},
		{"tab", "/", []string{"X-Api-Key: vic\ttim"}},
		{"DEL", "/", []string{"X-Api-Key: victim\x7f"}},
		{"invalid UTF-8", "/", []string{"X-Api-Key: victim\xff\xfe"}},
		{"two lines", "/", []string{"X-Api-Key: victim", "X-Api-Key: mine"}},
		{"injected line", "/", []string{"X-Api-Key: mine\rX-Api-Key: victim"}},
		{"NUL in path", "/a%00b", nil},
		{"newline in path", "/a%0Ab", nil},
		{"long path", "/" + mb[:2000], nil},
		{"invalid UTF-8 path", "/%ff", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := rawDo(t, addr, tt.path, append(tt.lines, "X-Forwarded-For: 192.0.2.9")...)
			switch r.status {
			case 400:
				if r.header.Get("Content-Type") == "application/problem+json" {
					p := decodeProblem(t, r)
					if p.Type != httplimit.ProblemInvalidRequest || strings.Contains(r.body, "victim") || strings.Contains(r.body, "kkk") {
						t.Errorf("problem %q", r.body)
					}
				} // else net/http refused the request itself
			default:
				t.Errorf("status %d %q, want 400", r.status, r.body)
			}
		})
	}
	// Nothing was charged: not the sender's address, not the victim's key.
	r := do(t, srv.Client(), "GET", srv.URL, http.Header{"X-Forwarded-For": {"192.0.2.9"}, "X-Api-Key": {"victim"}})
	if r.status != 200 || r.header.Get("X-RateLimit-Remaining") != "9" {
		t.Errorf("after bad input: %s, want 200 9", r)
	}
}

// TestAPIKeySpellings: an API key in an authorization scheme is one key
// however the scheme is spelled (its case, the spaces after it), not a
// fresh quota for each spelling; another key is another.
func TestAPIKeySpellings(t *testing.T) {
	srv := limited(t, httplimit.Config{
		Decider:     decider(t, keyRules),
		Domain:      "api",
		Descriptors: []httplimit.Descriptor{{{Source: httplimit.APIKey("Authorization")}}},
	})
	var got []string
	for _, v := range []string{"Bearer sk-1", "bearer sk-1", "BEARER  sk-1", "bEaReR    sk-1", "Bearer sk-2", "ApiKey k", "APIKEY  k", "sk-3"} {
		r := rawDo(t, srv.Listener.Addr().String(), "/", "Authorization: "+v)
		got = append(got, r.String())
	}
	if want := "200 9,200 8,200 7,200 6,200 9,200 9,200 8,200 9"; strings.Join(got, ",") != want {
		t.Errorf("remaining %s, want %s", strings.Join(got, ","), want)
	}
}

// Country takes two letters, upper-cased; anything else skips the
// descriptor, as an absent header does.
func TestCountry(t *testing.T) {
	srv := limited(t, httplimit.Config{
		Decider:     decider(t, keyRules),
		Domain:      "api",
		Descriptors: []httplimit.Descriptor{{{Source: httplimit.Country("CF-IPCountry")}}},
	})
	var got []string
	for _, c := range []string{"fr", "FR", "T1", "", "FRA", "F\xff"} {
		r := rawDo(t, srv.Listener.Addr().String(), "/", "CF-IPCountry: "+c)
		got = append(got, r.String())
	}
	if want := "200 9,200 8,200 ,200 ,200 ,200 "; strings.Join(got, ",") != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestNewErrors(t *testing.T) {
	dec := decider(t, ipRules)
	for _, tt := range []struct {
		name string
		cfg  httplimit.Config
		want string
	}{
		{"no decider", httplimit.Config{Domain: "api"}, "Decider is required"},
		{"no domain", httplimit.Config{Decider: dec}, "Domain is required"},
		{"deny status", httplimit.Config{Decider: dec, Domain: "api", DenyStatus: 200}, "DenyStatus 200"},
		{"headers", httplimit.Config{Decider: dec, Domain: "api", Headers: ratelimitheaders.HeadersNone | ratelimitheaders.HeadersIETF}, "Headers"},
		{"client ip", httplimit.Config{Decider: dec, Domain: "api", ClientIP: httplimit.ClientIP{Headers: []string{"X-Client"}}}, "X-Client"},
		{"empty descriptor", httplimit.Config{Decider: dec, Domain: "api", Descriptors: []httplimit.Descriptor{{}}}, "descriptor 0 has no entries"},
		{"no source", httplimit.Config{Decider: dec, Domain: "api", Descriptors: []httplimit.Descriptor{{{Key: "k"}}}}, "has no Source"},
		{"header name", httplimit.Config{Decider: dec, Domain: "api", Descriptors: []httplimit.Descriptor{{{Source: httplimit.Header("X User")}}}}, "not a header name"},
		{"const", httplimit.Config{Decider: dec, Domain: "api", Descriptors: []httplimit.Descriptor{{{Source: httplimit.Const("")}}}}, "Const value"},
		{"too many", httplimit.Config{Decider: dec, Domain: "api", Descriptors: make([]httplimit.Descriptor, 17)}, "17 descriptors"},
	} {
		_, err := httplimit.New(tt.cfg)
		if err == nil || !errors.Is(err, httplimit.ErrConfig) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want ErrConfig with %q", tt.name, err, tt.want)
		}
	}
}

// An IPv6 client rotating addresses inside its /64 (here as the trusted
// proxy reports them) has one limit; the next /64 has its own.
func TestIPv6PrefixSharesLimit(t *testing.T) {
	srv := limited(t, httplimit.Config{
		Decider:  decider(t, ipRules),
		Domain:   "api",
		ClientIP: httplimit.ClientIP{TrustedProxies: mustProxies(t, "127.0.0.0/8")},
	})
	var got []string
	for _, ip := range []string{"2001:db8:1:2::1", "2001:db8:1:2:ffff::7", "2001:db8:1:2:1:2:3:4", "2001:db8:1:2::99", "2001:db8:1:3::1"} {
		got = append(got, do(t, srv.Client(), "GET", srv.URL, http.Header{"X-Forwarded-For": {ip}}).String())
	}
	if want := "200 2,200 1,200 0,429 0,200 2"; strings.Join(got, ",") != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// Concurrent requests of one client over real connections: exactly the
// limit is admitted.
func TestConcurrentExact(t *testing.T) {
	srv := limited(t, httplimit.Config{Decider: decider(t, ipRules), Domain: "api"})
	const n = 40
	statuses := make(chan int, n)
	for range n {
		go func() {
			resp, err := srv.Client().Get(srv.URL)
			if err != nil {
				statuses <- 0
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses <- resp.StatusCode
		}()
	}
	count := map[int]int{}
	for range n {
		count[<-statuses]++
	}
	if count[200] != 3 || count[429] != n-3 {
		t.Errorf("statuses %v, want 3 × 200 and %d × 429", count, n-3)
	}
}

// Many clients at once, each its own limit: every client sees exactly its
// own sequence of counts and headers, whatever the others do. (The
// middleware reuses its per-request storage: a value or header leaking
// from one request into another would show here.)
func TestConcurrentClientsExact(t *testing.T) {
	srv := limited(t, httplimit.Config{
		Decider:  decider(t, ipRules),
		Domain:   "api",
		ClientIP: httplimit.ClientIP{TrustedProxies: mustProxies(t, "127.0.0.0/8")},
	})
	const clients = 64
	errs := make(chan string, clients)
	for c := range clients {
		go func() {
			ip := fmt.Sprintf("198.51.%d.%d", c/200, c%200+1)
			var got []string
			for range 5 {
				resp := send(t, srv.Client(), "GET", srv.URL, http.Header{"X-Forwarded-For": {ip}})
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				got = append(got, fmt.Sprintf("%d %s %s %s", resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"),
					resp.Header.Get("RateLimit"), resp.Header.Get("Retry-After")))
			}
			want := `200 2 "api.remote_address";r=2;t=40 |200 1 "api.remote_address";r=1;t=40 |200 0 "api.remote_address";r=0;t=40 |` +
				`429 0 "api.remote_address";r=0;t=40 40|429 0 "api.remote_address";r=0;t=40 40`
			if g := strings.Join(got, "|"); g != want {
				errs <- ip + ": " + g
				return
			}
			errs <- ""
		}()
	}
	for range clients {
		if e := <-errs; e != "" {
			t.Error(e)
		}
	}
}

// closedDecider answers every request as a remote's fail_closed answer
// without rules does: over limit, no limit to describe, a wait.
type closedDecider struct{ wait time.Duration }

func (d closedDecider) Decide(_ context.Context, _ *decide.Request, o *decide.Outcome) error {
	o.Reset()
	o.Overall = sluice.Decision{RetryAfter: d.wait, Index: -1}
	o.Degraded = rules.FailClosed
	return nil
}

// A denial with no limit to describe still says when to retry, in the
// header and the body alike.
func TestDenialWithoutLimits(t *testing.T) {
	for _, tc := range []struct {
		wait time.Duration
		want string
	}{{2500 * time.Millisecond, "3"}, {0, "1"}, {sluice.Never, "60"}} {
		srv := limited(t, httplimit.Config{Decider: closedDecider{tc.wait}, Domain: "api"})
		r := do(t, srv.Client(), "GET", srv.URL, nil)
		body := decodeProblem(t, r)
		if r.status != 429 || r.header.Get("Retry-After") != tc.want || body.RetryAfter == nil || strconv.FormatInt(*body.RetryAfter, 10) != tc.want {
			t.Errorf("wait %v: %d, Retry-After %q, body %+v; want 429 and %s", tc.wait, r.status, r.header.Get("Retry-After"), body, tc.want)
		}
		if r.header.Get("X-RateLimit-Limit") != "" || r.header.Get("RateLimit") != "" {
			t.Errorf("wait %v: limit headers without a limit: %v", tc.wait, r.header)
		}
	}
}

// A block_for penalty: once the limit denies, the client is denied for
// the whole penalty, with its end as Retry-After, even after the window
// that denied it has ended; then the limit applies afresh.
func TestBlockFor(t *testing.T) {
	var now atomic.Int64
	now.Store(fixedNow.UnixNano())
	store := memstore.New(memstore.Config{Now: func() time.Time { return time.Unix(0, now.Load()) }})
	t.Cleanup(func() { store.Close() })
	dec := mustDecider(sluice.NewLimiter(store), rulestest.Config(t, `
domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2, block_for: 10m}
`))
	srv := limited(t, httplimit.Config{Decider: dec, Domain: "api"})
	var got []string
	step := func(advance time.Duration) {
		now.Add(int64(advance))
		r := do(t, srv.Client(), "GET", srv.URL, nil)
		got = append(got, fmt.Sprintf("%d/%s", r.status, r.header.Get("Retry-After")))
	}
	step(0)
	step(0)
	step(0)                              // denied: the 10-minute block starts
	step(time.Minute)                    // a new window, still blocked: 9 minutes left
	step(8*time.Minute + 30*time.Second) // 30 s left
	step(30 * time.Second)               // the block is over
	if want := "200/,200/,429/600,429/540,429/30,200/"; strings.Join(got, ",") != want {
		t.Errorf("got %s, want %s", strings.Join(got, ","), want)
	}
}

// Retry-After is each algorithm's own wait for the next request, rounded
// up: the clock stands 20.25 s into a minute (and 20.25 s into a 30 s
// refill step of the epoch), every request at the same instant.
func TestRetryAfterPerAlgorithm(t *testing.T) {
	for _, tc := range []struct {
		limit string
		n     int    // requests admitted before the denial
		want  string // Retry-After of the denial
	}{
		// 10 a minute: a token, a drop, a cell every 6 s.
		{"{unit: minute, requests_per_unit: 10, burst: 2, algorithm: token_bucket}", 2, "6"},
		{"{unit: minute, requests_per_unit: 10, burst: 2, algorithm: leaky_bucket}", 2, "6"},
		{"{unit: minute, requests_per_unit: 10, burst: 2, algorithm: gcra}", 2, "6"},
		// One token every 30 s, on the epoch's 30 s steps: the next in 9.75 s.
		{"{unit: minute, requests_per_unit: 2, burst: 2, algorithm: token_bucket, refill_interval: 30s}", 2, "10"},
		// The window ends in 39.75 s.
		{"{unit: minute, requests_per_unit: 2, algorithm: fixed_window}", 2, "40"},
		// The oldest request leaves the rolling minute in 60 s.
		{"{unit: minute, requests_per_unit: 2, algorithm: sliding_log}", 2, "60"},
		// At the window's end (39.75 s) the 2 become the previous window's,
		// weighted 2 × (1 − e/60): room for 1 when e ≥ 30 s, 69.75 s away.
		{"{unit: minute, requests_per_unit: 2, algorithm: sliding_window}", 2, "70"},
	} {
		srv := limited(t, httplimit.Config{Decider: decider(t, "domain: api\ndescriptors:\n  - key: remote_address\n    rate_limit: "+tc.limit+"\n"), Domain: "api"})
		for i := range tc.n {
			if r := do(t, srv.Client(), "GET", srv.URL, nil); r.status != 200 {
				t.Fatalf("%s: request %d: %d", tc.limit, i+1, r.status)
			}
		}
		r := do(t, srv.Client(), "GET", srv.URL, nil)
		if r.status != 429 || r.header.Get("Retry-After") != tc.want {
			t.Errorf("%s: %d, Retry-After %q; want 429, %s", tc.limit, r.status, r.header.Get("Retry-After"), tc.want)
		}
	}
}
