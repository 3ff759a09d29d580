package rls_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

// flakyStore is a memstore that fails on demand. What a Redis outage looks
// like from the store (a refused connection, a deadline, the circuit
// breaker open) is tested end to end with the Redis store; the Decider only
// sees an error from Take, which this store returns while it is down.
// It deliberately does not embed the memstore, whose TakeOne would bypass
// the switch.
type flakyStore struct {
	inner sluice.Store
	mu    sync.Mutex
	err   error
	takes int
}

var errDown = errors.New("dial tcp 127.0.0.1:6379: connection refused")

func (s *flakyStore) Take(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	s.mu.Lock()
	err := s.err
	s.takes++
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return s.inner.Take(ctx, hits, out)
}

func (s *flakyStore) fail(err error) {
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
}

// failEnv is a Decider over a flaky store, with a local memstore for the
// local policy, on one fixed clock.
type failEnv struct {
	dec   *decider
	store *flakyStore
	local *sluice.Limiter
	now   time.Time
}

func newFailEnv(t testing.TB, yaml string) *failEnv {
	t.Helper()
	e := &failEnv{now: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)}
	clock := func() time.Time { return e.now }
	main := memstore.New(memstore.Config{Now: clock, SweepInterval: -1})
	local := memstore.New(memstore.Config{Now: clock, SweepInterval: -1})
	t.Cleanup(func() { main.Close(); local.Close() })
	e.store = &flakyStore{inner: main}
	e.local = sluice.NewLimiter(local)
	e.dec = newRLSDecider(sluice.NewLimiter(e.store), rulestest.Config(t, yaml))
	return e
}

func (e *failEnv) setFailover(t *testing.T, f decide.Failover) {
	t.Helper()
	if err := e.dec.SetFailover(f); err != nil {
		t.Fatal(err)
	}
}

func (e *failEnv) decide(t *testing.T, descs ...*rlv3.RateLimitDescriptor) *outcome {
	t.Helper()
	o, err := e.dec.Decide(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: descs})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// codes spells the overall and per-descriptor codes: "OVER_LIMIT: OK OVER_LIMIT".
func codes(o *outcome) string {
	s := o.Response.OverallCode.String() + ":"
	for _, st := range o.Response.Statuses {
		s += " " + st.Code.String()
	}
	return s
}

const failRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: fast
    rate_limit: {period: 100ms, requests_per_unit: 5}
  - key: dry
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 10}
`

func TestFailOpen(t *testing.T) {
	e := newFailEnv(t, failRules)
	if f := e.dec.Failover(); f.Default != rules.FailOpen || f.Nodes != 1 {
		t.Errorf("default failover %+v", f)
	}
	e.store.fail(errDown)
	o := e.decide(t, desc("user", "a"), desc("none", "x"))
	if o.Degraded != rules.FailOpen || !errors.Is(o.StoreErr, errDown) {
		t.Fatalf("degraded %v, store error %v", o.Degraded, o.StoreErr)
	}
	if got := codes(o); got != "OK: OK OK" || !o.Overall.Allowed {
		t.Errorf("codes %s, overall %+v", got, o.Overall)
	}
	// The match is kept, so that stats count the hits.
	if do := o.Descriptors[0]; do.Status != rules.Limited || do.StatKey != "api.user" || !do.Limited || do.Over || do.Cost != 1 || !do.Decision.Allowed {
		t.Errorf("descriptor %+v", do)
	}
	// The response says nothing it cannot know.
	if st := o.Response.Statuses[0]; st.CurrentLimit != nil || st.LimitRemaining != 0 || st.DurationUntilReset != nil {
		t.Errorf("status %v", st)
	}
	// Recovery: the store answers again, with nothing consumed meanwhile.
	e.store.fail(nil)
	o = e.decide(t, desc("user", "a"))
	if o.Degraded != rules.FailDefault || o.StoreErr != nil || o.Response.Statuses[0].LimitRemaining != 9 {
		t.Errorf("after recovery: degraded %v, %v", o.Degraded, o.Response.Statuses[0])
	}
}

func TestFailClosed(t *testing.T) {
	e := newFailEnv(t, failRules)
	e.setFailover(t, decide.Failover{Default: rules.FailClosed})
	e.store.fail(errDown)
	o := e.decide(t, desc("user", "a"), desc("none", "x"), desc("fast", "b"))
	if o.Degraded != rules.FailClosed {
		t.Fatalf("degraded %v", o.Degraded)
	}
	if got := codes(o); got != "OVER_LIMIT: OVER_LIMIT OK OVER_LIMIT" {
		t.Errorf("codes %s", got)
	}
	user, fast := o.Response.Statuses[0], o.Response.Statuses[2]
	if user.GetDurationUntilReset().AsDuration() != time.Second || user.LimitRemaining != 0 || user.GetCurrentLimit().GetRequestsPerUnit() != 10 {
		t.Errorf("user status %v", user)
	}
	// Never longer than the limit's period, in whole seconds rounded up
	// as Envoy tells resets: 1 s.
	if fast.GetDurationUntilReset().AsDuration() != time.Second {
		t.Errorf("fast status %v", fast)
	}
	// In the exact dialect, the period itself.
	exact := &outcome{Exact: true}
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{desc("fast", "b")}}
	if err := e.dec.DecideInto(context.Background(), req, exact); err != nil {
		t.Fatal(err)
	}
	if d := exact.Response.Statuses[0].GetDurationUntilReset().AsDuration(); d != 100*time.Millisecond {
		t.Errorf("fast status, exact dialect: reset %v, want 100ms", d)
	}
	if o.Overall.Allowed || o.Overall.RetryAfter != time.Second {
		t.Errorf("overall %+v", o.Overall)
	}
	// A shadow-mode limit still never denies.
	o = e.decide(t, desc("dry", "c"))
	if got := codes(o); got != "OK: OK" || !o.Descriptors[0].ShadowOver || !o.Overall.Shadow {
		t.Errorf("shadow: %s %+v", got, o.Descriptors[0])
	}
	e.store.fail(nil)
	if o := e.decide(t, desc("user", "a")); codes(o) != "OK: OK" || o.Degraded != rules.FailDefault {
		t.Errorf("after recovery: %s %v", codes(o), o.Degraded)
	}
}

// The domain's failure_policy wins over the default.
func TestFailurePolicyPerDomain(t *testing.T) {
	for _, tc := range []struct {
		domain, def rules.FailurePolicy
		want        rules.FailurePolicy
		code        string
	}{
		{rules.FailDefault, rules.FailDefault, rules.FailOpen, "OK: OK"},
		{rules.FailDefault, rules.FailClosed, rules.FailClosed, "OVER_LIMIT: OVER_LIMIT"},
		{rules.FailOpen, rules.FailClosed, rules.FailOpen, "OK: OK"},
		{rules.FailClosed, rules.FailOpen, rules.FailClosed, "OVER_LIMIT: OVER_LIMIT"},
		{rules.FailLocal, rules.FailClosed, rules.FailLocal, "OK: OK"},
		{rules.FailOpen, rules.FailLocal, rules.FailOpen, "OK: OK"},
	} {
		yaml := failRules
		if tc.domain != rules.FailDefault {
			yaml = "failure_policy: " + tc.domain.String() + "\n" + yaml
		}
		e := newFailEnv(t, yaml)
		e.setFailover(t, decide.Failover{Default: tc.def, Local: e.local})
		e.store.fail(errDown)
		o := e.decide(t, desc("user", "a"))
		if o.Degraded != tc.want || codes(o) != tc.code {
			t.Errorf("domain %v, default %v: %v %s, want %v %s", tc.domain, tc.def, o.Degraded, codes(o), tc.want, tc.code)
		}
	}
}

func TestFailLocal(t *testing.T) {
	e := newFailEnv(t, `
domain: api
failure_policy: local
capacity: {unit: minute, requests_per_unit: 100}
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: one
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 60, algorithm: token_bucket, burst: 7}
  - key: post
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: hour, requests_per_unit: 1000}
`)
	e.setFailover(t, decide.Failover{Local: e.local, Nodes: 3})
	// Two requests through the store before it fails.
	e.decide(t, desc("user", "a"))
	e.decide(t, desc("user", "a"))
	e.store.fail(errDown)

	// floor(10/3) = 3 admitted on the node: each request weighs 3 against
	// the limit of 10, on the node's own counters.
	for i := range 5 {
		o := e.decide(t, desc("user", "a"))
		if o.Degraded != rules.FailLocal || !errors.Is(o.StoreErr, errDown) {
			t.Fatalf("request %d: degraded %v (%v)", i, o.Degraded, o.StoreErr)
		}
		want, remaining := "OK: OK", uint32(2-i)
		if i >= 3 {
			want, remaining = "OVER_LIMIT: OVER_LIMIT", 0
		}
		if got := codes(o); got != want {
			t.Errorf("request %d: %s, want %s", i, got, want)
		}
		// The response reports the configured limit, and what the node
		// still admits.
		st := o.Response.Statuses[0]
		if st.GetCurrentLimit().GetRequestsPerUnit() != 10 || st.LimitRemaining != remaining || o.Descriptors[0].Decision.Limit != 10 || o.Descriptors[0].StatKey != "api.user" {
			t.Errorf("request %d: status %v, decision %+v", i, st, o.Descriptors[0].Decision)
		}
		// The outcome names the configured limits, the domain capacity's
		// too.
		if o.Limits[0].Limit.Rate != 10 || o.Limits[1].Limit.Rate != 100 || o.Limits[1].Descriptor != -1 {
			t.Errorf("request %d: limits %+v %+v", i, o.Limits[0].Limit, o.Limits[1].Limit)
		}
	}
	// A limit of 1 admits one request a node.
	for i, want := range []string{"OK: OK", "OVER_LIMIT: OVER_LIMIT"} {
		if got := codes(e.decide(t, desc("one", "a"))); got != want {
			t.Errorf("limit of one, request %d: %s, want %s", i, got, want)
		}
	}
	// A bucket of 7: floor(7/3) = 2.
	for i := range 4 {
		o := e.decide(t, desc("bucket", "a"))
		if want := i < 2; o.Overall.Allowed != want || o.Overall.Limit != 7 {
			t.Errorf("bucket request %d: %+v", i, o.Overall)
		}
	}
	// Several limits of a descriptor stay all-or-nothing: a limit of 2 a
	// second admits one request a node.
	if got := codes(e.decide(t, desc("post", "a"))); got != "OK: OK" {
		t.Errorf("post: %s", got)
	}
	o := e.decide(t, desc("post", "a"))
	if codes(o) != "OVER_LIMIT: OVER_LIMIT" || o.Limits[1].Decision.Remaining != 997/3 {
		t.Errorf("post again: %s, hourly %+v", codes(o), o.Limits[1].Decision)
	}

	// Recovery: the store's own count again, once it has the 3 the node
	// admitted meanwhile (written back before it decides the key): 2 + 3
	// + this one of 10 used.
	e.store.fail(nil)
	o = e.decide(t, desc("user", "a"))
	if o.Degraded != rules.FailDefault || o.Response.Statuses[0].LimitRemaining != 4 || o.Response.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() != 10 {
		t.Errorf("after recovery: %v %v", o.Degraded, o.Response.Statuses[0])
	}
}

// The local policy's keys are its own: a local limiter over the very store
// that failed (never do this) still counts apart from the store's keys.
func TestFailLocalKeysAreDistinct(t *testing.T) {
	e := newFailEnv(t, failRules)
	e.setFailover(t, decide.Failover{Default: rules.FailLocal, Local: sluice.NewLimiter(e.store.inner)})
	for range 10 {
		e.decide(t, desc("user", "a"))
	}
	e.store.fail(errDown)
	if o := e.decide(t, desc("user", "a")); codes(o) != "OK: OK" || o.Response.Statuses[0].LimitRemaining != 9 {
		t.Errorf("local decision shares the store's key: %s %v", codes(o), o.Response.Statuses[0])
	}
}

// A counter key of the largest size still gets a local key that fits.
func TestFailLocalLongKey(t *testing.T) {
	e := newFailEnv(t, `
domain: api
descriptors:
  - key: a
    descriptors:
      - key: b
        descriptors:
          - key: c
            descriptors:
              - key: d
                rate_limit: {unit: minute, requests_per_unit: 2}
`)
	e.setFailover(t, decide.Failover{Default: rules.FailLocal, Local: e.local})
	long := func(n int) []*rlv3.RateLimitDescriptor {
		rd := &rlv3.RateLimitDescriptor{}
		for i, k := range []string{"a", "b", "c", "d"} {
			v := strings.Repeat(k, 1000)
			if i == 3 {
				v = strings.Repeat(k, n)
			}
			rd.Entries = append(rd.Entries, &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		return []*rlv3.RateLimitDescriptor{rd}
	}
	// Find the value length that makes the key exactly MaxKeyLen bytes.
	n := -1
	var p rules.Plan
	for i := 0; i <= rules.MaxEntryLen; i++ {
		ds := []rules.Descriptor{{Cost: 1}}
		for _, en := range long(i)[0].Entries {
			ds[0].Entries = append(ds[0].Entries, rules.Entry{Key: en.Key, Value: en.Value})
		}
		if err := e.dec.Rules().Plan("api", ds, &p); err == nil && len(p.Hits[0].Key) == sluice.MaxKeyLen {
			n = i
			break
		}
	}
	if n < 0 {
		t.Fatal("no value length gives a key of MaxKeyLen bytes")
	}
	e.store.fail(errDown)
	for i, want := range []string{"OK: OK", "OK: OK", "OVER_LIMIT: OVER_LIMIT"} {
		o, err := e.dec.Decide(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: long(n)})
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if codes(o) != want || o.Degraded != rules.FailLocal {
			t.Errorf("request %d: %s %v, want %s", i, codes(o), o.Degraded, want)
		}
	}
	// A key one byte shorter is another key.
	if o, err := e.dec.Decide(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: long(n - 1)}); err != nil || codes(o) != "OK: OK" {
		t.Errorf("shorter key: %v %v", o, err)
	}
}

// What no policy answers: the caller's own context, an invalid request,
// the local policy without a local limiter.
func TestFailErrors(t *testing.T) {
	e := newFailEnv(t, "failure_policy: local\n"+failRules)
	r := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{desc("user", "a")}}

	// The caller gave up: its error, whatever the store did.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.dec.Decide(ctx, r); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled, store up: %v", err)
	}
	e.store.fail(errDown)
	var o outcome
	if err := e.dec.DecideInto(ctx, r, &o); !errors.Is(err, errDown) || o.Response != nil || o.Degraded != rules.FailDefault {
		t.Errorf("canceled, store down: %v, outcome %+v", err, o)
	}
	dctx, dcancel := context.WithDeadline(context.Background(), e.now.Add(-time.Hour))
	defer dcancel()
	if _, err := e.dec.Decide(dctx, r); !errors.Is(err, errDown) {
		t.Errorf("deadline passed, store down: %v", err)
	}

	// Invalid input is never masked.
	e.store.fail(fmt.Errorf("%w: the store refused the key", sluice.ErrInvalid))
	if _, err := e.dec.Decide(context.Background(), r); !errors.Is(err, sluice.ErrInvalid) {
		t.Errorf("invalid: %v", err)
	}

	// The domain asks for local, and the node has no local limiter.
	e.store.fail(errDown)
	if _, err := e.dec.Decide(context.Background(), r); !errors.Is(err, errDown) || !strings.Contains(err.Error(), "no local limiter") {
		t.Errorf("local without a limiter: %v", err)
	}

	// The local limiter fails too (the caller's context ends while it
	// decides): the error says both.
	ctx, cancel = context.WithCancel(context.Background())
	e.setFailover(t, decide.Failover{Local: sluice.NewLimiter(cancelingStore{cancel: cancel})})
	if _, err := e.dec.Decide(ctx, r); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("local limiter failing: %v", err)
	}
}

// cancelingStore cancels the caller's context and reports it.
type cancelingStore struct{ cancel context.CancelFunc }

func (s cancelingStore) Take(ctx context.Context, _ []sluice.Hit, _ []sluice.Decision) error {
	s.cancel()
	return ctx.Err()
}

func TestSetFailover(t *testing.T) {
	e := newFailEnv(t, failRules)
	for _, f := range []decide.Failover{
		{Default: rules.FailLocal},
		{Nodes: -1},
		{Default: rules.FailurePolicy(9)},
	} {
		if err := e.dec.SetFailover(f); err == nil {
			t.Errorf("SetFailover(%+v) passed", f)
		}
	}
	e.setFailover(t, decide.Failover{Default: rules.FailLocal, Local: e.local, Nodes: 4})
	if f := e.dec.Failover(); f.Default != rules.FailLocal || f.Nodes != 4 || f.Local != e.local {
		t.Errorf("Failover() = %+v", f)
	}
	e.setFailover(t, decide.Failover{})
	if f := e.dec.Failover(); f.Default != rules.FailOpen || f.Nodes != 1 {
		t.Errorf("zero Failover gives %+v", f)
	}
}

// Rules swapped during an outage: the local policy follows the new limits.
func TestFailLocalReload(t *testing.T) {
	e := newFailEnv(t, failRules)
	e.setFailover(t, decide.Failover{Default: rules.FailLocal, Local: e.local, Nodes: 2})
	e.store.fail(errDown)
	if o := e.decide(t, desc("user", "a")); o.Overall.Limit != 10 || o.Overall.Remaining != 4 {
		t.Fatalf("%+v, want limit 10 and 4 remaining", o.Overall)
	}
	e.dec.SetRules(rulestest.Config(t, strings.Replace(failRules, "requests_per_unit: 10}", "requests_per_unit: 30}", 1)))
	if o := e.decide(t, desc("user", "a")); o.Overall.Limit != 30 || o.Overall.Remaining != 14 {
		t.Errorf("after the reload: %+v, want limit 30 and 14 remaining", o.Overall)
	}
}

func BenchmarkDecideFailover(b *testing.B) {
	ctx := context.Background()
	r := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{desc("user", "a")}}
	for _, tc := range []struct {
		name   string
		policy rules.FailurePolicy
		down   bool
	}{
		{"store", rules.FailOpen, false},
		{"fail_open", rules.FailOpen, true},
		{"fail_closed", rules.FailClosed, true},
		{"local", rules.FailLocal, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			e := newFailEnv(b, `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
`)
			if err := e.dec.SetFailover(decide.Failover{Default: tc.policy, Local: e.local, Nodes: 3}); err != nil {
				b.Fatal(err)
			}
			if tc.down {
				e.store.fail(errDown)
			}
			var o outcome
			b.ReportAllocs()
			for b.Loop() {
				if err := e.dec.DecideInto(ctx, r, &o); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
