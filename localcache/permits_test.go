package localcache_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/localcache"
	"github.com/sluicehq/sluice/memstore"
)

// TestPermitsNotCached: a permit's denial is never answered from the
// cache: a release frees the slot at once, whatever the denial's
// RetryAfter said; release and renewal reach the store below.
func TestPermitsNotCached(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	m := memstore.New(memstore.Config{SweepInterval: -1, Now: func() time.Time { return now }})
	defer m.Close()
	c := localcache.New(m, localcache.Config{})
	ctx := context.Background()
	l := &sluice.Limit{Algorithm: sluice.Concurrency, Rate: 1, Period: time.Hour}
	take := func(id string) sluice.Decision {
		out := make([]sluice.Decision, 1)
		if err := c.Take(ctx, []sluice.Hit{{Key: "k", Limit: l, Cost: 1, Permit: id}}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	if d := take("a"); !d.Allowed {
		t.Fatalf("first: %+v", d)
	}
	if d := take("b"); d.Allowed || d.RetryAfter != time.Hour {
		t.Fatalf("second: %+v, want denied for an hour", d)
	}
	if err := c.Permits(ctx, []sluice.Hit{{Key: "k", Limit: l, Permit: "a"}}, nil, true); err != nil {
		t.Fatal(err)
	}
	if d := take("b"); !d.Allowed {
		t.Fatalf("after a release: %+v, want the freed slot, not a cached denial", d)
	}
	out := make([]sluice.Decision, 1)
	if err := c.Permits(ctx, []sluice.Hit{{Key: "k", Limit: l, Permit: "b"}}, out, false); err != nil || !out[0].Allowed {
		t.Fatalf("renew through the cache: %+v %v", out[0], err)
	}
	p, _, err := sluice.NewLimiter(c).Acquire(ctx, []sluice.Hit{{Key: "k2", Limit: l, Cost: 1}}, nil)
	if err != nil || p == nil {
		t.Fatalf("Acquire through the cache: %v %v", p, err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
