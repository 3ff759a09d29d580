package rls_test

import (
	"context"
	"errors"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/edges/rls"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

func newDecider(t *testing.T, yaml string) *decider {
	t.Helper()
	now := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	store := memstore.New(memstore.Config{Now: func() time.Time { return now }, SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	var cfg *rules.Config
	if yaml != "" {
		cfg = rulestest.Config(t, yaml)
	}
	return newRLSDecider(sluice.NewLimiter(store), cfg)
}

func desc(key, value string) *rlv3.RateLimitDescriptor {
	return &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}
}

func TestNoRules(t *testing.T) {
	dec := newDecider(t, "")
	r := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{desc("user", "a")}}
	if _, err := dec.Decide(context.Background(), r); !errors.Is(err, decide.ErrNoRules) {
		t.Errorf("Decide: %v", err)
	}
	if err := dec.Check(r); !errors.Is(err, decide.ErrNoRules) {
		t.Errorf("Check: %v", err)
	}
	// A malformed request is invalid whether or not rules are loaded.
	if err := dec.Check(&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{{}}}); err == nil {
		t.Error("Check of a descriptor without entries passed")
	}
}

func TestOutcome(t *testing.T) {
	dec := newDecider(t, `
domain: api
capacity: {unit: second, requests_per_unit: 100}
descriptors:
  - key: post
    rate_limits:
      - {unit: second, requests_per_unit: 1}
      - {period: 90s, requests_per_unit: 5}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
`)
	ctx := context.Background()
	user := desc("user", "a")
	user.HitsAddend = wrapperspb.UInt64(3)
	r := &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 2, Descriptors: []*rlv3.RateLimitDescriptor{desc("post", "x"), desc("none", "1"), user}}

	var o outcome
	if err := dec.DecideInto(ctx, r, &o); err != nil {
		t.Fatal(err)
	}
	if len(o.Descriptors) != 3 || len(o.Limits) != 4 {
		t.Fatalf("%d descriptors, %d limits", len(o.Descriptors), len(o.Limits))
	}
	for i, want := range []int{0, 0, 2, -1} {
		if o.Limits[i].Descriptor != want {
			t.Errorf("limit %d belongs to %d, want %d", i, o.Limits[i].Descriptor, want)
		}
	}
	for i, want := range []int64{2, 2, 3} {
		if o.Descriptors[i].Cost != want {
			t.Errorf("descriptor %d cost %d, want %d", i, o.Descriptors[i].Cost, want)
		}
	}
	// Two hits of a per-second limit of one: denied, nothing consumed.
	if o.Overall.Allowed || o.Overall.Index != 0 || o.Response.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("overall %+v, code %v", o.Overall, o.Response.OverallCode)
	}
	if o.Descriptors[1].Limited || o.Response.Statuses[1].CurrentLimit != nil {
		t.Errorf("unmatched descriptor %+v", o.Descriptors[1])
	}
	// The user limit would admit the request but consumed nothing.
	if st := o.Response.Statuses[2]; st.Code != rlsv3.RateLimitResponse_OK || st.LimitRemaining != 10 {
		t.Errorf("user status %v", st)
	}

	// Reused for a request of one descriptor: the storage stays, the
	// contents are the new request's.
	r = &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{desc("post", "y")}}
	prev := &o.Limits[0]
	if err := dec.DecideInto(ctx, r, &o); err != nil {
		t.Fatal(err)
	}
	if len(o.Descriptors) != 1 || len(o.Limits) != 3 || &o.Limits[0] != prev || !o.Overall.Allowed {
		t.Fatalf("reused outcome %+v", o)
	}
	// The 90 s limit is spelled 90 SECOND; the deciding limit is the
	// per-second one with nothing left.
	st := o.Response.Statuses[0]
	if st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND || st.CurrentLimit.GetRequestsPerUnit() != 1 || st.LimitRemaining != 0 {
		t.Errorf("post status %v", st)
	}
	if got := o.Limits[1].Limit.Period; got != 90*time.Second {
		t.Errorf("second limit period %v", got)
	}
	r.Descriptors[0].Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 4, Unit: 1, UnitMultiplier: wrapperspb.UInt32(90)}
	if err := dec.DecideInto(ctx, r, &o); err != nil {
		t.Fatal(err)
	}
	if cl := o.Response.Statuses[0].CurrentLimit; cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND || cl.GetUnitMultiplier().GetValue() != 90 {
		t.Errorf("override limit %v", cl)
	}

	// An error leaves the outcome empty.
	if err := dec.DecideInto(ctx, &rlsv3.RateLimitRequest{Domain: "api"}, &o); !errors.Is(err, sluice.ErrInvalid) {
		t.Fatalf("no descriptors: %v", err)
	}
	if o.Response != nil || len(o.Descriptors) != 0 || len(o.Limits) != 0 {
		t.Errorf("outcome after an error %+v", o)
	}
}

// A decision through the codec and the door allocates only the response
// and the counter keys: one descriptor, the response with its status; two,
// the counter keys and the response's three (the response, its statuses
// and their blocks).
func TestCodecAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	dec := newDecider(t, `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000000}
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 1000000}
`)
	ctx := context.Background()
	for _, tc := range []struct {
		descs []*rlv3.RateLimitDescriptor
		most  float64
	}{
		{[]*rlv3.RateLimitDescriptor{desc("user", "a")}, 2},
		{[]*rlv3.RateLimitDescriptor{desc("user", "a"), desc("ip", "1")}, 4},
	} {
		req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: tc.descs}
		var r decide.Request
		var o decide.Outcome
		if n := testing.AllocsPerRun(100, func() {
			if err := rls.Request(req, &r); err != nil {
				t.Fatal(err)
			}
			if err := dec.core.Decide(ctx, &r, &o); err != nil {
				t.Fatal(err)
			}
			rls.Response(&o, false)
		}); n > tc.most {
			t.Errorf("%d descriptors: %v allocations per request, want at most %v", len(tc.descs), n, tc.most)
		}
	}
}
