package server_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/decision/overrides"
	"github.com/sluicehq/sluice/internal/decision/ratelimitheaders"
	"github.com/sluicehq/sluice/internal/edges/server"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/storetest"
)

// TestLimitedByHeaderOverride: a denial decided by a runtime override's
// limit names the override (its ID) first in x-sluice-limited-by, with
// the stats key it keeps as rule; a denial by the rule beside it names
// no override.
func TestLimitedByHeaderOverride(t *testing.T) {
	const yaml = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1}
`
	clock := storetest.NewClock(epoch)
	store := memstore.New(memstore.Config{Now: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	idx := overrides.NewIndex(clock.Now)
	o := &overrides.Override{Domain: "api", Path: []overrides.Entry{{Key: "user", Value: "bob/x"}}, Limit: json.RawMessage(`{"unit":"hour","requests_per_unit":2}`)}
	if err := o.Compile(); err != nil {
		t.Fatal(err)
	}
	idx.Put(o)
	e := newEnvStore(t, yaml, server.Config{LimitedBy: true, Decide: decide.Config{Limiter: sluice.NewLimiter(store), Runtime: idx}}, store)

	bob := req("api", d("user=bob/x"))
	for range 2 {
		if resp := e.call(bob); resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("user=bob/x under its override of 2: %v", resp.OverallCode)
		}
	}
	resp := e.call(bob)
	want := `override="api|user=bob%2Fx"; rule="api.user"; descriptor=0; algorithm=fixed_window; limit=2/1h0m0s; remaining=0; reset=`
	if h := limitedByOf(resp); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || !strings.HasPrefix(h, want) {
		t.Errorf("denied by the override: %v %q, want %q…", resp.OverallCode, h, want)
	}
	ann := req("api", d("user=ann"))
	e.call(ann)
	resp = e.call(ann)
	if h := limitedByOf(resp); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || !strings.HasPrefix(h, `rule="api.user"; descriptor=0; algorithm=fixed_window; limit=1/1h0m0s;`) {
		t.Errorf("denied by the rule: %v %q", resp.OverallCode, h)
	}
}

// TestLimitedByAgreesWithHeaders: for every algorithm, a denial's
// x-sluice-limited-by states the times and quota the rate limit headers
// state: reset is Retry-After, remaining is X-RateLimit-Remaining, and
// limit is the RateLimit-Policy's q per w. A client that follows either
// waits as long.
func TestLimitedByAgreesWithHeaders(t *testing.T) {
	for _, tc := range []struct{ name, limit string }{
		{"fixed_window", "{unit: minute, requests_per_unit: 6}"},
		{"sliding_window", "{unit: minute, requests_per_unit: 6, algorithm: sliding_window}"},
		{"sliding_log", "{unit: minute, requests_per_unit: 6, algorithm: sliding_log}"},
		{"token_bucket", "{unit: minute, requests_per_unit: 6, burst: 3, algorithm: token_bucket}"},
		{"token_bucket_discrete", "{unit: minute, requests_per_unit: 6, burst: 3, algorithm: token_bucket, refill_interval: 20s}"},
		{"leaky_bucket", "{unit: minute, requests_per_unit: 6, burst: 3, algorithm: leaky_bucket}"},
		{"gcra", "{unit: minute, requests_per_unit: 6, burst: 3, algorithm: gcra}"},
		{"sketch", "{unit: minute, requests_per_unit: 6, algorithm: sketch}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			yaml := "domain: api\ndescriptors:\n  - key: user\n    rate_limit: " + tc.limit + "\n"
			e := newEnv(t, yaml, server.Config{LimitedBy: true, Headers: ratelimitheaders.HeadersAll})
			r := req("api", d("user=a"))
			denials := 0
			// Requests 7 s apart for four minutes: each algorithm denies
			// at several points of its window or refill.
			for step := range 36 {
				resp := e.call(r)
				h := headers(resp)
				if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
					if h[server.LimitedByHeader] != "" {
						t.Fatalf("step %d: x-sluice-limited-by on an admitted request: %v", step, h)
					}
					e.clock.Advance(7 * time.Second)
					continue
				}
				denials++
				fields := map[string]string{}
				for _, part := range strings.Split(h[server.LimitedByHeader], "; ") {
					k, v, _ := strings.Cut(part, "=")
					fields[k] = v
				}
				if got, want := fields["reset"], h["Retry-After"]+"s"; got != want {
					t.Errorf("step %d: reset=%s, Retry-After %s (%v)", step, got, want, h)
				}
				if got, want := fields["remaining"], h["X-RateLimit-Remaining"]; got != want {
					t.Errorf("step %d: remaining=%s, X-RateLimit-Remaining %s (%v)", step, got, want, h)
				}
				q, w, ok := strings.Cut(fields["limit"], "/")
				dur, err := time.ParseDuration(w)
				if !ok || err != nil {
					t.Fatalf("step %d: limit=%q", step, fields["limit"])
				}
				if want := fmt.Sprintf(`"api.user";q=%s;w=%d`, q, int64(dur/time.Second)); h["RateLimit-Policy"] != want {
					t.Errorf("step %d: limit=%s, RateLimit-Policy %s", step, fields["limit"], h["RateLimit-Policy"])
				}
				if fields["algorithm"] != strings.TrimSuffix(tc.name, "_discrete") {
					t.Errorf("step %d: algorithm=%s", step, fields["algorithm"])
				}
				e.clock.Advance(7 * time.Second)
			}
			if denials < 3 {
				t.Fatalf("%d denials: the test did not reach the limit", denials)
			}
		})
	}
}
