package rls_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/edges/rls"
	"github.com/sluicehq/sluice/rules"
)

const degradedRules = `
domain: api
capacity: {unit: minute, requests_per_unit: 100}
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: post
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: hour, requests_per_unit: 1000}
  - key: dry
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: free
    unlimited: true
`

// DecideDegraded answers as DecideInto does when the store fails with the
// same error, under every policy, request after request (the local policy
// counts), and never asks the store.
func TestDecideDegradedMatchesStoreFailure(t *testing.T) {
	reqs := [][]*rlv3.RateLimitDescriptor{
		{desc("user", "a")},
		{desc("user", "a"), desc("post", "b")},
		{desc("dry", "c")},
		{desc("free", "d"), desc("none", "e")},
		{desc("user", "a")},
		{desc("user", "a")},
		{desc("user", "a"), desc("post", "b")},
	}
	for _, tc := range []struct {
		name   string
		domain string // the domain's failure_policy
		f      decide.Failover
	}{
		{"fail_open", "", decide.Failover{}},
		{"fail_closed", "", decide.Failover{Default: rules.FailClosed}},
		{"local", "", decide.Failover{Default: rules.FailLocal, Nodes: 2}},
		{"domain_closed", "fail_closed", decide.Failover{Default: rules.FailOpen}},
		{"domain_local", "local", decide.Failover{Nodes: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			yaml := degradedRules
			if tc.domain != "" {
				yaml = "failure_policy: " + tc.domain + "\n" + yaml
			}
			failing, degraded := newFailEnv(t, yaml), newFailEnv(t, yaml)
			for _, e := range []*failEnv{failing, degraded} {
				f := tc.f
				f.Local = e.local
				e.setFailover(t, f)
			}
			failing.store.fail(errDown)
			ctx := context.Background()
			for i, descs := range reqs {
				r := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: descs}
				var want, got outcome
				if err := failing.dec.DecideInto(ctx, r, &want); err != nil {
					t.Fatalf("request %d: DecideInto: %v", i, err)
				}
				if err := degraded.dec.DecideDegraded(ctx, r, &got, errDown); err != nil {
					t.Fatalf("request %d: DecideDegraded: %v", i, err)
				}
				if want.Degraded == rules.FailDefault && descs[0].Entries[0].Key != "free" {
					t.Fatalf("request %d: the failing store was not degraded", i)
				}
				sameOutcome(t, fmt.Sprintf("request %d", i), &got, &want)
			}
			if degraded.store.takes != 0 {
				t.Errorf("DecideDegraded asked the store %d times", degraded.store.takes)
			}
		})
	}
}

// sameOutcome compares two outcomes of separate Deciders, whose limits are
// equal but not the same pointers.
func sameOutcome(t *testing.T, what string, got, want *outcome) {
	t.Helper()
	if !proto.Equal(got.Response, want.Response) {
		t.Errorf("%s: response\n%v\nwant\n%v", what, got.Response, want.Response)
	}
	if got.Overall != want.Overall || got.Degraded != want.Degraded || !errors.Is(got.StoreErr, errDown) != !errors.Is(want.StoreErr, errDown) {
		t.Errorf("%s: overall %+v %v %v, want %+v %v %v", what, got.Overall, got.Degraded, got.StoreErr, want.Overall, want.Degraded, want.StoreErr)
	}
	if len(got.Descriptors) != len(want.Descriptors) || len(got.Limits) != len(want.Limits) {
		t.Fatalf("%s: %d descriptors and %d limits, want %d and %d", what, len(got.Descriptors), len(got.Limits), len(want.Descriptors), len(want.Limits))
	}
	for i := range got.Descriptors {
		g, w := got.Descriptors[i], want.Descriptors[i]
		if (g.Limit == nil) != (w.Limit == nil) || g.Limit != nil && !reflect.DeepEqual(*g.Limit, *w.Limit) {
			t.Errorf("%s: descriptor %d limit %+v, want %+v", what, i, g.Limit, w.Limit)
		}
		g.Limit, w.Limit, g.Rule, w.Rule = nil, nil, nil, nil
		if g != w {
			t.Errorf("%s: descriptor %d %+v, want %+v", what, i, g, w)
		}
	}
	for i := range got.Limits {
		g, w := got.Limits[i], want.Limits[i]
		if !reflect.DeepEqual(*g.Limit, *w.Limit) || g.Decision != w.Decision || g.Cost != w.Cost || g.Descriptor != w.Descriptor {
			t.Errorf("%s: limit %d %+v %+v, want %+v %+v", what, i, g, *g.Limit, w, *w.Limit)
		}
	}
}

// What DecideDegraded does not answer by a policy.
func TestDecideDegradedErrors(t *testing.T) {
	// Without the domain capacity, which every request of the domain
	// meets, so that a request can match no limit.
	noCapacity := strings.Replace(degradedRules, "capacity: {unit: minute, requests_per_unit: 100}\n", "", 1)
	e := newFailEnv(t, "failure_policy: local\n"+noCapacity)
	ctx := context.Background()
	r := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{desc("user", "a")}}
	var o outcome

	if err := e.dec.DecideDegraded(ctx, r, &o, nil); err == nil {
		t.Error("a nil cause passed")
	}
	// An invalid request is invalid, whatever failed.
	for _, bad := range []*rlsv3.RateLimitRequest{
		nil,
		{Descriptors: []*rlv3.RateLimitDescriptor{desc("user", "a")}},
		{Domain: "api"},
		{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{nil}},
	} {
		if err := e.dec.DecideDegraded(ctx, bad, &o, errDown); !errors.Is(err, sluice.ErrInvalid) || o.Response != nil {
			t.Errorf("request %v: %v, response %v", bad, err, o.Response)
		}
	}
	// The local policy without a local limiter: the cause, explained.
	if err := e.dec.DecideDegraded(ctx, r, &o, errDown); !errors.Is(err, errDown) || o.Response != nil || o.Degraded != rules.FailDefault {
		t.Errorf("local without a limiter: %v, outcome %+v", err, o)
	}
	// The caller's context ended: the cause.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := e.dec.DecideDegraded(cctx, r, &o, errDown); !errors.Is(err, errDown) || o.Response != nil {
		t.Errorf("canceled: %v", err)
	}
	// A cause that says the request is invalid is no failure to answer.
	inv := fmt.Errorf("%w: refused", sluice.ErrInvalid)
	if err := e.dec.DecideDegraded(ctx, r, &o, inv); !errors.Is(err, sluice.ErrInvalid) {
		t.Errorf("invalid cause: %v", err)
	}
	// Nothing to limit needs no store: OK, not degraded.
	for _, r := range []*rlsv3.RateLimitRequest{
		{Domain: "unknown", Descriptors: []*rlv3.RateLimitDescriptor{desc("user", "a")}},
		{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{desc("free", "a"), desc("none", "b")}},
	} {
		if err := e.dec.DecideDegraded(ctx, r, &o, errDown); err != nil {
			t.Errorf("%s: %v", r.Domain, err)
		} else if codes(&o) != "OK:"+strings.Repeat(" OK", len(r.Descriptors)) || o.Degraded != rules.FailDefault || o.StoreErr != nil {
			t.Errorf("%s: %s %v", r.Domain, codes(&o), o.Degraded)
		}
	}
}

// A request the remote cannot answer, answered by the failure policy:
// the response (one allocation with its status) and the counter keys, as
// a decision of the store's.
func TestDecideDegradedAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	e := newFailEnv(t, degradedRules)
	core, err := decide.New(decide.Config{Limiter: e.dec.Limiter(), Rules: e.dec.Rules(), Remote: failingRemote{errDown},
		Failover: decide.Failover{Default: rules.FailClosed}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{desc("user", "a")}}
	var r decide.Request
	var o decide.Outcome
	if n := testing.AllocsPerRun(100, func() {
		if err := rls.Request(req, &r); err != nil {
			t.Fatal(err)
		}
		if err := core.Decide(ctx, &r, &o); err != nil || o.Degraded != rules.FailClosed {
			t.Fatal(err, o.Degraded)
		}
		rls.Response(&o, false)
	}); n > 2 {
		t.Errorf("%v allocations per request, want at most 2", n)
	}
}
