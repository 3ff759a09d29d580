package decide_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

// downStore is a store that fails while down is set, and otherwise passes
// every call, one by one ones included, to its memstore. Failing from the
// inside is tested end to end with Redis; the Decider sees only an error.
type downStore struct {
	mu        sync.Mutex
	inner     *memstore.Store // mem reads it; forget replaces it
	fresh     func() *memstore.Store
	down      atomic.Bool
	failEach  atomic.Bool // fail the calls decided one by one (the write-back's)
	eachCalls atomic.Int64
	gate      chan struct{} // when set, the calls decided one by one wait for it to close
}

var errStoreDown = errors.New("connection refused")

func (s *downStore) Take(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	return s.call(func() error { return s.mem().Take(ctx, hits, out) })
}

func (s *downStore) TakeEach(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	s.eachCalls.Add(1)
	if s.gate != nil {
		<-s.gate
	}
	if s.failEach.Load() {
		return errStoreDown
	}
	return s.call(func() error { return s.mem().TakeEach(ctx, hits, out) })
}

func (s *downStore) Permits(ctx context.Context, hits []sluice.Hit, out []sluice.Decision, release bool) error {
	return s.call(func() error { return s.mem().Permits(ctx, hits, out, release) })
}

// mem is the store's memstore.
func (s *downStore) mem() *memstore.Store {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inner
}

// forget replaces the memstore with an empty one, as a Redis restarted
// without persistence.
func (s *downStore) forget() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inner = s.fresh()
}

func (s *downStore) call(f func() error) error {
	if s.down.Load() {
		return errStoreDown
	}
	return f()
}

type localEnv struct {
	d     *decide.Decider
	store *downStore
	nodes atomic.Int64
	now   atomic.Int64 // Unix ns: both stores' clock
}

// newLocalEnv is a Decider of one domain "api" over a store that can go
// down, whose local failure policy learns the number of nodes from
// e.nodes, as a node learns it from the Redis store's registry. budget,
// when not nil, is the policy's Failover.Budget.
func newLocalEnv(t *testing.T, yaml string, budget ...func(key string, l *sluice.Limit) (int64, bool)) *localEnv {
	t.Helper()
	return newLocalEnvWith(t, yaml, func(f *decide.Failover, _ *localEnv) {
		if len(budget) > 0 {
			f.Budget = budget[0]
		}
	})
}

// newLocalEnvWith is newLocalEnv with the failure policy's Failover set
// by with.
func newLocalEnvWith(t *testing.T, yaml string, with func(*decide.Failover, *localEnv)) *localEnv {
	t.Helper()
	e := &localEnv{}
	e.now.Store(time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, e.now.Load()) }
	mem := memstore.New(memstore.Config{Now: clock, SweepInterval: -1})
	local := memstore.New(memstore.Config{Now: clock, SweepInterval: -1})
	t.Cleanup(func() { mem.Close(); local.Close() })
	dom, err := rules.Parse("api.yaml", []byte("domain: api\nfailure_policy: local\n"+yaml))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rules.NewConfig(dom)
	if err != nil {
		t.Fatal(err)
	}
	e.store = &downStore{inner: mem, fresh: func() *memstore.Store {
		m := memstore.New(memstore.Config{Now: clock, SweepInterval: -1})
		t.Cleanup(func() { m.Close() })
		return m
	}}
	e.nodes.Store(1)
	f := decide.Failover{Default: rules.FailLocal, Local: sluice.NewLimiter(local), NodeCount: func() int { return int(e.nodes.Load()) }}
	with(&f, e)
	e.d, err = decide.New(decide.Config{Limiter: sluice.NewLimiter(e.store), Rules: cfg, Failover: f})
	if err != nil {
		t.Fatal(err)
	}
	decide.SetWriteBackClock(e.d, e.now.Load)
	return e
}

func (e *localEnv) decide(t *testing.T, key, value string) *decide.Outcome {
	t.Helper()
	var o decide.Outcome
	err := e.d.Decide(context.Background(), &decide.Request{Domain: "api", Descriptors: []rules.Descriptor{{Entries: []rules.Entry{{Key: key, Value: value}}, Cost: 1}}}, &o)
	if err != nil {
		t.Fatal(err)
	}
	return &o
}

// admit decides key=value until a denial, and returns how many were
// admitted, all by the policy.
func (e *localEnv) admit(t *testing.T, key, value string) int {
	t.Helper()
	for n := 0; ; n++ {
		o := e.decide(t, key, value)
		if o.Degraded != rules.FailLocal {
			t.Fatalf("request %d decided by %v, not the local policy", n, o.Degraded)
		}
		if !o.Overall.Allowed {
			return n
		}
		if n > 10000 {
			t.Fatal("never denied")
		}
	}
}

// TestLocalPolicyNodesChange: what a node admitted under the local policy
// stays spent when the number of nodes it learns changes. During an outage
// the registry's entries expire, and when the store comes back the first
// nodes to register see themselves alone while their breakers are still
// open; dividing the limit by the new count gave them fresh counters at a
// larger share, and the cluster admitted about N times the limit.
func TestLocalPolicyNodesChange(t *testing.T) {
	for _, alg := range []string{"fixed_window", "sliding_window", "sliding_log", "token_bucket", "leaky_bucket", "gcra"} {
		t.Run(alg, func(t *testing.T) {
			e := newLocalEnv(t, "descriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 30, algorithm: "+alg+"}\n")
			e.nodes.Store(3)
			e.store.down.Store(true)
			if n := e.admit(t, "k", "a"); n != 10 {
				t.Fatalf("3 nodes: admitted %d of 30, want 10", n)
			}
			for _, nodes := range []int64{1, 2, 3, 1} {
				e.nodes.Store(nodes)
				if n := e.admit(t, "k", "a"); n != 0 {
					t.Fatalf("the node now sees %d nodes: admitted %d more after its share of 10", nodes, n)
				}
			}
			// A node that saw one node and spent 12, then learns of 3
			// (the others registering again), has 18 left, a third of
			// which is its share.
			e.nodes.Store(1)
			for range 12 {
				e.decide(t, "k", "b")
			}
			e.nodes.Store(3)
			if n := e.admit(t, "k", "b"); n != 6 {
				t.Errorf("12 spent alone, then 3 nodes: admitted %d more, want 6", n)
			}
		})
	}
}

// TestLocalPolicyShares: each node admits max(1, floor(x/N)) requests of
// cost 1; a limit under N admits one a node, a zero limit none.
// Decisions report the configured limit and what the node still admits.
func TestLocalPolicyShares(t *testing.T) {
	e := newLocalEnv(t, `
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: one
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: zero
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 60, algorithm: token_bucket, burst: 7}
`)
	e.nodes.Store(3)
	e.store.down.Store(true)
	o := e.decide(t, "user", "a")
	if d := o.Overall; !d.Allowed || d.Limit != 10 || d.Remaining != 2 || o.Limits[0].Limit.Rate != 10 {
		t.Errorf("first local decision: %+v, limit %+v", d, o.Limits[0].Limit)
	}
	for _, c := range []struct {
		key  string
		want int
	}{{"user", 2}, {"one", 1}, {"zero", 0}, {"bucket", 2}} {
		if n := e.admit(t, c.key, "b"); n != c.want+boolInt(c.key == "user") {
			t.Errorf("%s: admitted %d, want %d", c.key, n, c.want+boolInt(c.key == "user"))
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestLocalPolicyWriteBack: what the local policy admitted is charged to
// the store when it answers again, so that the store does not hand out
// that quota a second time, even past the limit; a write-back that the
// store fails is kept for the next.
func TestLocalPolicyWriteBack(t *testing.T) {
	e := newLocalEnv(t, `
descriptors:
  - key: bucket
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: token_bucket}
  - key: log
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: sliding_log}
`)
	e.nodes.Store(2)
	for range 10 {
		e.decide(t, "bucket", "a")
		e.decide(t, "log", "a")
	}
	for range 95 {
		e.decide(t, "bucket", "full")
	}
	e.store.down.Store(true)
	for _, v := range []string{"a", "full"} {
		if n := e.admit(t, "bucket", v); n != 50 {
			t.Fatalf("bucket %s: the local policy admitted %d, want 50", v, n)
		}
	}
	if n := e.admit(t, "log", "a"); n != 50 {
		t.Fatalf("log: the local policy admitted %d, want 50", n)
	}

	// The store answers again, but fails the write-back: a key the
	// policy admitted hits of is not decided by the store until it has
	// them (the policy answers it); another key is, and starts the
	// write-back of the others.
	e.store.failEach.Store(true)
	e.store.down.Store(false)
	if o := e.decide(t, "bucket", "a"); o.Degraded != rules.FailLocal {
		t.Fatalf("store back, a write-back failing: bucket a decided by %v, not the local policy", o.Degraded)
	}
	if o := e.decide(t, "bucket", "other"); o.Degraded != rules.FailDefault || o.Overall.Remaining != 99 {
		t.Fatalf("store back: %v %+v", o.Degraded, o.Overall)
	}
	waitFor(t, "a write-back tried", func() bool { return e.store.eachCalls.Load() > 1 })
	time.Sleep(100 * time.Millisecond)
	if r := e.storePeek(t, "bucket", "a"); r != 90 {
		t.Fatalf("a failed write-back changed the store: %d remaining, want 90", r)
	}

	// The next request on the key writes back what was kept first.
	e.store.failEach.Store(false)
	waitFor(t, "the write-back", func() bool { return e.peek(t, "bucket", "a") == 90-50 })
	if r := e.peek(t, "log", "a"); r != 100-10-50 {
		t.Errorf("log: %d remaining after the write-back, want 40", r)
	}
	// A key the store had nearly spent is charged past its limit: it
	// admits nothing until it has refilled what the outage spent.
	if o := e.decide(t, "bucket", "full"); o.Overall.Allowed || o.Overall.Remaining != 0 {
		t.Errorf("bucket full after the write-back: %+v", o.Overall)
	}
	// Written back once: nothing more is charged.
	time.Sleep(100 * time.Millisecond)
	if r := e.peek(t, "bucket", "a"); r != 40 {
		t.Errorf("bucket a: %d remaining, want 40", r)
	}
}

func (e *localEnv) peek(t *testing.T, key, value string) int64 {
	t.Helper()
	var o decide.Outcome
	err := e.d.Decide(context.Background(), &decide.Request{Domain: "api", Descriptors: []rules.Descriptor{{Entries: []rules.Entry{{Key: key, Value: value}}}}}, &o)
	if err != nil {
		t.Fatal(err)
	}
	if o.Degraded != rules.FailDefault {
		t.Fatalf("peek decided by %v", o.Degraded)
	}
	return o.Overall.Remaining
}

// storePeek is what the store has left of key=value's limit, asked of
// the store itself.
func (e *localEnv) storePeek(t *testing.T, key, value string) int64 {
	t.Helper()
	var p rules.Plan
	if err := e.d.Rules().Plan("api", []rules.Descriptor{{Entries: []rules.Entry{{Key: key, Value: value}}}}, &p); err != nil || len(p.Hits) != 1 {
		t.Fatalf("plan of %s=%s: %d hits, %v", key, value, len(p.Hits), err)
	}
	d, err := sluice.NewLimiter(e.store.mem()).AllowN(context.Background(), p.Hits[0].Key, p.Hits[0].Limit, 0)
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLocalPolicyWriteBackFirst: a store that answers again decides a
// key only once it counts what the local policy admitted of it. The
// write-back used to start after the store's first decision: that
// decision, and any other made before the write-back landed, was taken on
// a count without the outage's hits, and could admit them a second time.
func TestLocalPolicyWriteBackFirst(t *testing.T) {
	e := newLocalEnv(t, `
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 10}
`)
	for range 4 {
		e.decide(t, "k", "a")
	}
	e.store.down.Store(true)
	if n := e.admit(t, "k", "a"); n != 10 {
		t.Fatalf("the local policy admitted %d, want 10 (the limit, on one node)", n)
	}
	e.store.eachCalls.Store(0)
	e.store.down.Store(false)
	o := e.decide(t, "k", "a")
	if o.Degraded != rules.FailDefault {
		t.Fatalf("store back: decided by %v", o.Degraded)
	}
	if o.Overall.Allowed {
		t.Errorf("store back: the first request was admitted (%d remaining): the store decided it before it counted the outage's 10 hits", o.Overall.Remaining)
	}
	// Written back once: 4 + 10, and nothing more.
	time.Sleep(50 * time.Millisecond)
	if r := e.storePeek(t, "k", "a"); r != 0 {
		t.Errorf("store: %d remaining, want 0", r)
	}
	if got := e.store.eachCalls.Load(); got != 1 {
		t.Errorf("%d write-back calls, want 1", got)
	}
}

// TestLocalPolicyBudget: the arithmetic of a budget (Failover.Budget, the
// region tier's), at fixed times. The local policy admits at most what
// the budget leaves, split among the nodes; a budget that shrinks while
// the node's own hits are not written back counts them; a budget that
// grows gives nothing back that the counter holds; a window's end starts
// the next from the budget again.
func TestLocalPolicyBudget(t *testing.T) {
	var left atomic.Int64
	e := newLocalEnv(t, `
descriptors:
  - key: g
    rate_limit: {unit: minute, requests_per_unit: 300}
  - key: other
    rate_limit: {unit: minute, requests_per_unit: 300}
`, func(key string, l *sluice.Limit) (int64, bool) {
		if !strings.Contains(key, ":g0:") { // the plan's key of g=...
			return 0, false
		}
		return left.Load(), true
	})
	e.store.down.Store(true)

	// One node, 100 left: 100.
	left.Store(100)
	if n := e.admit(t, "g", "a"); n != 100 {
		t.Errorf("one node, 100 left: admitted %d, want 100", n)
	}
	// Three nodes, 90 left: a node admits 30 (each hit weighs 3).
	e.nodes.Store(3)
	left.Store(90)
	if n := e.admit(t, "g", "b"); n != 30 {
		t.Errorf("three nodes, 90 left: admitted %d, want 30", n)
	}
	// A key the budget does not bound: the node's share of the limit.
	if n := e.admit(t, "other", "a"); n != 100 {
		t.Errorf("no budget, three nodes: admitted %d, want 100", n)
	}
	// Nothing left: nothing.
	e.now.Add(int64(time.Minute))
	left.Store(0)
	if n := e.admit(t, "g", "a"); n != 0 {
		t.Errorf("nothing left: admitted %d", n)
	}

	// One node, 40 left, 10 admitted and not written back; then the
	// budget says 25 (the store counted others' hits meanwhile, not
	// these 10): 15 more, not 25.
	e.now.Add(int64(time.Minute))
	e.nodes.Store(1)
	left.Store(40)
	for range 10 {
		if o := e.decide(t, "g", "a"); !o.Overall.Allowed || o.Degraded != rules.FailLocal {
			t.Fatalf("40 left: %v %+v", o.Degraded, o.Overall)
		}
	}
	left.Store(25)
	if n := e.admit(t, "g", "a"); n != 15 {
		t.Errorf("25 left beside 10 not written back: admitted %d more, want 15", n)
	}
	// The budget grows (a grant): the counter keeps what it holds.
	left.Store(60)
	if n := e.admit(t, "g", "a"); n != 0 {
		t.Errorf("the budget grew: admitted %d more, want 0 (counters only rise)", n)
	}
	// The next window starts from the budget.
	e.now.Add(int64(time.Minute))
	left.Store(7)
	if n := e.admit(t, "g", "a"); n != 7 {
		t.Errorf("a new window, 7 left: admitted %d, want 7", n)
	}
}

// TestLocalPolicyWriteBackWaiters: requests on a key whose write-back is
// under way wait for it, and when it fails they go to the failure policy
// with its error rather than each trying in turn: on a store that takes a
// deadline to fail, n requests would otherwise wait n deadlines.
func TestLocalPolicyWriteBackWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newLocalEnv(t, `
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 10}
`)
		e.store.down.Store(true)
		e.admit(t, "k", "a")
		// The store answers again, but its write-backs hang, then fail.
		e.store.gate = make(chan struct{})
		e.store.failEach.Store(true)
		e.store.eachCalls.Store(0)
		e.store.down.Store(false)
		var wg sync.WaitGroup
		outcomes := make([]*decide.Outcome, 5)
		for i := range outcomes {
			wg.Go(func() { outcomes[i] = e.decide(t, "k", "a") })
		}
		synctest.Wait()
		close(e.store.gate)
		wg.Wait()
		if n := e.store.eachCalls.Load(); n != 1 {
			t.Errorf("%d write-back calls for 5 requests on one key, want 1", n)
		}
		for i, o := range outcomes {
			if o.Degraded != rules.FailLocal || !errors.Is(o.StoreErr, errStoreDown) {
				t.Errorf("request %d: decided by %v (%v), want the local policy after the write-back's failure", i, o.Degraded, o.StoreErr)
			}
		}
	})
}

// TestLocalPolicyWriteBackIdle: a node that gets no request after the
// store returns writes back what its policy admitted as soon as
// Failover.Health says the store is up, so that the other nodes, which
// decide its keys from the store, count its share.
func TestLocalPolicyWriteBackIdle(t *testing.T) {
	e := newLocalEnvWith(t, `
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
`, func(f *decide.Failover, e *localEnv) {
		f.Health = func() error {
			if e.store.down.Load() {
				return errStoreDown
			}
			return nil
		}
	})
	e.nodes.Store(2)
	e.store.down.Store(true)
	if n := e.admit(t, "user", "mallory"); n != 5 {
		t.Fatalf("the local policy admitted %d, want 5 (10 on 2 nodes)", n)
	}
	time.Sleep(3 * 100 * time.Millisecond)
	if r := e.storePeek(t, "user", "mallory"); r != 10 {
		t.Fatalf("written back while the store was down: %d left, want 10", r)
	}
	// The store returns; this node gets no request.
	e.store.down.Store(false)
	waitFor(t, "the idle node's write-back", func() bool { return e.storePeek(t, "user", "mallory") == 5 })
}
