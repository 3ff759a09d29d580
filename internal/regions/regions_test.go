package regions_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regions"
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
		charged += n.store.Stats.Charged.Load()
	}
	if charged != 500 {
		t.Fatalf("charged %d over the region's nodes, want 500 (L − the safe share)", charged)
	}
	// The safe share: 500, of which each node took one.
	d, err := nodes["a"][0].lim.AllowN(context.Background(), "k", l, 0)
	if err != nil || d.Remaining != 497 {
		t.Fatalf("remaining %d, %v; want 497 (the safe share less the three nodes' hits)", d.Remaining, err)
	}
}

// TestCutOff: a region cut off from the coordinator keeps its allocation
// to the end of the window, then falls back to its safe share; healed, it
// is granted again.
func TestCutOff(t *testing.T) {
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
	if g := nodes["b"][0].store.Stats.Granted.Load(); g == 0 {
		t.Error("no grant after healing")
	}
}
