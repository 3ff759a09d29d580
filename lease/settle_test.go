package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/storetest"
)

// settleNode is a lease store over a memstore on a virtual clock, and a
// limiter on each.
func settleNode(t *testing.T) (node, shared *sluice.Limiter, clock *storetest.Clock) {
	t.Helper()
	clock = storetest.NewClock(epoch)
	mem := memstore.New(memstore.Config{Now: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { mem.Close() })
	ls := lease.New(mem, lease.Config{Now: func() time.Duration { return clock.Now().Sub(epoch) }, Go: inline})
	return sluice.NewLimiter(ls), sluice.NewLimiter(mem), clock
}

// reserve takes cost on key through lim and returns its settlement with
// spent.
func reserve(t *testing.T, lim *sluice.Limiter, clock *storetest.Clock, key string, l *sluice.Limit, cost, spent int64, id uint64) *sluice.Settlement {
	t.Helper()
	at := clock.Now()
	h := sluice.Hit{Key: key, Limit: l, Cost: cost}
	d, err := lim.Take(context.Background(), []sluice.Hit{h}, make([]sluice.Decision, 1))
	if err != nil || !d.Allowed {
		t.Fatalf("reserving %d: %+v, %v", cost, d, err)
	}
	return &sluice.Settlement{Hit: h, Spent: spent, ResetAfter: d.ResetAfter, At: at, ID: id}
}

// remaining peeks at key in the shared store.
func remaining(t *testing.T, shared *sluice.Limiter, key string, l *sluice.Limit) int64 {
	t.Helper()
	d, err := shared.AllowN(context.Background(), key, l, 0)
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

// TestSettleLeasedWindow: a reservation served by a window's lease is
// settled in the shared store, charge and refund: the refund comes off
// the key's count there, which holds the lease's grant.
func TestSettleLeasedWindow(t *testing.T) {
	for _, alg := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow} {
		t.Run(string(alg), func(t *testing.T) {
			node, shared, clock := settleNode(t)
			l := &sluice.Limit{Algorithm: alg, Rate: 1000, Period: time.Minute, LeaseOvershoot: 100}
			st := reserve(t, node, clock, "k", l, 10, 4, 1)
			before := remaining(t, shared, "k", l)
			if before > 1000-10 {
				t.Fatalf("the shared store has %d left: the reservation was not leased from it", before)
			}
			moved, err := node.Settle(context.Background(), st)
			if err != nil || moved != -6 {
				t.Fatalf("refunding 6 of a leased window's reservation: moved %d, %v; want -6", moved, err)
			}
			if got := remaining(t, shared, "k", l); got != before+6 {
				t.Errorf("after the refund the shared store has %d left, want %d", got, before+6)
			}
			st = reserve(t, node, clock, "k", l, 10, 40, 2)
			before = remaining(t, shared, "k", l)
			if moved, err := node.Settle(context.Background(), st); err != nil || moved != 30 {
				t.Fatalf("charging 30 more: moved %d, %v; want 30", moved, err)
			}
			if got := remaining(t, shared, "k", l); got != before-30 {
				t.Errorf("after the charge the shared store has %d left, want %d", got, before-30)
			}
		})
	}
}

// TestSettleLeasedBucket: a reservation served by a bucket's lease is
// charged in the shared store but refunds nothing; a bucket that does not
// lease is settled in the shared store, refund included.
func TestSettleLeasedBucket(t *testing.T) {
	for _, alg := range []sluice.Algorithm{sluice.TokenBucket, sluice.LeakyBucket, sluice.GCRA} {
		t.Run(string(alg), func(t *testing.T) {
			node, shared, clock := settleNode(t)
			l := &sluice.Limit{Algorithm: alg, Rate: 1000, Period: time.Second, Burst: 1000, LeaseOvershoot: 100}
			st := reserve(t, node, clock, "k", l, 10, 4, 1)
			before := remaining(t, shared, "k", l)
			if moved, err := node.Settle(context.Background(), st); err != nil || moved != 0 {
				t.Fatalf("refunding a leased bucket's reservation: moved %d, %v; want 0", moved, err)
			}
			if got := remaining(t, shared, "k", l); got != before {
				t.Errorf("after a refund of nothing the shared store has %d left, want %d", got, before)
			}
			st = reserve(t, node, clock, "k", l, 10, 40, 2)
			before = remaining(t, shared, "k", l)
			if moved, err := node.Settle(context.Background(), st); err != nil || moved != 30 {
				t.Fatalf("charging 30 more: moved %d, %v; want 30", moved, err)
			}
			if got := remaining(t, shared, "k", l); got != before-30 {
				t.Errorf("after the charge the shared store has %d left, want %d", got, before-30)
			}

			plain := &sluice.Limit{Algorithm: alg, Rate: 1000, Period: time.Second, Burst: 1000}
			st = reserve(t, node, clock, "p", plain, 10, 4, 3)
			if moved, err := node.Settle(context.Background(), st); err != nil || moved != -6 {
				t.Fatalf("refunding 6 on a bucket that does not lease: moved %d, %v; want -6", moved, err)
			}
			if got := remaining(t, shared, "p", plain); got != 1000-4 {
				t.Errorf("after the refund the shared store has %d left, want %d", got, 1000-4)
			}
		})
	}
}

// TestSettleUnsupported: over a store without Settle, a lease store
// refuses every settlement with errors.ErrUnsupported.
func TestSettleUnsupported(t *testing.T) {
	c := newCluster(t, 1) // over countingStore, which has no Settle
	lim := sluice.NewLimiter(c.nodes[0])
	for _, l := range []*sluice.Limit{
		{Algorithm: sluice.FixedWindow, Rate: 100, Period: time.Second},
		{Algorithm: sluice.TokenBucket, Rate: 100, Period: time.Second, LeaseOvershoot: 10},
	} {
		st := reserve(t, lim, c.clock, "k", l, 10, 4, 1)
		if _, err := lim.Settle(context.Background(), st); !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("settling %s over a store without Settle: %v, want errors.ErrUnsupported", l.Algorithm, err)
		}
	}
}
