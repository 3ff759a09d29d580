package httplimit_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/rules"
)

// failurePermitRules put a concurrency limit on the failure descriptor
// failed_login, beside its rate: what sluice proxy refuses at load, and
// what a Decider's rules may still come to say after the middleware was
// built (a reload, or a remote service's rules).
const failurePermitRules = `
domain: auth
descriptors:
  - key: failed_login
    concurrency: {max: 10, ttl: 1h}
    rate_limit: {unit: minute, requests_per_unit: 3}
`

// heldPermits is the permits the concurrency limit of the failure
// descriptor of the client 127.0.0.1 holds now, as sluice explain reads
// them from the store.
func heldPermits(t *testing.T, d *decide.Decider) int64 {
	t.Helper()
	e, err := d.Explain(context.Background(), "auth", []rules.Descriptor{{Entries: []rules.Entry{{Key: "failed_login", Value: "127.0.0.1"}}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, de := range e.Descriptors {
		for _, le := range de.Limits {
			if le.Hit.Limit != nil && le.Hit.Limit.Algorithm == sluice.Concurrency {
				if le.State == nil || le.State.Held == nil {
					t.Fatalf("no state for the concurrency limit: %+v", le)
				}
				return *le.State.Held
			}
		}
	}
	t.Fatalf("no concurrency limit in the explanation: %+v", e)
	return 0
}

// TestFailuresHoldNoPermit: when the rules in force put a concurrency
// limit on a failure descriptor, the decisions of the failures stage hold
// no permit once they are made: no slot stays held after the requests
// have ended (it would until the permit's ttl, an hour), and the failures
// are still counted, so that the attempt after the third is denied.
func TestFailuresHoldNoPermit(t *testing.T) {
	d := decider(t, failureRules) // no concurrency limit when New is called
	var calls atomic.Int64
	url := failureServerOn(t, d, nil, &calls)
	d.SetRules(rulestest.Config(t, failurePermitRules))

	for i := range 3 {
		if r := do(t, http.DefaultClient, "POST", url, http.Header{"X-Password": {"wrong"}}); r.status != http.StatusUnauthorized {
			t.Fatalf("attempt %d: %s, want 401", i, r)
		}
	}
	if n := heldPermits(t, d); n != 0 {
		t.Errorf("%d permits held after 3 failed attempts ended, want 0", n)
	}
	if r := do(t, http.DefaultClient, "POST", url, http.Header{"X-Password": {"right"}}); r.status != http.StatusTooManyRequests {
		t.Errorf("after 3 failures: %s, want 429 (every failure counted)", r)
	}
	if n := heldPermits(t, d); n != 0 {
		t.Errorf("%d permits held after the denied attempt, want 0", n)
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("handler called %d times, want 3", n)
	}
}

// TestFailuresHoldNoPermitWithDescriptors: the same with main
// descriptors of a concurrency rule of their own: the request's own
// permit is held while it runs and given back when it ends, and the
// failure stage's are never held beside it.
func TestFailuresHoldNoPermitWithDescriptors(t *testing.T) {
	d := decider(t, failureRules)
	var calls atomic.Int64
	url := failureServerOn(t, d, []httplimit.Descriptor{{{Key: "user", Source: httplimit.Header("X-User")}}}, &calls)
	d.SetRules(rulestest.Config(t, failurePermitRules+`  - key: user
    concurrency: {max: 1, ttl: 1h}
`))
	for i := range 3 {
		if r := do(t, http.DefaultClient, "POST", url, http.Header{"X-Password": {"wrong"}, "X-User": {"u"}}); r.status != http.StatusUnauthorized {
			t.Fatalf("attempt %d: %s, want 401 (the user's one slot given back each time)", i, r)
		}
	}
	if n := heldPermits(t, d); n != 0 {
		t.Errorf("%d failure permits held after 3 failed attempts ended, want 0", n)
	}
}
