package server_test

import (
	"encoding/json"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/overrides"
	"github.com/sluicehq/sluice/internal/server"
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
