package server_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/internal/decision/ratelimitheaders"
	"github.com/sluicehq/sluice/internal/edges/server"
)

// headers returns the response headers to add of resp as a map.
func headers(resp *rlsv3.RateLimitResponse) map[string]string {
	h := map[string]string{}
	for _, hv := range resp.ResponseHeadersToAdd {
		h[hv.Key] = hv.Value
	}
	return h
}

func checkHeaders(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: headers %v, want %v", what, got, want)
		return
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %s: %q, want %q (all: %v)", what, k, got[k], v, got)
		}
	}
}

const headerRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: post
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: day, requests_per_unit: 100}
  - key: probe
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: "quo\"te"
    rate_limit: {name: "naïve \"x\"", unit: hour, requests_per_unit: 7}
`

func TestHeaders(t *testing.T) {
	r := req("api", d("user=a"))
	t.Run("off", func(t *testing.T) {
		e := newEnv(t, headerRules, server.Config{})
		for range 4 {
			if resp := e.call(r); len(resp.ResponseHeadersToAdd) != 0 {
				t.Fatalf("headers when off: %v", resp.ResponseHeadersToAdd)
			}
		}
		resp, _ := e.post(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}`)
		if resp.Header.Get("Retry-After") != "" || resp.Header.Get("RateLimit") != "" {
			t.Errorf("/json headers when off: %v", resp.Header)
		}
	})

	t.Run("x-ratelimit", func(t *testing.T) {
		e := newEnv(t, headerRules, server.Config{Headers: ratelimitheaders.HeadersXRateLimit})
		checkHeaders(t, "first", headers(e.call(r)), map[string]string{
			"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "2", "X-RateLimit-Reset": "60",
		})
		e.clock.Advance(30*time.Second + 500*time.Millisecond)
		checkHeaders(t, "second, 29.5 s before the reset", headers(e.call(r)), map[string]string{
			"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "30",
		})
		checkHeaders(t, "the last allowed", headers(e.call(r)), map[string]string{
			"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "30",
		})
		resp := e.call(r)
		if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatal("fourth request allowed")
		}
		checkHeaders(t, "denied, no Retry-After asked", headers(resp), map[string]string{
			"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "30",
		})
	})

	t.Run("retry-after", func(t *testing.T) {
		e := newEnv(t, headerRules, server.Config{Headers: ratelimitheaders.HeadersRetryAfter})
		for range 3 {
			if h := headers(e.call(r)); len(h) != 0 {
				t.Fatalf("headers on an allowed request: %v", h)
			}
		}
		e.clock.Advance(59*time.Second + 1*time.Millisecond)
		// 0.999 s to the next window: rounded up to 1.
		checkHeaders(t, "denied", headers(e.call(r)), map[string]string{"Retry-After": "1"})
		// A request that can never fit (5 hits of a limit of 3) waits
		// one period rather than "never".
		big := req("api", d("user=b"))
		big.HitsAddend = 5
		checkHeaders(t, "never", headers(e.call(big)), map[string]string{"Retry-After": "60"})
		// The per-second limit of post denies: the day's 100 are not the
		// wait.
		p := req("api", d("post=x"))
		e.call(p)
		e.call(p)
		checkHeaders(t, "post", headers(e.call(p)), map[string]string{"Retry-After": "1"})
	})

	t.Run("ietf", func(t *testing.T) {
		e := newEnv(t, headerRules, server.Config{Headers: ratelimitheaders.HeadersIETF})
		checkHeaders(t, "one limit", headers(e.call(r)), map[string]string{
			"RateLimit-Policy": `"api.user";q=3;w=60`,
			"RateLimit":        `"api.user";r=2;t=60`,
		})
		// Several limits: the policy lists each enforced one; RateLimit
		// names the one with the least left, of those the one that resets
		// last. Shadow limits are not advertised; names are escaped
		// structured-field strings.
		several := req("api", d("post=x"), d("user=a"), d("probe=p"), d(`quo"te=1`))
		checkHeaders(t, "several", headers(e.call(several)), map[string]string{
			"RateLimit-Policy": `"api.post#0";q=2;w=1, "api.post#1";q=100;w=86400, "api.user";q=3;w=60, "na??ve \"x\"";q=7;w=3600`,
			"RateLimit":        `"api.user";r=1;t=60`,
		})
		checkHeaders(t, "user exhausted", headers(e.call(req("api", d("user=a"), d("post=y")))), map[string]string{
			"RateLimit-Policy": `"api.user";q=3;w=60, "api.post#0";q=2;w=1, "api.post#1";q=100;w=86400`,
			"RateLimit":        `"api.user";r=0;t=60`,
		})
		resp := e.call(req("api", d("user=a"), d("post=y")))
		checkHeaders(t, "denied", headers(resp), map[string]string{
			"RateLimit-Policy": `"api.user";q=3;w=60, "api.post#0";q=2;w=1, "api.post#1";q=100;w=86400`,
			"RateLimit":        `"api.user";r=0;t=60`,
		})
		if h := headers(e.call(req("api", d("probe=p")))); len(h) != 0 {
			t.Errorf("headers for a shadow limit only: %v", h)
		}
		if h := headers(e.call(req("api", d("nothing=1")))); len(h) != 0 {
			t.Errorf("headers without limits: %v", h)
		}
	})

	t.Run("all over json", func(t *testing.T) {
		e := newEnv(t, headerRules, server.Config{Headers: ratelimitheaders.HeadersAll})
		body := `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"a"}]}],"hitsAddend":3}`
		resp, b := e.post(body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		want := map[string]string{
			"RateLimit-Policy": `"api.user";q=3;w=60`, "RateLimit": `"api.user";r=0;t=60`,
			"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "60", "Retry-After": "",
		}
		for k, v := range want {
			if got := resp.Header.Get(k); got != v {
				t.Errorf("allowed: %s: %q, want %q", k, got, v)
			}
		}
		if !strings.Contains(string(b), `"responseHeadersToAdd"`) {
			t.Errorf("the body lacks the headers: %s", b)
		}
		e.clock.Advance(20 * time.Second)
		resp, b = e.post(body)
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		want["RateLimit"] = `"api.user";r=0;t=40`
		want["X-RateLimit-Reset"] = "40"
		want["Retry-After"] = "40"
		for k, v := range want {
			if got := resp.Header.Get(k); got != v {
				t.Errorf("denied: %s: %q, want %q", k, got, v)
			}
		}
	})
}
