package localcache_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/localcache"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/storetest"
)

// settling is counting with memstore's Settle.
type settling struct{ counting }

func (c *settling) Settle(ctx context.Context, s *sluice.Settlement) (int64, error) {
	return c.next.Settle(ctx, s)
}

// TestSettle: a refund drops the denial the cache learnt for the key and
// limit, so that the next request asks the store (and is allowed); a
// charge keeps it; over a store without Settle, the cache refuses with
// errors.ErrUnsupported.
func TestSettle(t *testing.T) {
	clock := storetest.NewClock(storetest.Start)
	mem := memstore.New(memstore.Config{Now: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { mem.Close() })
	st := &settling{counting{next: mem}}
	lim := sluice.NewLimiter(localcache.New(st, localcache.Config{Now: func() time.Duration { return clock.Now().Sub(storetest.Start) }}))
	l := &sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 10, Period: time.Minute}

	// reserve takes all of key's limit, then learns its denial.
	reserve := func(key string, spent int64, id uint64) *sluice.Settlement {
		t.Helper()
		at := clock.Now()
		h := sluice.Hit{Key: key, Limit: l, Cost: 10}
		d, err := lim.Take(ctx, []sluice.Hit{h}, make([]sluice.Decision, 1))
		if err != nil || !d.Allowed {
			t.Fatalf("reserving: %+v, %v", d, err)
		}
		for range 2 {
			if d, err := lim.Allow(ctx, key, l); err != nil || d.Allowed {
				t.Fatalf("a request past the reservation: %+v, %v; want denied", d, err)
			}
		}
		return &sluice.Settlement{Hit: h, Spent: spent, ResetAfter: d.ResetAfter, At: at, ID: id}
	}
	// asks reports whether a request of key reaches the store, and its
	// decision.
	asks := func(key string) (bool, sluice.Decision) {
		t.Helper()
		before := st.calls.Load()
		d, err := lim.Allow(ctx, key, l)
		if err != nil {
			t.Fatal(err)
		}
		return st.calls.Load() > before, d
	}

	s := reserve("refund", 4, 1)
	if asked, _ := asks("refund"); asked {
		t.Fatal("the denial was not learnt: the test proves nothing")
	}
	if moved, err := lim.Settle(ctx, s); err != nil || moved != -6 {
		t.Fatalf("refunding 6: moved %d, %v", moved, err)
	}
	if asked, d := asks("refund"); !asked || !d.Allowed {
		t.Errorf("after a refund: asked the store %v, %+v; want asked and allowed", asked, d)
	}

	s = reserve("charge", 14, 2)
	if moved, err := lim.Settle(ctx, s); err != nil || moved != 4 {
		t.Fatalf("charging 4: moved %d, %v", moved, err)
	}
	if asked, d := asks("charge"); asked || d.Allowed {
		t.Errorf("after a charge: asked the store %v, %+v; want answered locally, denied", asked, d)
	}

	bare := sluice.NewLimiter(localcache.New(&counting{next: mem}, localcache.Config{}))
	if _, err := bare.Settle(ctx, s); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("settling over a store without Settle: %v, want errors.ErrUnsupported", err)
	}
}
