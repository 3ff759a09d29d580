package httplimit_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/testsupport/logtest"
)

// A login that fails (401) unless the password header is right.
func loginHandler(calls *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		switch r.Header.Get("X-Password") {
		case "right":
			w.Write([]byte("welcome"))
		case "crash":
			w.WriteHeader(http.StatusInternalServerError)
		default:
			w.WriteHeader(http.StatusUnauthorized)
		}
	})
}

const failureRules = `
domain: auth
descriptors:
  - key: failed_login
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 100}
`

func failureServer(t *testing.T, yaml string, other []httplimit.Descriptor, calls *atomic.Int64) string {
	t.Helper()
	return failureServerOn(t, decider(t, yaml), other, calls)
}

func failureServerOn(t *testing.T, d *decide.Decider, other []httplimit.Descriptor, calls *atomic.Int64) string {
	t.Helper()
	mw, err := httplimit.New(httplimit.Config{
		Decider:     d,
		Domain:      "auth",
		Descriptors: other,
		Failures: &httplimit.Failures{
			Descriptors: []httplimit.Descriptor{{{Key: "failed_login", Source: httplimit.RemoteAddress()}}},
			Statuses:    []int{401, 403},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return server(t, mw(loginHandler(calls))).URL
}

// Only failed logins are charged; once three have failed, the fourth
// attempt is denied before the handler runs, with the password right or
// not, until the window ends.
func TestFailuresCountOnlyFailures(t *testing.T) {
	var calls atomic.Int64
	url := failureServer(t, failureRules, nil, &calls)
	client := http.DefaultClient
	try := func(password string) reply {
		return do(t, client, "POST", url, http.Header{"X-Password": {password}})
	}
	var got []string
	for _, pw := range []string{"right", "right", "crash", "wrong", "right", "wrong", "wrong", "right", "wrong"} {
		r := try(pw)
		got = append(got, r.String()+"/"+r.header.Get("Retry-After"))
	}
	// Remaining is the failures left, counting the response's own:
	// successes and 500s leave it alone; the third failure leaves 0; then
	// every attempt is denied, with the window's end (39.75 s away) as
	// Retry-After.
	want := "200 3/,200 3/,500 3/,401 2/,200 2/,401 1/,401 0/,429 0/40,429 0/40"
	if strings.Join(got, ",") != want {
		t.Errorf("got  %s\nwant %s", strings.Join(got, ","), want)
	}
	if n := calls.Load(); n != 7 {
		t.Errorf("handler called %d times, want 7 (the denied attempts never reach it)", n)
	}
}

// With other descriptors, a request the failure limit denies consumes
// nothing from them, and their headers describe allowed requests.
func TestFailuresAllOrNothing(t *testing.T) {
	var calls atomic.Int64
	d := decider(t, failureRules)
	url := failureServerOn(t, d, []httplimit.Descriptor{{{Source: httplimit.RemoteAddress()}}}, &calls)
	plain := limited(t, httplimit.Config{Decider: d, Domain: "auth"}) // remote_address only
	for range 3 {
		if r := do(t, http.DefaultClient, "POST", url, http.Header{"X-Password": {"wrong"}}); r.status != 401 {
			t.Fatalf("status %d, want 401", r.status)
		}
	}
	for range 5 {
		if r := do(t, http.DefaultClient, "POST", url, nil); r.status != 429 {
			t.Fatalf("status %d, want 429", r.status)
		}
	}
	// The 3 admitted requests charged the per-address limit; the 5 denied
	// did not: the 4th request on it leaves 96 of 100.
	if r := do(t, http.DefaultClient, "GET", plain.URL, nil); r.String() != "200 96" {
		t.Errorf("per-address limit after 3 admitted and 5 denied: %s, want 200 96", r)
	}
	r := do(t, http.DefaultClient, "GET", url+"/other", nil)
	if r.status != 429 || r.header.Get("X-RateLimit-Limit") != "3" {
		t.Fatalf("still denied by the failure limit: got %d %v", r.status, r.header)
	}
	body := decodeProblem(t, r)
	if len(body.Violated) != 1 || body.Violated[0].Name != "auth.failed_login" {
		t.Errorf("violated %+v, want the failure limit only", body.Violated)
	}
}

// A block_for on the failure limit starts when an attempt finds it
// exhausted, and the Retry-After is the block's.
func TestFailuresBlockFor(t *testing.T) {
	var calls atomic.Int64
	url := failureServer(t, `
domain: auth
descriptors:
  - key: failed_login
    rate_limit: {unit: minute, requests_per_unit: 2, block_for: 15m}
`, nil, &calls)
	var got []string
	for _, pw := range []string{"wrong", "wrong", "right", "right"} {
		r := do(t, http.DefaultClient, "POST", url, http.Header{"X-Password": {pw}})
		got = append(got, r.String()+"/"+r.header.Get("Retry-After"))
	}
	if want := "401 1/,401 0/,429 0/900,429 0/900"; strings.Join(got, ",") != want {
		t.Errorf("got %s, want %s", strings.Join(got, ","), want)
	}
}

func TestFailuresConfigErrors(t *testing.T) {
	d := decider(t, failureRules)
	desc := []httplimit.Descriptor{{{Source: httplimit.RemoteAddress()}}}
	for name, f := range map[string]*httplimit.Failures{
		"no descriptors": {Statuses: []int{401}},
		"no statuses":    {Descriptors: desc},
		"bad status":     {Descriptors: desc, Statuses: []int{401, 99}},
		"big status":     {Descriptors: desc, Statuses: []int{600}},
		"empty desc":     {Descriptors: []httplimit.Descriptor{{}}, Statuses: []int{401}},
	} {
		if _, err := httplimit.New(httplimit.Config{Decider: d, Domain: "auth", Failures: f}); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// A client that hangs up before its failed attempt is answered is still
// charged the failure.
func TestFailuresCountedAfterHangUp(t *testing.T) {
	d := decider(t, failureRules)
	answered := make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // the client is gone
		w.WriteHeader(http.StatusUnauthorized)
		close(answered)
	})
	mw, err := httplimit.New(httplimit.Config{
		Decider:     d,
		Domain:      "auth",
		Descriptors: []httplimit.Descriptor{},
		Failures: &httplimit.Failures{
			Descriptors: []httplimit.Descriptor{{{Key: "failed_login", Source: httplimit.RemoteAddress()}}},
			Statuses:    []int{401},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := server(t, mw(slow))
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, nil)
	go func() {
		time.Sleep(50 * time.Millisecond) // let the request reach the handler
		cancel()
	}()
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Fatal("the request was answered; it should have been cancelled")
	}
	<-answered
	var calls atomic.Int64
	url := failureServerOn(t, d, nil, &calls)
	if r := do(t, http.DefaultClient, "POST", url, http.Header{"X-Password": {"right"}}); r.String() != "200 2" {
		t.Errorf("after a failure whose client hung up: %s, want 200 2", r)
	}
}

// Failures in flight when another request trips a main limit's block_for
// are still counted: each failure limit is charged on its own.
func TestFailuresCountedDespiteMainBlock(t *testing.T) {
	d := decider(t, `
domain: auth
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3, block_for: 1m}
  - key: failed_login
    rate_limit: {unit: hour, requests_per_unit: 5}
`)
	gate, entered := make(chan struct{}), make(chan struct{}, 3)
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-gate
		w.WriteHeader(http.StatusUnauthorized)
	})
	failures := &httplimit.Failures{
		Descriptors: []httplimit.Descriptor{{{Key: "failed_login", Source: httplimit.RemoteAddress()}}},
		Statuses:    []int{401},
	}
	mw, err := httplimit.New(httplimit.Config{
		Decider:     d,
		Domain:      "auth",
		Descriptors: []httplimit.Descriptor{{{Source: httplimit.RemoteAddress()}}},
		Failures:    failures,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := server(t, mw(slow))
	done := make(chan int, 3)
	for range 3 {
		go func() { done <- do(t, http.DefaultClient, "POST", srv.URL, nil).status }()
		<-entered
	}
	// The fourth is over the address's 3 a minute: denied, its block starts.
	if r := do(t, http.DefaultClient, "POST", srv.URL, nil); r.status != 429 {
		t.Fatalf("fourth attempt: %d, want 429", r.status)
	}
	close(gate)
	for range 3 {
		if s := <-done; s != 401 {
			t.Fatalf("attempt in flight: %d, want 401", s)
		}
	}
	// The three failures counted: 2 of 5 left.
	var calls atomic.Int64
	onlyFailures := failureServerOn(t, d, nil, &calls)
	if r := do(t, http.DefaultClient, "POST", onlyFailures, http.Header{"X-Password": {"right"}}); r.String() != "200 2" {
		t.Errorf("failures left after 3 failed in flight: %s, want 200 2", r)
	}
}

// A failure limit with a soft margin counts at its nominal quota: no
// success is ever charged as a failure, and the attempt after the last
// failure is denied until the limit has room again: for a window, when it
// ends; for a bucket of 3 failures with 1 forgiven an hour, in an hour,
// not when all 3 are (the bucket is full again in three hours).
func TestFailuresSoftLimitNominal(t *testing.T) {
	for _, tc := range []struct {
		limit     string
		passwords []string
		want      string
	}{
		{"{unit: minute, requests_per_unit: 3, soft_percent: 100}", []string{"right", "wrong", "right", "wrong", "wrong", "right", "right"},
			"200 3/40/,401 2/40/,200 2/40/,401 1/40/,401 0/40/,429 0/40/40,429 0/40/40"},
		{"{unit: hour, requests_per_unit: 1, burst: 3, algorithm: token_bucket, soft_percent: 100}", []string{"wrong", "wrong", "wrong", "right"},
			"401 2/3600/,401 1/3600/,401 0/3600/,429 0/3600/3600"},
	} {
		var calls atomic.Int64
		url := failureServer(t, "domain: auth\ndescriptors:\n  - key: failed_login\n    rate_limit: "+tc.limit+"\n", nil, &calls)
		if got := attempts(t, url, tc.passwords...); got != tc.want {
			t.Errorf("%s:\ngot  %s\nwant %s", tc.limit, got, tc.want)
		}
	}
}

// attempts sends a login attempt with each password to url and spells
// the answers, each as "status remaining/t/Retry-After".
func attempts(t *testing.T, url string, passwords ...string) string {
	t.Helper()
	var got []string
	for _, pw := range passwords {
		r := do(t, http.DefaultClient, "POST", url, http.Header{"X-Password": {pw}})
		got = append(got, r.String()+"/"+r.header.Get("X-RateLimit-Reset")+"/"+r.header.Get("Retry-After"))
	}
	return strings.Join(got, ",")
}

// In shadow mode a failure limit denies nothing, but the request is
// reported and logged as one it would have denied.
func TestFailuresShadow(t *testing.T) {
	var logs logtest.Buffer
	var rs results
	mw, err := httplimit.New(httplimit.Config{
		Decider:    decider(t, "domain: auth\ndescriptors:\n  - key: failed_login\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"),
		Domain:     "auth",
		ShadowMode: true,
		Logger:     logs.Logger(),
		OnResult:   rs.on,
		Failures: &httplimit.Failures{
			Descriptors: []httplimit.Descriptor{{{Key: "failed_login", Source: httplimit.RemoteAddress()}}},
			Statuses:    []int{401},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	srv := server(t, mw(loginHandler(&calls)))
	var got []int
	for range 3 {
		got = append(got, do(t, http.DefaultClient, "POST", srv.URL, nil).status)
	}
	if fmt.Sprint(got) != "[401 401 401]" || calls.Load() != 3 {
		t.Errorf("statuses %v, %d calls: shadow mode must let every attempt through", got, calls.Load())
	}
	if r := rs.take(); r != "allowed,shadow,shadow" {
		t.Errorf("results %s, want allowed,shadow,shadow", r)
	}
	if !strings.Contains(logs.String(), "failure limit exceeded in shadow mode") {
		t.Errorf("no shadow line:\n%s", logs.String())
	}
}
