package lease_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/fault"
	"github.com/sluicehq/sluice/internal/testsupport/redistest"
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
		grants += nodes[i].Stats().Grants
		refused += nodes[i].Stats().Refused
	}
	granting := grants - refused
	var local int64
	for _, nd := range nodes {
		local += nd.Stats().Local
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

// silentNode is a lease store over a Redis store client of srv with
// timeout T, no registry heartbeat, and a breaker that opens after
// failures failed calls.
func silentNode(t *testing.T, srv *redistest.Server, timeout time.Duration, failures int) (*lease.Store, *redisstore.Store) {
	t.Helper()
	rs, err := redisstore.New(redisstore.Config{URL: srv.URL(), Prefix: fmt.Sprintf("silent-%d:", time.Now().UnixNano()),
		Timeout: timeout, BreakerFailures: failures, Heartbeat: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	node := lease.New(rs, lease.Config{})
	// A first grant loads the function library; under the race detector
	// on a busy machine it may take a while.
	l := &sluice.Limit{Name: "warm", Rate: 1000, Period: time.Hour, LeaseOvershoot: 100}
	redistest.WaitFor(t, "a first grant", func() bool {
		return node.Take(context.Background(), []sluice.Hit{{Key: "warm", Limit: l, Cost: 1}}, make([]sluice.Decision, 1)) == nil
	})
	return node, rs
}

// takeAll starts n Takes of one hit of key on node at once, after the
// first's call is in flight on rs (so the others find its grant waiting),
// and returns when each returned and its error.
func takeAll(t *testing.T, node *lease.Store, rs *redisstore.Store, l *sluice.Limit, key string, n int) ([]time.Time, []error) {
	t.Helper()
	done := make([]time.Time, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	take := func(i int) {
		wg.Go(func() {
			errs[i] = node.Take(context.Background(), []sluice.Hit{{Key: key, Limit: l, Cost: 1}}, make([]sluice.Decision, 1))
			done[i] = time.Now()
		})
	}
	take(0)
	redistest.WaitFor(t, "the first grant in flight", func() bool { return rs.Stats().InFlight == 1 })
	for i := 1; i < n; i++ {
		take(i)
	}
	wg.Wait()
	return done, errs
}

// TestRedisSilentOneCall: when Redis stops answering (SIGSTOP), a hit
// waits for one call to it at most: the hits that find a grant in flight
// fail with it, and the hit that asked for it fails with it too, to the
// failure policy, rather than ask the store again. So one call fails,
// and every hit with it, as soon as it is found silent: within about
// twice the timeout, as a hit that does not lease.
func TestRedisSilentOneCall(t *testing.T) {
	// A call after the first, on a new connection, fails the timeout
	// later (its deadline for connecting).
	const timeout = time.Second
	// The slack covers the scheduling of the goroutines and how late the
	// connection's timers fire on a busy machine under the race detector:
	// tens of milliseconds, and 200ms seen beside a CPU hog. A whole
	// timeout covers them many times over; the count of failed calls
	// below tells one call from two whatever the machine.
	const slack = timeout
	srv := redistest.Standalone(t)
	node, rs := silentNode(t, srv, timeout, 0)
	l := &sluice.Limit{Name: "silent", Rate: 1_000_000, Period: time.Hour, LeaseOvershoot: 1000}
	srv.Freeze()
	stopped := time.Now()
	done, errs := takeAll(t, node, rs, l, "k", 16)
	for i, err := range errs {
		if r := fault.ReasonOf(err); err == nil || (r != fault.Timeout && r != fault.Unreachable) {
			t.Errorf("hit %d: %v (reason %s), want the store's failure: timeout or unreachable", i, err, r)
		}
		if took := done[i].Sub(stopped); took > 2*timeout+slack {
			t.Errorf("hit %d failed %v after Redis stopped, with a %v timeout", i, took.Round(time.Millisecond), timeout)
		}
	}
	t.Logf("the hits failed %v to %v after Redis stopped",
		slices.MinFunc(done, time.Time.Compare).Sub(stopped).Round(time.Millisecond),
		slices.MaxFunc(done, time.Time.Compare).Sub(stopped).Round(time.Millisecond))
	if n := rs.Stats().Errors; n != 1 {
		t.Errorf("%d calls failed, want 1: the one grant", n)
	}
}

// TestRedisBreakerOpenNoWait: while the breaker is open and lets a probe
// through, the probe may be a grant, which waits for Redis; the other
// hits of its key are answered at once (breaker_open), as hits that do not
// lease, not held behind it.
func TestRedisBreakerOpenNoWait(t *testing.T) {
	// The probe fails when connecting does: the timeout.
	const timeout = time.Second
	srv := redistest.Standalone(t)
	node, rs := silentNode(t, srv, timeout, 1)
	l := &sluice.Limit{Name: "probe", Rate: 1_000_000, Period: time.Hour, LeaseOvershoot: 1000}
	srv.Freeze()
	// One failed grant opens the breaker; after its cooldown (200ms), the
	// next call is the probe.
	if err := node.Take(context.Background(), []sluice.Hit{{Key: "k", Limit: l, Cost: 1}}, make([]sluice.Decision, 1)); err == nil {
		t.Fatal("a grant decided while Redis is stopped")
	}
	redistest.WaitFor(t, "the breaker open", func() bool { return rs.Stats().BreakerState == 2 })
	time.Sleep(300 * time.Millisecond)
	done, errs := takeAll(t, node, rs, l, "k", 9)
	if rs.Stats().BreakerState == 0 {
		t.Fatal("the probe closed the breaker: Redis answered")
	}
	for i := 1; i < len(done); i++ {
		if r := fault.ReasonOf(errs[i]); errs[i] == nil || r != fault.BreakerOpen {
			t.Errorf("hit %d: %v (reason %s), want breaker_open", i, errs[i], r)
		}
		// The probe's failure comes the timeout after it went; the
		// slack for a busy machine is half of it.
		if early := done[0].Sub(done[i]); early < timeout/2 {
			t.Errorf("hit %d answered %v before the probe: held behind it", i, early.Round(time.Millisecond))
		}
	}
	if fault.ReasonOf(errs[0]) == fault.BreakerOpen {
		t.Errorf("the probe: %v, want Redis's failure", errs[0])
	}
}
