package decide_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
)

const permitRules = `descriptors:
  - key: k
    concurrency: {max: 2, ttl: 1m}
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: wide
    concurrency: {max: 4, ttl: 1m}
`

// TestDecidePermits: a request with a concurrency rule holds its slot in
// the Outcome's Permit until released; refused a slot, it takes nothing
// from its rate, and refused by its rate, it holds no slot.
func TestDecidePermits(t *testing.T) {
	ctx := context.Background()
	e := newLocalEnv(t, permitRules)
	a, b := e.decide(t, "k", "x"), e.decide(t, "k", "x")
	if !a.Overall.Allowed || !b.Overall.Allowed || a.Permit == nil || b.Permit == nil {
		t.Fatalf("two of two slots: %+v %+v", a.Overall, b.Overall)
	}
	if a.PermitToken != "" {
		t.Error("a token built for a front door that did not ask for one")
	}
	c := e.decide(t, "k", "x")
	if c.Overall.Allowed || c.Permit != nil {
		t.Fatalf("a third in flight: %+v", c.Overall)
	}
	if got := ratePeek(t, e, "k", "x"); got != 1 {
		t.Fatalf("the refused request took from its rate: %d left, want 1", got)
	}
	if err := a.Permit.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Permit.Release(ctx); err != nil {
		t.Fatal("a second release:", err)
	}
	d := e.decide(t, "k", "x")
	if !d.Overall.Allowed || d.Permit == nil {
		t.Fatalf("after a release: %+v", d.Overall)
	}
	// The rate is spent (3 of 3): refused, and no slot is held.
	if err := d.Permit.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if o := e.decide(t, "k", "x"); o.Overall.Allowed || o.Permit != nil {
		t.Fatalf("past the rate: %+v", o.Overall)
	}
	if err := b.Permit.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Other values have their own slots.
	if o := e.decide(t, "k", "y"); !o.Overall.Allowed || o.Permit == nil {
		t.Fatalf("another value: %+v", o.Overall)
	}
}

// TestDecidePermitsLocalPolicy: with the store down, the local policy
// gives each of n nodes floor(N/n) slots of a key, held in the node's own
// store; the slots a node holds stay held when n changes.
func TestDecidePermitsLocalPolicy(t *testing.T) {
	ctx := context.Background()
	e := newLocalEnv(t, permitRules)
	e.nodes.Store(2)
	e.store.down.Store(true)
	var outs []func() error
	for range 2 {
		o := e.decide(t, "wide", "x")
		if !o.Overall.Allowed || o.Degraded != rules.FailLocal || o.Permit == nil {
			t.Fatalf("share of 4 on 2 nodes: %+v %v", o.Overall, o.Degraded)
		}
		p := o.Permit
		outs = append(outs, func() error { return p.Release(ctx) })
	}
	if o := e.decide(t, "wide", "x"); o.Overall.Allowed || o.Degraded != rules.FailLocal {
		t.Fatalf("a third on a node whose share is 2: %+v", o.Overall)
	}
	// Four nodes: a share of 1, and the node holds 2: none until both go.
	e.nodes.Store(4)
	if err := outs[0](); err != nil {
		t.Fatal(err)
	}
	if o := e.decide(t, "wide", "x"); o.Overall.Allowed {
		t.Fatalf("holding 1 of a share of 1: %+v", o.Overall)
	}
	if err := outs[1](); err != nil {
		t.Fatal(err)
	}
	if o := e.decide(t, "wide", "x"); !o.Overall.Allowed || o.Permit == nil {
		t.Fatalf("holding 0 of a share of 1: %+v", o.Overall)
	}
	// A key with fewer slots than nodes admits nothing while the store is
	// down: the nodes together never hold more than N.
	e.nodes.Store(3)
	if o := e.decide(t, "k", "z"); o.Overall.Allowed {
		t.Fatalf("2 slots on 3 nodes: %+v", o.Overall)
	}
	// The store returns: its slots are its own again.
	e.store.down.Store(false)
	if o := e.decide(t, "wide", "x"); !o.Overall.Allowed || o.Degraded != rules.FailDefault {
		t.Fatalf("the store back: %+v %v", o.Overall, o.Degraded)
	}
}

// ratePeek returns what the store has left of key=value's rate limit.
func ratePeek(t *testing.T, e *localEnv, key, value string) int64 {
	t.Helper()
	var p rules.Plan
	if err := e.d.Rules().Plan("api", []rules.Descriptor{{Entries: []rules.Entry{{Key: key, Value: value}}}}, &p); err != nil {
		t.Fatal(err)
	}
	for _, h := range p.Hits {
		if h.Limit.Algorithm != sluice.Concurrency {
			d, err := sluice.NewLimiter(e.store.mem()).AllowN(context.Background(), h.Key, h.Limit, 0)
			if err != nil {
				t.Fatal(err)
			}
			return d.Remaining
		}
	}
	t.Fatalf("%s=%s has no rate", key, value)
	return 0
}

// TestExplainPermitsHeld: Explain says, for a concurrency rule, how many
// permits its key holds now out of max (a peek that takes nothing), in
// figures and in words, and when every slot is taken, how long until one
// frees at the latest; its rate says nothing of permits.
func TestExplainPermitsHeld(t *testing.T) {
	ctx := context.Background()
	e := newLocalEnv(t, permitRules)
	held := func() (*decide.CounterState, *decide.CounterState) {
		t.Helper()
		ex, err := e.d.Explain(ctx, "api", []rules.Descriptor{{Entries: []rules.Entry{{Key: "k", Value: "x"}}, Cost: 1}})
		if err != nil {
			t.Fatal(err)
		}
		var conc, rate *decide.CounterState
		for _, l := range ex.Descriptors[0].Limits {
			if l.Algorithm == "concurrency" {
				conc = l.State
			} else {
				rate = l.State
			}
		}
		if conc == nil || rate == nil || conc.Held == nil {
			t.Fatalf("explained: %+v", ex.Descriptors[0].Limits)
		}
		if rate.Held != nil || rate.Summary != "" {
			t.Fatalf("a rate's state with held %v, %q", rate.Held, rate.Summary)
		}
		if want := fmt.Sprintf("%d of %d permits held", *conc.Held, conc.Limit); conc.Summary != want {
			t.Fatalf("summary %q, want %q", conc.Summary, want)
		}
		return conc, rate
	}
	if c, _ := held(); *c.Held != 0 || c.Limit != 2 || c.Remaining != 2 || c.RetryAfter != "" {
		t.Fatalf("none in flight: %+v held %d", c, *c.Held)
	}
	a := e.decide(t, "k", "x")
	if c, _ := held(); *c.Held != 1 || c.Remaining != 1 || c.RetryAfter != "" {
		t.Fatalf("one in flight: %+v held %d", c, *c.Held)
	}
	b := e.decide(t, "k", "x")
	c, r := held()
	if *c.Held != 2 || c.Remaining != 0 || c.RetryAfter != "1m0s" || c.ResetAfter != "1m0s" || c.Summary != "2 of 2 permits held" {
		t.Fatalf("two of two in flight: %+v held %d", c, *c.Held)
	}
	if r.Remaining != 1 { // two of three taken; the explanations took nothing
		t.Fatalf("the rate: %+v", r)
	}
	for _, o := range []*decide.Outcome{a, b} {
		if err := o.Permit.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if c, _ := held(); *c.Held != 0 {
		t.Fatalf("after the releases: held %d", *c.Held)
	}
}

// storeHeld returns the permits key=value's concurrency limit holds in
// the store now (a peek).
func storeHeld(t *testing.T, e *localEnv, key, value string) int64 {
	t.Helper()
	ex, err := e.d.Explain(context.Background(), "api", []rules.Descriptor{{Entries: []rules.Entry{{Key: key, Value: value}}, Cost: 1}})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ex.Descriptors[0].Limits {
		if l.Algorithm == "concurrency" && l.State != nil && l.State.Held != nil {
			return *l.State.Held
		}
	}
	t.Fatalf("%s=%s: no permits explained: %+v", key, value, ex.Descriptors[0].Limits)
	return 0
}

// TestLocalPolicyPermitsHandOver: the permits the local policy holds are
// handed to the store when it answers again, before the store decides
// their key: the store counts their holders, whatever its room, and
// admits no newcomer to their slots; a Permit handed over renews and
// releases in the store from then on, and holds nothing in the node's
// own store.
func TestLocalPolicyPermitsHandOver(t *testing.T) {
	ctx := context.Background()
	e := newLocalEnv(t, permitRules)
	e.nodes.Store(2)
	// Another node's holders, admitted by the store before the outage.
	var p rules.Plan
	if err := e.d.Rules().Plan("api", one("wide", "x"), &p); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		_, d, err := sluice.NewLimiter(e.store).Acquire(ctx, []sluice.Hit{{Key: p.Hits[0].Key, Limit: p.Hits[0].Limit, Cost: 1}}, nil)
		if err != nil || !d.Allowed {
			t.Fatalf("the other node's: %+v %v", d, err)
		}
	}
	e.store.down.Store(true)
	var mine []*decide.Outcome // the node's share, floor(4/2)
	for range 2 {
		o := e.decide(t, "wide", "x")
		if !o.Overall.Allowed || o.Degraded != rules.FailLocal || o.Permit == nil {
			t.Fatalf("the local share: %+v %v", o.Overall, o.Degraded)
		}
		mine = append(mine, o)
	}
	e.store.down.Store(false)
	// The store held 2 of 4; it counts the node's 2 before it decides.
	if o := e.decide(t, "wide", "x"); o.Overall.Allowed {
		t.Fatalf("a newcomer admitted to a slot the local policy's holder has: %+v", o.Overall)
	}
	if n := storeHeld(t, e, "wide", "x"); n != 4 {
		t.Fatalf("the store holds %d, want 4 (2 of its own, 2 handed over)", n)
	}
	// Renewed in the store: its clock moves past the first expiry, the
	// handed-over permits renewed, the store's own not.
	e.now.Add(int64(40 * time.Second))
	for _, o := range mine {
		if held, err := o.Permit.Renew(ctx); err != nil || !held {
			t.Fatalf("renewing a permit handed over: %v %v", held, err)
		}
	}
	e.now.Add(int64(30 * time.Second)) // 70 s on: the store's own expired
	if n := storeHeld(t, e, "wide", "x"); n != 2 {
		t.Fatalf("the store holds %d, want the 2 handed over and renewed", n)
	}
	// Released in the store.
	if err := mine[0].Permit.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := storeHeld(t, e, "wide", "x"); n != 1 {
		t.Fatalf("after a release: %d held, want 1", n)
	}
	// The node's own store keeps the copies of those still held,
	// renewed and released with the store's: with the store down again,
	// the one still running counts against the node's share of 2.
	e.store.down.Store(true)
	if o := e.decide(t, "wide", "x"); !o.Overall.Allowed || o.Degraded != rules.FailLocal {
		t.Fatalf("the share after the hand-over: %+v %v", o.Overall, o.Degraded)
	}
	if o := e.decide(t, "wide", "x"); o.Overall.Allowed {
		t.Fatalf("the share after the hand-over, a holder handed over still running: %+v", o.Overall)
	}
	if err := mine[1].Permit.Release(ctx); err != nil {
		t.Log(err) // the store is down: released in the node's store
	}
	if o := e.decide(t, "wide", "x"); !o.Overall.Allowed || o.Degraded != rules.FailLocal {
		t.Fatalf("the share once the holders handed over ended: %+v %v", o.Overall, o.Degraded)
	}
}

// TestLocalPolicyCountsStoreHolders: the holders the store admitted
// through a node count against the node's share when the store fails
// while they run (copies in its own store, renewed and released with
// them): the policy admits beside them only what the share leaves.
func TestLocalPolicyCountsStoreHolders(t *testing.T) {
	ctx := context.Background()
	e := newLocalEnv(t, permitRules)
	e.nodes.Store(2)
	var mine []*decide.Outcome
	for range 2 {
		o := e.decide(t, "wide", "v")
		if !o.Overall.Allowed || o.Degraded != rules.FailDefault || o.Permit == nil {
			t.Fatalf("the store's: %+v %v", o.Overall, o.Degraded)
		}
		mine = append(mine, o)
	}
	e.now.Add(int64(50 * time.Second))
	for _, o := range mine {
		if held, err := o.Permit.Renew(ctx); err != nil || !held {
			t.Fatalf("renew: %v %v", held, err)
		}
	}
	e.now.Add(int64(20 * time.Second)) // past the first expiry: the copies were renewed too
	e.store.down.Store(true)
	if o := e.decide(t, "wide", "v"); o.Overall.Allowed || o.Degraded != rules.FailLocal {
		t.Fatalf("a share of 2 with 2 of the node's holders running: %+v %v", o.Overall, o.Degraded)
	}
	// Renewals that fail in the store renew the copies: past the last
	// renewal's expiry (50 s + 1m), the holders still count.
	for _, o := range mine {
		if _, err := o.Permit.Renew(ctx); err == nil {
			t.Fatal("renewed in a store that is down")
		}
	}
	e.now.Add(int64(45 * time.Second))
	if o := e.decide(t, "wide", "v"); o.Overall.Allowed {
		t.Fatalf("the holders' copies expired while they renewed: %+v", o.Overall)
	}
	if err := mine[0].Permit.Release(ctx); err == nil {
		t.Fatal("released in a store that is down")
	}
	if o := e.decide(t, "wide", "v"); !o.Overall.Allowed || o.Degraded != rules.FailLocal {
		t.Fatalf("one of the node's holders ended: %+v %v", o.Overall, o.Degraded)
	}
}

// TestLocalPolicyPermitsHandOverIdle: a node that gets no request after
// the store returns hands over its policy's permits as soon as
// Failover.Health says the store is up; those released meanwhile are not
// handed over.
func TestLocalPolicyPermitsHandOverIdle(t *testing.T) {
	ctx := context.Background()
	e := newLocalEnvWith(t, permitRules, func(f *decide.Failover, e *localEnv) {
		f.Health = func() error {
			if e.store.down.Load() {
				return errStoreDown
			}
			return nil
		}
	})
	e.store.down.Store(true)
	var mine []*decide.Outcome
	for range 3 {
		o := e.decide(t, "wide", "y")
		if !o.Overall.Allowed || o.Degraded != rules.FailLocal {
			t.Fatalf("the local policy: %+v %v", o.Overall, o.Degraded)
		}
		mine = append(mine, o)
	}
	if err := mine[2].Permit.Release(ctx); err != nil {
		t.Fatal(err)
	}
	e.store.down.Store(false)
	waitFor(t, "the idle node's hand-over", func() bool { return storeHeld(t, e, "wide", "y") == 2 })
	time.Sleep(3 * 100 * time.Millisecond)
	if n := storeHeld(t, e, "wide", "y"); n != 2 {
		t.Fatalf("the store holds %d, want the 2 not released", n)
	}
	for _, o := range mine[:2] {
		if err := o.Permit.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := storeHeld(t, e, "wide", "y"); n != 0 {
		t.Fatalf("after the releases: %d held", n)
	}
}

// TestLocalPolicyReservesOthersShares: for a while after the store
// answers a node again once its local policy has answered, the node
// leaves the other nodes' shares of a concurrency limit to them (they may
// still hold them under their policy, not yet handed over): with 2
// nodes and N = 4, the store holding this node's 2 handed over, a
// newcomer waits; after the reserve, it is admitted.
func TestLocalPolicyReservesOthersShares(t *testing.T) {
	e := newLocalEnv(t, permitRules)
	e.nodes.Store(2)
	e.store.down.Store(true)
	for range 2 {
		if o := e.decide(t, "wide", "r"); !o.Overall.Allowed || o.Degraded != rules.FailLocal {
			t.Fatalf("the local share: %+v %v", o.Overall, o.Degraded)
		}
	}
	e.store.down.Store(false)
	if o := e.decide(t, "wide", "r"); o.Overall.Allowed || o.Degraded != rules.FailDefault || o.Overall.Limit != 2 {
		t.Fatalf("a newcomer while the other node's share is reserved: %+v %v, want denied against 4 − 2", o.Overall, o.Degraded)
	}
	if n := storeHeld(t, e, "wide", "r"); n != 2 {
		t.Fatalf("the store holds %d, want the 2 handed over", n)
	}
	e.now.Add(int64(6*time.Second + time.Millisecond))
	if o := e.decide(t, "wide", "r"); !o.Overall.Allowed || o.Overall.Limit != 4 {
		t.Fatalf("a newcomer after the reserve: %+v", o.Overall)
	}
}

// TestLocalPolicyReservesIdle: a node that decided nothing while the
// store was down (its policy answered nothing) still leaves the other
// nodes' shares to them when the store returns, having seen the outage
// through Failover.Health: with 2 nodes and N = 4, 2 newcomers, not 4,
// until the reserve ends. Without an outage, all 4.
func TestLocalPolicyReservesIdle(t *testing.T) {
	var down, up atomic.Int64 // Health's calls while down, and up
	e := newLocalEnvWith(t, permitRules, func(f *decide.Failover, e *localEnv) {
		f.Health = func() error {
			if e.store.down.Load() {
				down.Add(1)
				return errStoreDown
			}
			up.Add(1)
			return nil
		}
	})
	e.nodes.Store(2)
	var held []*decide.Outcome
	admitted := func(value string) int { return e.fromStore(t, "wide", value, &held) }
	if n := admitted("before"); n != 4 {
		t.Fatalf("no outage: %d admitted, want 4", n)
	}
	e.store.down.Store(true)
	d := down.Load()
	waitFor(t, "Health asked while the store is down", func() bool { return down.Load() >= d+2 })
	e.store.down.Store(false)
	u := up.Load()
	waitFor(t, "Health asked once the store is up", func() bool { return up.Load() >= u+2 })
	if n := admitted("after"); n != 2 {
		t.Fatalf("after an outage this node only watched: %d admitted, want 4 − 2", n)
	}
	e.now.Add(int64(6*time.Second + time.Millisecond))
	if n := admitted("after"); n != 2 {
		t.Fatalf("after the reserve: %d more admitted, want the other 2", n)
	}
	for _, o := range held {
		if err := o.Permit.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLocalPolicyReservesIdleFailure: an outage too short to open the
// store's breaker (Health said up throughout) but that failed a call of
// this idle node (a probe's PING: Failover.Errors rose) starts the
// reserve too.
func TestLocalPolicyReservesIdleFailure(t *testing.T) {
	var polls, failed atomic.Int64
	e := newLocalEnvWith(t, permitRules, func(f *decide.Failover, e *localEnv) {
		f.Health = func() error { polls.Add(1); return nil }
		f.Errors = failed.Load
	})
	e.nodes.Store(2)
	var held []*decide.Outcome
	admitted := func(value string) int { return e.fromStore(t, "wide", value, &held) }
	p := polls.Load()
	waitFor(t, "Health asked", func() bool { return polls.Load() >= p+2 })
	if n := admitted("before"); n != 4 {
		t.Fatalf("no failure: %d admitted, want 4", n)
	}
	failed.Add(1)
	p = polls.Load()
	waitFor(t, "Health asked after the failure", func() bool { return polls.Load() >= p+3 })
	if n := admitted("after"); n != 2 {
		t.Fatalf("after a failed call of this idle node: %d admitted, want 4 − 2", n)
	}
	for _, o := range held {
		if err := o.Permit.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// fromStore decides key=value, each by the store, until a denial (5 at
// most), adds the Outcomes admitted to held, and returns how many.
func (e *localEnv) fromStore(t *testing.T, key, value string, held *[]*decide.Outcome) int {
	t.Helper()
	n := 0
	for range 5 {
		o := e.decide(t, key, value)
		if o.Degraded != rules.FailDefault {
			t.Fatalf("decided by %v, not the store", o.Degraded)
		}
		if !o.Overall.Allowed {
			break
		}
		*held = append(*held, o)
		n++
	}
	return n
}
