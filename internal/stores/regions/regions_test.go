package regions_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/stores/regions"
	"github.com/sluicehq/sluice/internal/testsupport/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// cutLedger is a ledger whose calls fail while cut is set: a region cut
// off from the coordinator (the end-to-end test cuts a real link).
type cutLedger struct {
	regions.Ledger
	cut atomic.Bool
}

var errCut = errors.New("cut off")

func (l *cutLedger) Grant(ctx context.Context, e regions.Entry, want int64) (int64, error) {
	if l.cut.Load() {
		return 0, errCut
	}
	return l.Ledger.Grant(ctx, e, want)
}

func (l *cutLedger) GiveBack(ctx context.Context, e regions.Entry, x int64) error {
	if l.cut.Load() {
		return errCut
	}
	return l.Ledger.GiveBack(ctx, e, x)
}

type node struct {
	region string
	store  *regions.Store
	lim    *sluice.Limiter
	ledger *cutLedger
}

// setup starts a coordinator Redis and, per region, a Redis and nodes
// nodes over it.
func setup(t *testing.T, names []string, nodes int) map[string][]*node {
	t.Helper()
	coord := redistest.Standalone(t)
	cs, err := redisstore.New(redisstore.Config{URL: coord.URL(), Prefix: "coord:"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	out := map[string][]*node{}
	for _, r := range names {
		srv := redistest.Standalone(t)
		for range nodes {
			rs, err := redisstore.New(redisstore.Config{URL: srv.URL(), Prefix: "r:"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rs.Close() })
			led := &cutLedger{Ledger: &regions.RedisLedger{Client: cs.Client, Prefix: "coord:"}}
			s, err := regions.New(regions.Config{Next: rs, Region: r, Regions: names, Ledger: led, Now: time.Now,
				Interval: 50 * time.Millisecond, Nodes: func() int { return nodes }})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			out[r] = append(out[r], &node{region: r, store: s, lim: sluice.NewLimiter(s), ledger: led})
		}
	}
	return out
}

// count tallies the admissions of each window, per region.
type count struct {
	mu sync.Mutex
	m  map[int64]map[string]int64
}

func (c *count) add(w int64, r string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[int64]map[string]int64{}
	}
	if c.m[w] == nil {
		c.m[w] = map[string]int64{}
	}
	c.m[w][r]++
}

// drive sends, for d, requests to every node at rate (per second) of its
// region, and counts the admissions by the window of their time.
func drive(t *testing.T, nodes map[string][]*node, l *sluice.Limit, rates map[string]int, d time.Duration, c *count) {
	t.Helper()
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for r, ns := range nodes {
		for _, n := range ns {
			rate := rates[r] / len(ns)
			if rate == 0 {
				continue
			}
			wg.Go(func() {
				tick := time.NewTicker(time.Second / time.Duration(rate))
				defer tick.Stop()
				for time.Now().Before(stop) {
					<-tick.C
					before := time.Now()
					dec, err := n.lim.Allow(context.Background(), "tenant", l)
					after := time.Now()
					if err != nil {
						t.Error(err)
						return
					}
					// A decision within its latency of a window's end is
					// not counted in either (the store's window is not
					// known from outside).
					p := int64(l.Period)
					if before.UnixNano()/p != after.UnixNano()/p {
						continue
					}
					if dec.Allowed {
						c.add(before.UnixNano()/p, r)
					}
				}
			})
		}
	}
	wg.Wait()
}

// TestBound: under uneven demand, no window admits more than the limit
// across regions, the limit is reached, and the hot region gets most.
func TestBound(t *testing.T) {
	t.Parallel()
	names := []string{"a", "b", "c"}
	nodes := setup(t, names, 2)
	l := &sluice.Limit{Name: "global", Rate: 300, Period: 2 * time.Second, Global: true}
	var c count
	drive(t, nodes, l, map[string]int{"a": 360, "b": 20, "c": 20}, 7*time.Second, &c)
	windows := 0
	for w, per := range c.m {
		total := per["a"] + per["b"] + per["c"]
		t.Logf("window %d: a %d, b %d, c %d: %d of %d", w, per["a"], per["b"], per["c"], total, l.Rate)
		if total > l.Rate {
			t.Errorf("window %d admitted %d across regions, over the limit %d", w, total, l.Rate)
		}
		if total > l.Rate*8/10 {
			windows++
			if per["a"] < total*6/10 {
				t.Errorf("window %d: the hot region got %d of %d", w, per["a"], total)
			}
		}
	}
	if windows < 2 {
		t.Errorf("only %d windows reached 80%% of the limit; the test did not press it", windows)
	}
}

// TestChargedOnce: every node of a region readies the same window, and
// the region's share is charged once.
func TestChargedOnce(t *testing.T) {
	t.Parallel()
	nodes := setup(t, []string{"a", "b"}, 3)
	l := &sluice.Limit{Name: "g", Rate: 1000, Period: time.Minute, Global: true}
	var wg sync.WaitGroup
	for _, n := range nodes["a"] {
		wg.Go(func() {
			if _, err := n.lim.Allow(context.Background(), "k", l); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	var charged int64
	for _, n := range nodes["a"] {
		charged += n.store.Stats().Charged
	}
	if charged != 500 {
		t.Fatalf("charged %d over the region's nodes, want 500 (L − the safe share)", charged)
	}
	// The safe share: 500, of which each node took one (and gave back
	// what its demand will not need, on a slow machine).
	d, err := nodes["a"][0].lim.AllowN(context.Background(), "k", l, 0)
	var given int64
	for _, n := range nodes["a"] {
		given += n.store.Stats().GivenBack
	}
	if err != nil || d.Remaining+given != 497 {
		t.Fatalf("remaining %d, given back %d, %v; want 497 between them (the safe share less the three nodes' hits)", d.Remaining, given, err)
	}
}

// TestCutOff: a region cut off from the coordinator keeps its allocation
// to the end of the window, then falls back to its safe share; healed, it
// is granted again.
func TestCutOff(t *testing.T) {
	t.Parallel()
	names := []string{"a", "b"}
	nodes := setup(t, names, 1)
	l := &sluice.Limit{Name: "g", Rate: 400, Period: 2 * time.Second, Global: true}
	for _, n := range nodes["b"] {
		n.ledger.cut.Store(true)
	}
	var c count
	// Only b asks, and more than its share: cut off, it admits its safe
	// share (200) a window.
	drive(t, nodes, l, map[string]int{"b": 300}, 4500*time.Millisecond, &c)
	for w, per := range c.m {
		if per["b"] > 200 {
			t.Errorf("cut off, window %d admitted %d in b, over its safe share 200", w, per["b"])
		}
	}
	for _, n := range nodes["b"] {
		n.ledger.cut.Store(false)
	}
	var healed count
	drive(t, nodes, l, map[string]int{"b": 300}, 4500*time.Millisecond, &healed)
	most := int64(0)
	for w, per := range healed.m {
		t.Logf("healed, window %d: b %d", w, per["b"])
		most = max(most, per["b"])
		if per["b"] > l.Rate {
			t.Errorf("window %d: %d over the limit", w, per["b"])
		}
	}
	if most <= 250 {
		t.Errorf("healed, b admitted at most %d a window: not granted more than its share", most)
	}
	if g := nodes["b"][0].store.Stats().Granted; g == 0 {
		t.Error("no grant after healing")
	}
}

// region is one single-node region of setupOne, with its Redis.
type region struct {
	srv    *redistest.Server
	store  *regions.Store
	lim    *sluice.Limiter
	ledger *cutLedger
}

// setupOne starts a coordinator Redis and, per region, a Redis and one
// node over it, whose calls fail after a second of silence.
func setupOne(t *testing.T, names []string) map[string]*region {
	t.Helper()
	coord := redistest.Standalone(t)
	cs, err := redisstore.New(redisstore.Config{URL: coord.URL(), Prefix: "coord:"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	out := map[string]*region{}
	for _, r := range names {
		srv := redistest.Standalone(t)
		rs, err := redisstore.New(redisstore.Config{URL: srv.URL(), Prefix: "r:", Timeout: time.Second, BreakerCooldown: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rs.Close() })
		led := &cutLedger{Ledger: &regions.RedisLedger{Client: cs.Client, Prefix: "coord:"}}
		s, err := regions.New(regions.Config{Next: rs, Region: r, Regions: names, Ledger: led, Now: time.Now, Interval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		out[r] = &region{srv: srv, store: s, lim: sluice.NewLimiter(s), ledger: led}
	}
	return out
}

// windowStart returns the start of the current window of period p if at
// least left of it remains, else waits for the next one and returns its
// start.
func windowStart(p, left time.Duration) time.Time {
	now := time.Now()
	start := now.Truncate(p)
	if start.Add(p).Sub(now) < left {
		start = start.Add(p)
		time.Sleep(time.Until(start.Add(50 * time.Millisecond)))
	}
	return start
}

// admitN asks r for hits of l on key, one at a time, until it has
// admitted n or denied one, and returns how many it admitted. A failed
// call is asked again (a Redis coming back), at most 50 times.
func admitN(t *testing.T, r *region, key string, l *sluice.Limit, n int) int {
	t.Helper()
	admitted, failed := 0, 0
	for admitted < n {
		d, err := r.lim.Allow(context.Background(), key, l)
		switch {
		case err != nil && failed < 50:
			failed++
			time.Sleep(10 * time.Millisecond)
		case err != nil:
			t.Fatalf("%d calls failed: %v", failed, err)
		case !d.Allowed:
			return admitted
		default:
			admitted++
		}
	}
	return admitted
}

// TestBudget: what a region's local failure policy may spend of a global
// limit (Store.Budget) is what the region has left of its allocation as
// the node last learnt it: its safe share before it decided the key in
// the window, then what the store last answered (grants included), and
// after a give-back what it kept. A limit that is not global has no
// budget.
func TestBudget(t *testing.T) {
	t.Parallel()
	created := time.Now()
	rs := setupOne(t, []string{"a", "b"})
	a, b := rs["a"], rs["b"]
	l := &sluice.Limit{Name: "g", Rate: 300, Period: 20 * time.Second, Global: true}
	if _, ok := a.store.Budget("k", &sluice.Limit{Rate: 300, Period: time.Minute}); ok {
		t.Error("a limit that is not global has a budget")
	}
	if start := windowStart(l.Period, 15*time.Second); start.Before(created.Add(5 * time.Second)) {
		// A window that began before the node started: its budget is
		// nothing (TestRestartedNodeBudget). The next one.
		time.Sleep(time.Until(start.Add(l.Period + 50*time.Millisecond)))
	}
	if left, ok := a.store.Budget("k", l); !ok || left != 150 {
		t.Errorf("before any decision: budget %d %v, want the safe share, 150", left, ok)
	}
	// What the store has left, as a peek learns it, the budget then, and
	// what a was granted and gave back as of the peek (read on both
	// sides of it until no round moved anything between).
	left := func() (budget, store, granted, given int64) {
		t.Helper()
		for {
			g, b := a.store.Stats().Granted, a.store.Stats().GivenBack
			d, err := a.lim.AllowN(context.Background(), "k", l, 0)
			if err != nil {
				t.Fatal(err)
			}
			budget, _ = a.store.Budget("k", l)
			if g == a.store.Stats().Granted && b == a.store.Stats().GivenBack {
				return budget, d.Remaining, g, b
			}
		}
	}
	if n := admitN(t, a, "k", l, 40); n != 40 {
		t.Fatalf("a admitted %d of 40", n)
	}
	before, store, granted, given := left()
	if before != store || before < 110 {
		t.Errorf("after 40: budget %d, want what the store has left, %d, at least 110 (its share less 40, and what b gave it)", before, store)
	}
	// a goes quiet and b asks more than it holds: a gives back all but
	// what it needs, and its budget falls with it (and rises with any
	// grant meanwhile).
	waitFor(t, "a to give back", func() bool {
		admitN(t, b, "k", l, 5)
		return a.store.Stats().GivenBack > given
	})
	after, store, granted2, given2 := left()
	if want := before + (granted2 - granted) - (given2 - given); after != store || after != want {
		t.Errorf("a was granted %d and gave back %d: budget %d, want what its store has left, %d, and %d", granted2-granted, given2-given, after, store, want)
	}
}

// TestNoGiveBackAfterAFailure: a node whose region's store failed in a
// window gives nothing back of it, whatever another region asks: its
// local failure policy may have admitted what the store does not count
// yet. The next window, it does again.
func TestNoGiveBackAfterAFailure(t *testing.T) {
	t.Parallel()
	rs := setupOne(t, []string{"a", "b"})
	a, b := rs["a"], rs["b"]
	l := &sluice.Limit{Name: "g", Rate: 300, Period: 20 * time.Second, Global: true}
	start := windowStart(l.Period, 15*time.Second)
	if n := admitN(t, a, "k", l, 20); n != 20 {
		t.Fatalf("a admitted %d of 20", n)
	}
	a.srv.Freeze()
	if _, err := a.lim.Allow(context.Background(), "k", l); err == nil {
		t.Fatal("a decided with its Redis frozen")
	}
	a.srv.Thaw()
	// b asks more than its share until 4 s before the window's end;
	// a, quiet, gives nothing.
	got := 0
	for time.Since(start) < l.Period-4*time.Second {
		got += admitN(t, b, "k", l, 10)
		time.Sleep(20 * time.Millisecond)
	}
	if given := a.store.Stats().GivenBack; given != 0 {
		t.Errorf("a gave back %d in the window its Redis failed", given)
	}
	if got > 150 {
		t.Errorf("b admitted %d, more than its safe share 150, with a giving nothing back", got)
	}
	if time.Since(start) > l.Period {
		t.Skip("the test ran past its window on a busy machine")
	}
	// The next window: a gives back again.
	time.Sleep(time.Until(start.Add(l.Period + 50*time.Millisecond)))
	deadline := start.Add(2*l.Period - 2*time.Second)
	for a.store.Stats().GivenBack == 0 && time.Now().Before(deadline) {
		admitN(t, b, "k", l, 10)
		time.Sleep(20 * time.Millisecond)
	}
	if a.store.Stats().GivenBack == 0 {
		t.Error("a gave nothing back in the window after")
	}
}

// TestCountersLost: a region's Redis restarted empty mid-window. The node
// sees a decision above what the region had left, the key's charge marker
// gone, and charges the counter again for what the region had left: the
// region admits no more in the window than its allocation. (The decision
// taken on the lost counters fails, and the failure policy answers it.)
func TestCountersLost(t *testing.T) {
	t.Parallel()
	rs := setupOne(t, []string{"a", "b"})
	a, b := rs["a"], rs["b"]
	b.ledger.cut.Store(true) // b keeps its share: a's allocation stays 150
	l := &sluice.Limit{Name: "g", Rate: 300, Period: 20 * time.Second, Global: true}
	start := windowStart(l.Period, 15*time.Second)
	if n := admitN(t, a, "k", l, 100); n != 100 {
		t.Fatalf("a admitted %d of 100", n)
	}
	a.srv.Restart()
	// At most 50 (150 − 100), less a hit for the decision taken on the
	// lost counters, which the store counts though it failed (and a hit
	// for any call that failed here but reached Redis).
	if n := admitN(t, a, "k", l, 300); n > 50 || n < 40 {
		t.Errorf("after its Redis restarted empty, a admitted %d more, want at most 50, what it had left (150 − 100), and most of it", n)
	}
	if lost := a.store.Stats().Lost; lost != 1 {
		t.Errorf("%d keys' counters seen lost, want 1", lost)
	}
	if left, _ := a.store.Budget("k", l); left != 0 {
		t.Errorf("budget %d after, want 0", left)
	}
	if c, _, err := b.store.Allocation(context.Background(), "k", l); err != nil || c != 150 {
		t.Errorf("b's allocation %d, want its safe share 150", c)
	}
	if time.Since(start) > l.Period-time.Second {
		t.Skip("the test ran past its window on a busy machine")
	}
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
