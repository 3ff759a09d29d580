package decorator_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/stores/decorator"
	"github.com/sluicehq/sluice/internal/stores/regions"
	"github.com/sluicehq/sluice/internal/testsupport/redistest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/localcache"
	"github.com/sluicehq/sluice/redisstore"
)

// decorated is the method set every decorator has.
type decorated interface {
	sluice.Store
	decorator.Unwrapper
	decorator.Healther
	decorator.Settler
	decorator.EachTaker
	decorator.Permitter
	io.Closer
}

// TestConvention: lease, localcache and the region tier, over a real
// Redis, each unwrap to the store below, report its health, pass permits
// to it, and leave it open when closed.
func TestConvention(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, c := range []struct {
		name string
		wrap func(t *testing.T, next sluice.Store) decorated
	}{
		{"lease", func(_ *testing.T, next sluice.Store) decorated { return lease.New(next, lease.Config{}) }},
		{"localcache", func(_ *testing.T, next sluice.Store) decorated { return localcache.New(next, localcache.Config{}) }},
		{"regions", func(t *testing.T, next sluice.Store) decorated {
			coord := open(t, srv.URL(), "coord:")
			led := &regions.RedisLedger{Client: coord.Client, Prefix: "coord:"}
			s, err := regions.New(regions.Config{Next: next, Region: "a", Regions: []string{"a"}, Ledger: led, Now: time.Now})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			next := open(t, srv.URL(), c.name+":")
			d := c.wrap(t, next)
			if d.Unwrap() != next {
				t.Errorf("Unwrap: %T, want the store below", d.Unwrap())
			}
			if err := d.Health(); err != nil {
				t.Errorf("Health: %v, want the store below's, nil", err)
			}
			// Permits pass through to the store below: acquired and
			// released through the decorator, seen there.
			conc := &sluice.Limit{Algorithm: sluice.Concurrency, Rate: 1, Period: time.Minute}
			ctx := context.Background()
			p, _, err := sluice.NewLimiter(d).Acquire(ctx, []sluice.Hit{{Key: "permit", Limit: conc, Cost: 1}}, nil)
			if err != nil || p == nil {
				t.Fatalf("Acquire through the decorator: %v %v", p, err)
			}
			below := sluice.NewLimiter(next)
			if d, _ := below.AllowN(ctx, "permit", conc, 0); d.Remaining != 0 {
				t.Errorf("the store below: %+v, want the permit held there", d)
			}
			if held, err := p.Renew(ctx); !held || err != nil {
				t.Errorf("Renew through the decorator: %v %v", held, err)
			}
			if err := p.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if d, _ := below.AllowN(ctx, "permit", conc, 0); d.Remaining != 1 {
				t.Errorf("the store below: %+v, want the permit released there", d)
			}
			if err := d.Close(); err != nil {
				t.Fatal(err)
			}
			l := &sluice.Limit{Rate: 1, Period: time.Minute}
			if d, err := sluice.NewLimiter(next).Allow(context.Background(), "k", l); err != nil || !d.Allowed {
				t.Fatalf("the store below after the decorator's Close: %+v, %v", d, err)
			}
		})
	}
}

// open opens a Redis store, closed when the test ends.
func open(t *testing.T, url, prefix string) *redisstore.Store {
	t.Helper()
	r, err := redisstore.New(redisstore.Config{URL: url, Prefix: prefix, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}
