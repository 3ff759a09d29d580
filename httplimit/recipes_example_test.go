package httplimit_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/decision/overrides"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

// ExampleFailures is the login recipe of docs/recipes.md: failed logins
// counted per account and per client address, only on 401, with a
// lockout, and a looser limit on every attempt.
func ExampleFailures() {
	domain, err := rules.Parse("auth.yaml", []byte(`domain: auth
descriptors:
  # Every attempt, per client address: 10 at once, then one every 2 s.
  - key: login_ip
    rate_limit:
      algorithm: gcra
      unit: minute
      requests_per_unit: 30
      burst: 10
  # Failed attempts per account: at most 5 in any 15 minutes; the 6th
  # locks the account for 15 minutes.
  - key: login_failed_user
    rate_limit:
      algorithm: sliding_log
      unit: minute
      unit_multiplier: 15
      requests_per_unit: 5
      block_for: 15m
  # Failed attempts per client address, across accounts (password
  # spraying): 20, then one more every 3 minutes.
  - key: login_failed_ip
    rate_limit:
      algorithm: token_bucket
      unit: hour
      requests_per_unit: 20
      burst: 20
`))
	if err != nil {
		panic(err)
	}
	cfg, err := rules.NewConfig(domain)
	if err != nil {
		panic(err)
	}
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	store := memstore.New(memstore.Config{Now: func() time.Time { return now }})
	defer store.Close()

	decider, err := decide.New(decide.Config{Limiter: sluice.NewLimiter(store), Rules: cfg})
	if err != nil {
		panic(err)
	}
	limit, err := httplimit.New(httplimit.Config{
		Decider: decider,
		Domain:  "auth",
		// Every attempt, per client address.
		Descriptors: []httplimit.Descriptor{
			{{Key: "login_ip", Source: httplimit.RemoteAddress()}},
		},
		// Failed attempts, per account and per client address: checked
		// before the handler, counted only when it answers 401.
		Failures: &httplimit.Failures{
			Descriptors: []httplimit.Descriptor{
				{{Key: "login_failed_user", Source: httplimit.Header("X-Login-User")}},
				{{Key: "login_failed_ip", Source: httplimit.RemoteAddress()}},
			},
			Statuses: []int{http.StatusUnauthorized},
		},
		// One attempt per account in flight (in this process): concurrent
		// attempts cannot all pass the check before the first is counted.
		Concurrency: &httplimit.Concurrency{
			Max:        1,
			Descriptor: httplimit.Descriptor{{Source: httplimit.Header("X-Login-User")}},
		},
	})
	if err != nil {
		panic(err)
	}

	// The account is in the form; the middleware reads it from a header
	// that this handler sets, replacing any the client sent.
	account := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.Header.Del("X-Login-User")
			if u := strings.ToLower(strings.TrimSpace(r.PostFormValue("user"))); u != "" {
				r.Header.Set("X-Login-User", u)
			}
			next.ServeHTTP(w, r)
		})
	}
	login := func(w http.ResponseWriter, r *http.Request) {
		if r.PostFormValue("password") != "hunter2" {
			http.Error(w, "wrong user or password", http.StatusUnauthorized)
			return
		}
		io.WriteString(w, "welcome\n")
	}
	mux := http.NewServeMux()
	mux.Handle("POST /login", account(limit(http.HandlerFunc(login))))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	try := func(user, password string) {
		resp, err := http.PostForm(srv.URL+"/login", url.Values{"user": {user}, "password": {password}})
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%-5s %-7s %d RateLimit: %s", user, password, resp.StatusCode, resp.Header.Get("RateLimit"))
		if v := resp.Header.Get("Retry-After"); v != "" {
			fmt.Printf(" Retry-After: %s\n  %s", v, strings.TrimSpace(string(body)))
		}
		fmt.Println()
	}
	for range 4 {
		try("alice", "guess")
	}
	try("alice", "hunter2") // a success is not counted
	try("Alice", "guess")   // the 5th failure
	try("alice", "guess")   // the 6th attempt: locked out
	try("alice", "hunter2") // the lockout holds for the right password too
	try("bob", "guess")     // another account from the same address
	// Output:
	// alice guess   401 RateLimit: "auth.login_failed_user";r=4;t=900
	// alice guess   401 RateLimit: "auth.login_failed_user";r=3;t=900
	// alice guess   401 RateLimit: "auth.login_failed_user";r=2;t=900
	// alice guess   401 RateLimit: "auth.login_failed_user";r=1;t=900
	// alice hunter2 200 RateLimit: "auth.login_failed_user";r=1;t=900
	// Alice guess   401 RateLimit: "auth.login_failed_user";r=0;t=900
	// alice guess   429 RateLimit: "auth.login_failed_user";r=0;t=900 Retry-After: 900
	//   {"type":"https://pkg.go.dev/github.com/sluicehq/sluice/httplimit#ProblemRateLimited","title":"Too many requests","status":429,"detail":"Rate limit exceeded; retry in 900 seconds.","retry-after":900,"violated-policies":[{"name":"auth.login_failed_user","quota":5,"window":900}]}
	// alice hunter2 429 RateLimit: "auth.login_failed_user";r=0;t=900 Retry-After: 900
	//   {"type":"https://pkg.go.dev/github.com/sluicehq/sluice/httplimit#ProblemRateLimited","title":"Too many requests","status":429,"detail":"Rate limit exceeded; retry in 900 seconds.","retry-after":900,"violated-policies":[{"name":"auth.login_failed_user","quota":5,"window":900}]}
	// bob   guess   401 RateLimit: "auth.login_ip";r=3;t=2
}

// ExampleConfig_tiers is the tiered plans recipe of docs/recipes.md: a
// limit per user whose value depends on the plan that the auth layer
// found, with unknown plans limited as free.
func ExampleConfig_tiers() {
	domain, err := rules.Parse("api.yaml", []byte(`domain: api
descriptors:
  - key: plan
    value: paid
    descriptors:
      - key: user
        rate_limit: {algorithm: sliding_window, unit: minute, requests_per_unit: 600}
  # free, and any plan not listed above
  - key: plan
    descriptors:
      - key: user
        rate_limit: {algorithm: sliding_window, unit: minute, requests_per_unit: 60}
`))
	if err != nil {
		panic(err)
	}
	cfg, err := rules.NewConfig(domain)
	if err != nil {
		panic(err)
	}
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	store := memstore.New(memstore.Config{Now: func() time.Time { return now }})
	defer store.Close()

	decider, err := decide.New(decide.Config{Limiter: sluice.NewLimiter(store), Rules: cfg})
	if err != nil {
		panic(err)
	}
	limit, err := httplimit.New(httplimit.Config{
		Decider: decider,
		Domain:  "api",
		Descriptors: []httplimit.Descriptor{{
			{Key: "plan", Source: httplimit.Header("X-Plan")},
			{Key: "user", Source: httplimit.Header("X-User")},
		}},
	})
	if err != nil {
		panic(err)
	}

	// authenticate stands for your auth layer: it sets X-User and X-Plan
	// from the verified credential, replacing whatever the client sent.
	type account struct{ user, plan string }
	tokens := map[string]account{
		"Bearer t-alice": {"alice", "free"},
		"Bearer t-bob":   {"bob", "paid"},
		"Bearer t-carol": {"carol", "trial"}, // a plan the rules do not name
	}
	authenticate := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			a, ok := tokens[r.Header.Get("Authorization")]
			if !ok {
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			r.Header.Set("X-User", a.user)
			r.Header.Set("X-Plan", a.plan)
			next.ServeHTTP(w, r)
		})
	}
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok\n")
	})
	srv := httptest.NewServer(authenticate(limit(api)))
	defer srv.Close()

	// Each sends 700 requests in the same minute and counts the answers.
	for _, c := range []struct{ token, plan string }{
		{"Bearer t-alice", ""},
		{"Bearer t-alice", "paid"}, // the client's own X-Plan is replaced
		{"Bearer t-bob", ""},
		{"Bearer t-carol", ""},
	} {
		counts := map[int]int{}
		var policy string
		for range 700 {
			req, _ := http.NewRequest("GET", srv.URL, nil)
			req.Header.Set("Authorization", c.token)
			if c.plan != "" {
				req.Header.Set("X-Plan", c.plan)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				panic(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			counts[resp.StatusCode]++
			policy = resp.Header.Get("RateLimit-Policy")
		}
		fmt.Printf("%s (X-Plan %q): %d allowed, %d denied, %s\n", c.token, c.plan, counts[200], counts[429], policy)
	}
	// Output:
	// Bearer t-alice (X-Plan ""): 60 allowed, 640 denied, "api.plan.user";q=60;w=60
	// Bearer t-alice (X-Plan "paid"): 0 allowed, 700 denied, "api.plan.user";q=60;w=60
	// Bearer t-bob (X-Plan ""): 600 allowed, 100 denied, "api.plan_paid.user";q=600;w=60
	// Bearer t-carol (X-Plan ""): 60 allowed, 640 denied, "api.plan.user";q=60;w=60
}

// ExampleConfig_tiersWithOverrides is the tiered plans recipe of
// docs/recipes.md with exceptions set at runtime (package overrides): one
// customer's quota raised for a week, a leaked account blocked, without
// touching the rules or the plan headers.
func ExampleConfig_tiersWithOverrides() {
	domain, err := rules.Parse("api.yaml", []byte(`domain: api
descriptors:
  - key: plan
    value: paid
    descriptors:
      - key: user
        rate_limit: {algorithm: sliding_window, unit: minute, requests_per_unit: 600}
  - key: plan
    descriptors:
      - key: user
        rate_limit: {algorithm: sliding_window, unit: minute, requests_per_unit: 60}
`))
	if err != nil {
		panic(err)
	}
	cfg, err := rules.NewConfig(domain)
	if err != nil {
		panic(err)
	}
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	store := memstore.New(memstore.Config{Now: func() time.Time { return now }})
	defer store.Close()

	// The overrides in force: sluice serve keeps them in Redis or a file
	// and changes them through its admin API (sluice override set); a Go
	// program may keep an Index itself.
	runtime := overrides.NewIndex(func() time.Time { return now })
	decider, err := decide.New(decide.Config{Limiter: sluice.NewLimiter(store), Rules: cfg, Runtime: runtime})
	if err != nil {
		panic(err)
	}
	week := now.Add(7 * 24 * time.Hour)
	for _, o := range []*overrides.Override{
		// carol, on a free plan, gets 1,200 a minute for launch week,
		// whatever plan her headers say.
		{Domain: "api", Path: []overrides.Entry{{Key: "plan", Value: "*"}, {Key: "user", Value: "carol"}},
			Limit:   json.RawMessage(`{"algorithm": "sliding_window", "unit": "minute", "requests_per_unit": 1200}`),
			Expires: &week, Note: "launch week"},
		// mallory's credentials leaked: nothing passes.
		{Domain: "api", Path: []overrides.Entry{{Key: "plan", Value: "*"}, {Key: "user", Value: "mallory"}},
			Limit: json.RawMessage(`{"blocked": true}`)},
	} {
		if err := o.Compile(); err != nil {
			panic(err)
		}
		runtime.Put(o)
	}

	limit, err := httplimit.New(httplimit.Config{
		Decider: decider,
		Domain:  "api",
		Descriptors: []httplimit.Descriptor{{
			{Key: "plan", Source: httplimit.Header("X-Plan")},
			{Key: "user", Source: httplimit.Header("X-User")},
		}},
	})
	if err != nil {
		panic(err)
	}
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	srv := httptest.NewServer(limit(api))
	defer srv.Close()

	// Each sends 1,500 requests in the same minute (the headers stand for
	// what the auth layer sets).
	send := func(user, plan string) {
		counts := map[int]int{}
		for range 1500 {
			req, _ := http.NewRequest("GET", srv.URL, nil)
			req.Header.Set("X-User", user)
			req.Header.Set("X-Plan", plan)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				panic(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			counts[resp.StatusCode]++
		}
		fmt.Printf("%s (%s): %d allowed, %d denied\n", user, plan, counts[200], counts[429])
	}
	send("alice", "free")
	send("bob", "paid")
	send("carol", "free")
	send("mallory", "paid")
	now = week.Add(time.Minute) // launch week is over: carol is free again
	send("carol", "free")
	// Output:
	// alice (free): 60 allowed, 1440 denied
	// bob (paid): 600 allowed, 900 denied
	// carol (free): 1200 allowed, 300 denied
	// mallory (paid): 0 allowed, 1500 denied
	// carol (free): 60 allowed, 1440 denied
}
