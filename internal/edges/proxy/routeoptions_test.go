package proxy_test

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// A route's failures from the YAML: only the upstream's 401s are counted,
// and once they are spent the upstream sees no more attempts; a route's
// concurrency cap from the YAML denies the request over it.
func TestRouteOptionsFromYAML(t *testing.T) {
	release := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/login":
			if r.Header.Get("X-Password") != "right" {
				w.WriteHeader(http.StatusUnauthorized)
			}
		case "/slow":
			<-release
		}
	})
	f := start(t, `domain: api
http:
  routes:
    - pattern: "POST /login"
      failures:
        statuses: [401]
        descriptors: [[{key: failed_login, source: remote_address}]]
    - pattern: "/slow"
      concurrency: {max: 1}
      descriptors: [[{key: generic_key, value: slow}]]
descriptors:
  - key: failed_login
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: sliding_log}
`, up)
	c := f.srv.Client()
	var got []string
	for _, pw := range []string{"right", "wrong", "right", "wrong", "right", "wrong"} {
		resp, _ := f.do(c, "POST", "/login", "X-Password: "+pw)
		got = append(got, resp.Status[:3]+"/"+resp.Header.Get("X-RateLimit-Remaining"))
	}
	if want := "200/2,401/1,200/1,401/0,429/0,429/0"; strings.Join(got, ",") != want {
		t.Errorf("logins: %s, want %s", strings.Join(got, ","), want)
	}
	if n := up.hits.Load(); n != 4 {
		t.Errorf("upstream saw %d logins, want 4", n)
	}

	done := make(chan int)
	go func() {
		resp, _ := f.do(c, "GET", "/slow")
		done <- resp.StatusCode
	}()
	for deadline := time.Now().Add(wait); up.hits.Load() < 5; { // until the first /slow is in flight upstream
		if time.Now().After(deadline) {
			t.Fatal("the first /slow never reached the upstream")
		}
		time.Sleep(time.Millisecond)
	}
	if resp, _ := f.do(c, "GET", "/slow"); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("second /slow in flight: %d, Retry-After %q; want 429, 1", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	close(release)
	if code := <-done; code != 200 {
		t.Errorf("first /slow: %d", code)
	}
}
