package httplimit_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/decision/overrides"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
)

// TestBlockedOverrideRetryAfter: a tenant blocked by a runtime override
// ({"blocked": true}) is told to come back in an hour, not to retry
// every second.
func TestBlockedOverrideRetryAfter(t *testing.T) {
	store := memstore.New(memstore.Config{})
	t.Cleanup(func() { store.Close() })
	runtime := overrides.NewIndex(time.Now)
	o := &overrides.Override{Domain: "api", Path: []overrides.Entry{{Key: "user", Value: "mallory"}}, Limit: json.RawMessage(`{"blocked": true}`)}
	if err := o.Compile(); err != nil {
		t.Fatal(err)
	}
	runtime.Put(o)
	dec, err := decide.New(decide.Config{Limiter: sluice.NewLimiter(store), Runtime: runtime,
		Rules: rulestest.Config(t, "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 10}\n")})
	if err != nil {
		t.Fatal(err)
	}
	srv := limited(t, httplimit.Config{Decider: dec, Domain: "api",
		Descriptors: []httplimit.Descriptor{{{Key: "user", Source: httplimit.Header("X-User")}}}})
	rep := do(t, srv.Client(), "GET", srv.URL, http.Header{"X-User": {"mallory"}})
	if rep.status != http.StatusTooManyRequests || rep.header.Get("Retry-After") != "3600" {
		t.Errorf("blocked: %d, Retry-After %q, want 429 and 3600", rep.status, rep.header.Get("Retry-After"))
	}
	if rep := do(t, srv.Client(), "GET", srv.URL, http.Header{"X-User": {"bob"}}); rep.status != http.StatusOK {
		t.Errorf("bob, under the rules: %d", rep.status)
	}
}
