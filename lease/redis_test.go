package lease_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/redisstore"
)

// TestRedisNodes: four nodes, each a lease store over its own Redis store
// client, share a fixed window of 5,000 an hour with a lease bound of
// 1,000 on one real redis-server, with 32 goroutines asking far more than
// the limit, as fast as they can. The window admits at most its limit, and
// at least its limit less what leases may hold unspent (⌈U/4⌉ a node);
// leases carry most of the admitted hits, and the calls to Redis are
// never more than the decisions.
func TestRedisNodes(t *testing.T) {
	srv := redistest.Standalone(t)
	const limit, u = 5000, 1000
	l := &sluice.Limit{Name: "shared", Rate: limit, Period: time.Hour, LeaseOvershoot: u}
	prefix := fmt.Sprintf("lease-%d:", time.Now().UnixNano())
	var nodes []*lease.Store
	var stores []*redisstore.Store
	for range 4 {
		rs, err := redisstore.New(redisstore.Config{URL: srv.URL(), Prefix: prefix, Timeout: 5 * time.Second,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rs.Close() })
		stores = append(stores, rs)
		nodes = append(nodes, lease.New(rs, lease.Config{}))
	}
	var admitted, asked atomic.Int64
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			node := nodes[g%4]
			out := make([]sluice.Decision, 1)
			denied := 0
			for denied < 200 {
				asked.Add(1)
				if err := node.Take(context.Background(), []sluice.Hit{{Key: "k", Limit: l, Cost: 1}}, out); err != nil {
					t.Error(err)
					return
				}
				if out[0].Allowed {
					admitted.Add(1)
				} else {
					denied++
				}
			}
		})
	}
	wg.Wait()
	n := admitted.Load()
	if held := int64(4 * ((u + 3) / 4)); n > limit || n < limit-held {
		t.Errorf("%d admitted by 4 nodes, want between %d and %d", n, limit-held, limit)
	}
	var calls, grants, refused int64
	for i, rs := range stores {
		calls += rs.Stats().Calls
		grants += nodes[i].Stats().Grants.Load()
		refused += nodes[i].Stats().Refused.Load()
	}
	granting := grants - refused
	var local int64
	for _, nd := range nodes {
		local += nd.Stats().Local.Load()
	}
	t.Logf("%d admitted of %d asked, %d from leases; %d Redis calls, %d of them grants that granted, %d refused", n, asked.Load(), local, calls, granting, refused)
	// 32 goroutines ask as fast as they can. A window needs no ledger, so
	// leases carry most of the admitted hits; what the store decides is
	// the start (grants grow from one hit) and the denials (a lease store
	// keeps no cache of them).
	if local < n*8/10 {
		t.Errorf("%d of %d admitted hits came from leases: fewer than 80%%", local, n)
	}
	if calls > asked.Load() {
		t.Errorf("%d Redis calls for %d decisions: more than one a decision", calls, asked.Load())
	}
}
