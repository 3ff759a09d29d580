package decide_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/fault"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

const tokensYAML = `
domain: llm
descriptors:
  - key: key
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tokens
    rate_limit: {unit: minute, requests_per_unit: 1000}
`

// settleStore is a memstore whose settlements can fail: failing counts
// down the calls to refuse.
type settleStore struct {
	*memstore.Store
	failing atomic.Int64
	calls   atomic.Int64
}

func (s *settleStore) Settle(ctx context.Context, st *sluice.Settlement) (int64, error) {
	s.calls.Add(1)
	if s.failing.Add(-1) >= 0 {
		return 0, &fault.StoreError{Reason: fault.Unreachable, Err: errStoreDown}
	}
	return s.Store.Settle(ctx, st)
}

type tokenEnv struct {
	d     *decide.Decider
	store *settleStore
	now   time.Time
}

func newTokenEnv(t *testing.T, hooks ...decide.Hook) *tokenEnv {
	t.Helper()
	e := &tokenEnv{now: time.Date(2026, 3, 1, 10, 0, 10, 0, time.UTC)}
	clock := func() time.Time { return e.now }
	e.store = &settleStore{Store: memstore.New(memstore.Config{Now: clock, SweepInterval: -1})}
	dom, err := rules.Parse("llm.yaml", []byte(tokensYAML))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rules.NewConfig(dom)
	if err != nil {
		t.Fatal(err)
	}
	e.d, err = decide.New(decide.Config{Limiter: sluice.NewLimiter(e.store), Rules: cfg, Now: clock, Hooks: hooks})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// reserve decides a request of one call and tokens reserved, returning
// its outcome.
func (e *tokenEnv) reserve(t *testing.T, tokens int64) *decide.Outcome {
	t.Helper()
	r := &decide.Request{Domain: "llm", Reserve: true, Descriptors: []rules.Descriptor{
		{Entries: []rules.Entry{{Key: "key", Value: "k1"}}, Cost: 1},
		{Entries: []rules.Entry{{Key: "tokens", Value: "k1"}}, Cost: tokens},
	}}
	o := new(decide.Outcome)
	if err := e.d.Decide(context.Background(), r, o); err != nil {
		t.Fatal(err)
	}
	return o
}

func TestSettleRefundAndCharge(t *testing.T) {
	e := newTokenEnv(t)
	ctx := context.Background()
	o := e.reserve(t, 600)
	if !o.Overall.Allowed {
		t.Fatalf("first reservation denied: %+v", o.Overall)
	}
	if o2 := e.reserve(t, 500); o2.Overall.Allowed {
		t.Fatal("a second reservation of 500 fits beside 600 of 1000")
	}
	if err := e.d.Settle(ctx, o, 1, 100); err != nil {
		t.Fatal(err)
	}
	// 100 spent: 900 left, so 500 now fits, and 401 more does not.
	o3 := e.reserve(t, 500)
	if !o3.Overall.Allowed {
		t.Fatalf("after a refund of 500, a reservation of 500 was denied: %+v", o3.Overall)
	}
	if o4 := e.reserve(t, 401); o4.Overall.Allowed {
		t.Fatal("the refund gave back more than was not spent")
	}
	// A second Settle of the same descriptor changes nothing.
	if err := e.d.Settle(ctx, o, 1, 0); err != nil {
		t.Fatal(err)
	}
	if o5 := e.reserve(t, 401); o5.Overall.Allowed {
		t.Fatal("settling a descriptor twice refunded twice")
	}
	// A charge past the limit: 500 reserved, 2000 spent; the next
	// reservation, however small, is denied with the debt's wait.
	if err := e.d.Settle(ctx, o3, 1, 2000); err != nil {
		t.Fatal(err)
	}
	o6 := e.reserve(t, 1)
	if o6.Overall.Allowed || o6.Overall.RetryAfter <= 0 {
		t.Fatalf("after a charge past the limit: %+v, want denied", o6.Overall)
	}
	// The requests descriptor (cost 1, spent 1) settles to nothing.
	if err := e.d.Settle(ctx, o, 0, 1); err != nil {
		t.Fatal(err)
	}
}

// TestSettleDeniedHoldsNothing: a denied request consumed nothing, and a
// request without Reserve has nothing to settle.
func TestSettleNotReserved(t *testing.T) {
	e := newTokenEnv(t)
	o := new(decide.Outcome)
	r := &decide.Request{Domain: "llm", Descriptors: []rules.Descriptor{{Entries: []rules.Entry{{Key: "tokens", Value: "k"}}, Cost: 5}}}
	if err := e.d.Decide(context.Background(), r, o); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Settle(context.Background(), o, 0, 1); !errors.Is(err, sluice.ErrInvalid) {
		t.Fatalf("settling a request without Reserve: %v, want sluice.ErrInvalid", err)
	}
}

// TestSettleShadowCharges: a request denied and let through by global
// shadow mode consumed nothing; its settlement charges all it spent.
func TestSettleShadowCharges(t *testing.T) {
	e := newTokenEnv(t, decide.GlobalShadow)
	ctx := context.Background()
	big := e.reserve(t, 1500) // over the limit: denied, let through
	if !big.Overall.Allowed || !big.ShadowDenied {
		t.Fatalf("shadow mode: %+v", big)
	}
	if err := e.d.Settle(ctx, big, 1, 900); err != nil {
		t.Fatal(err)
	}
	if o := e.reserve(t, 101); o.ShadowDenied != true {
		t.Fatal("900 charged: 101 more should be over")
	}
	if o := e.reserve(t, 100); o.ShadowDenied {
		t.Fatal("900 charged: 100 more fits")
	}
}

// TestSettleRetried: a settlement the store fails is retried in the
// background with the same ID until it lands.
func TestSettleRetried(t *testing.T) {
	e := newTokenEnv(t)
	ctx := context.Background()
	o := e.reserve(t, 800)
	e.store.failing.Store(3)
	if err := e.d.Settle(ctx, o, 1, 100); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for e.store.calls.Load() < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("after %d calls the settlement had not landed", e.store.calls.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if o := e.reserve(t, 900); !o.Overall.Allowed {
		t.Fatal("the retried refund did not land")
	}
	if got := e.store.calls.Load(); got != 4 {
		t.Fatalf("%d settle calls, want 4 (three failures, then one)", got)
	}
}
