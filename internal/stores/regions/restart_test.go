package regions_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/stores/regions"
	"github.com/sluicehq/sluice/redisstore"
)

// restartNode stops r's node and starts another over r's Redis and
// ledger (the node restarted), on the clock now, asking started when
// its Redis started (nil: never restarted).
func restartNode(t *testing.T, r *region, names []string, now func() time.Time, started bool) {
	t.Helper()
	r.store.Close()
	rs, err := redisstore.New(redisstore.Config{URL: r.srv.URL(), Prefix: "r:", Timeout: time.Second, BreakerCooldown: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	cfg := regions.Config{Next: rs, Region: "a", Regions: names, Ledger: r.ledger, Now: now, Interval: 50 * time.Millisecond}
	if started {
		cfg.Started = regions.RedisStarted(rs.Client)
	}
	s, err := regions.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	r.store, r.lim = s, sluice.NewLimiter(s)
}

// TestRestartedNodeBudget: a node restarted mid-window while its region's
// Redis is frozen has no record of what the region spent of the window:
// its failure policy's budget is nothing (not the safe share), until the
// Redis answers it; in a window that began after it started, the safe
// share (the clock is moved there).
func TestRestartedNodeBudget(t *testing.T) {
	t.Parallel()
	names := []string{"a", "b"}
	rs := setupOne(t, names)
	a := rs["a"]
	l := &sluice.Limit{Name: "g", Rate: 300, Period: 20 * time.Second, Global: true}
	start := windowStart(l.Period, 15*time.Second)
	if n := admitN(t, a, "k", l, 140); n != 140 {
		t.Fatalf("a admitted %d of 140", n)
	}
	a.srv.Freeze()
	var skew atomic.Int64
	restartNode(t, a, names, func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }, false)
	if left, ok := a.store.Budget("k", l); !ok || left != 0 {
		t.Errorf("restarted mid-window, its Redis frozen: budget %d %v, want 0 (not the safe share, 150)", left, ok)
	}
	if _, err := a.lim.Allow(context.Background(), "k", l); err == nil {
		t.Fatal("a decided with its Redis frozen")
	}
	if left, _ := a.store.Budget("k", l); left != 0 {
		t.Errorf("after a charge that failed: budget %d, want 0", left)
	}
	a.srv.Thaw()
	// The Redis answers: its count stands (what a had left, 10, and what
	// it was granted or gave back meanwhile).
	var d sluice.Decision
	waitFor(t, "the Redis to answer", func() bool {
		var err error
		d, err = a.lim.AllowN(context.Background(), "k", l, 0)
		return err == nil
	})
	if left, _ := a.store.Budget("k", l); left != d.Remaining || left > 160 {
		t.Errorf("after the Redis answered: budget %d, want what it has left, %d (about 10)", left, d.Remaining)
	}
	// A window that began after the node started: the safe share.
	skew.Store(int64(time.Until(start.Add(l.Period + time.Second))))
	if left, _ := a.store.Budget("k", l); left != 150 {
		t.Errorf("in a window that began after the node started: budget %d, want the safe share 150", left)
	}
}

// TestRestartedStoreAndNode: a region's Redis restarted empty mid-window
// and its node restarted too: nobody in the region remembers what it
// spent. The new node's first charge finds the Redis started in the
// window and charges the whole limit: the region admits only what it is
// granted from then on (nothing here: b holds its share, cut off), not
// its safe share again. In the next window, its safe share.
func TestRestartedStoreAndNode(t *testing.T) {
	t.Parallel()
	names := []string{"a", "b"}
	rs := setupOne(t, names)
	a, b := rs["a"], rs["b"]
	b.ledger.cut.Store(true) // b keeps its share: a's allocation stays 150
	l := &sluice.Limit{Name: "g", Rate: 300, Period: 10 * time.Second, Global: true}
	start := windowStart(l.Period, 7*time.Second)
	if n := admitN(t, a, "k", l, 100); n != 100 {
		t.Fatalf("a admitted %d of 100", n)
	}
	a.srv.Restart()
	restartNode(t, a, names, time.Now, true)
	if n := admitN(t, a, "k", l, 300); n > 50 {
		t.Errorf("its Redis restarted empty and its node restarted, a admitted %d more, above what it had left (150 − 100 = 50)", n)
	} else {
		t.Logf("a admitted %d more in the window", n)
	}
	if time.Since(start) > l.Period-time.Second {
		t.Skip("the test ran past its window on a busy machine")
	}
	time.Sleep(time.Until(start.Add(l.Period + 100*time.Millisecond)))
	if n := admitN(t, a, "k", l, 300); n != 150 {
		t.Errorf("in the next window a admitted %d, want its safe share 150", n)
	}
}
