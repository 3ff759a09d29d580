package lease_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/storetest"
)

var epoch = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

// TestConformance: limits that do not lease pass through a lease store
// unchanged: the whole store contract holds.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock) sluice.Store {
		m := memstore.New(memstore.Config{Now: clock.Now, SweepInterval: -1})
		t.Cleanup(func() { m.Close() })
		return lease.New(m, lease.Config{Now: func() time.Duration { return clock.Now().Sub(epoch) }, Go: inline})
	})
}

// cluster is n lease stores, the nodes, over one shared store on a
// virtual clock: the shared store stands for Redis, each lease store for
// one sluice serve.
type cluster struct {
	clock *storetest.Clock
	mem   *memstore.Store
	nodes []*lease.Store
	calls *countingStore
}

// countingStore counts the calls that reach the shared store.
type countingStore struct {
	mu    sync.Mutex
	next  *memstore.Store
	calls int
}

func (c *countingStore) Take(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	c.mu.Lock()
	c.calls++
	c.mu.Unlock()
	return c.next.Take(ctx, hits, out)
}

func (c *countingStore) TakeEach(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	c.mu.Lock()
	c.calls++
	c.mu.Unlock()
	return c.next.TakeEach(ctx, hits, out)
}

func newCluster(t *testing.T, n int) *cluster {
	t.Helper()
	c := &cluster{clock: storetest.NewClock(epoch)}
	c.mem = memstore.New(memstore.Config{Now: c.clock.Now, SweepInterval: -1})
	t.Cleanup(func() { c.mem.Close() })
	c.calls = &countingStore{next: c.mem}
	for range n {
		c.nodes = append(c.nodes, lease.New(c.calls, lease.Config{Now: func() time.Duration { return c.clock.Now().Sub(epoch) }, Go: inline}))
	}
	return c
}

func (c *cluster) take(t *testing.T, node int, h sluice.Hit) sluice.Decision {
	t.Helper()
	var out [1]sluice.Decision
	if err := c.nodes[node].Take(context.Background(), []sluice.Hit{h}, out[:]); err != nil {
		t.Fatal(err)
	}
	return out[0]
}

// TestHotKeyFewCalls: one node hammering one key of a fixed window decides
// most hits from its lease: the calls to the store are a small share of
// the decisions, the window admits its limit (less what leases left to
// expire, within the bound), and the next window starts afresh.
func TestHotKeyFewCalls(t *testing.T) {
	c := newCluster(t, 1)
	l := &sluice.Limit{Name: "hot", Rate: 10_000, Period: time.Minute, LeaseOvershoot: 200}
	c.clock.Set(epoch.Truncate(time.Minute))
	admitted, callsAtLast, asksAtLast := 0, 0, 0
	var waited int64 // grants made while a hit waited, until the last admission
	for i := range 20_000 {
		c.clock.Advance(2 * time.Millisecond) // 20,000 over 40 s
		if c.take(t, 0, sluice.Hit{Key: "k", Limit: l, Cost: 1}).Allowed {
			admitted++
			callsAtLast, asksAtLast = c.calls.calls, i+1
			st := c.nodes[0].Stats()
			waited = st.Grants - st.Renewals
		}
	}
	// Never beyond the limit; short of it by at most what expired
	// unspent in leases, within the lease bound.
	if admitted > 10_000 || admitted < 10_000-200 {
		t.Errorf("%d admitted in the window, want between 9,800 and 10,000", admitted)
	}
	// The admitted hits cost few calls; the denials after are about one
	// call each (the local cache in front of a lease store answers those).
	st := c.nodes[0].Stats()
	if ratio := float64(callsAtLast) / float64(asksAtLast); ratio > 0.05 {
		t.Errorf("%d calls for the first %d decisions, %d admitted (%.3f a decision), want under 0.05", callsAtLast, asksAtLast, admitted, ratio)
	}
	denials := 20_000 - asksAtLast
	if calls := c.calls.calls - callsAtLast; float64(calls) > 1.1*float64(denials) {
		t.Errorf("%d calls for %d denials", calls, denials)
	}
	t.Logf("%d admitted; %d calls for the first %d decisions, %d for the %d after; %d grant calls (%d renewals made ahead), %d hits granted, %d from leases, %d expired unspent, %d decided by the store",
		admitted, callsAtLast, asksAtLast, c.calls.calls-callsAtLast, denials, st.Grants, st.Renewals, st.Granted, st.Local, st.Expired, st.Fallback)
	// A lease running low is renewed ahead: the hits that waited for a
	// grant are the first few, while grants grow from one hit, and the
	// ones after the window ran out (each a refused grant).
	if waited > 10 {
		t.Errorf("%d hits waited for a grant before the window ran out, want at most 10 (the ramp from one hit)", waited)
	}
	c.clock.Set(epoch.Truncate(time.Minute).Add(time.Minute))
	if !c.take(t, 0, sluice.Hit{Key: "k", Limit: l, Cost: 1}).Allowed {
		t.Error("the next window denied its first hit")
	}
}

// TestHotKeyDeniedEach: on a key out of room, decided one by one
// (TakeEach, as the RLS server asks), a refused grant of the hit's own
// cost holds off the next grant as any refused grant does: the store
// decides the denials about one call each, not a grant and a call each.
func TestHotKeyDeniedEach(t *testing.T) {
	c := newCluster(t, 1)
	l := &sluice.Limit{Name: "hot", Rate: 1_000, Period: time.Minute, LeaseOvershoot: 200}
	c.clock.Set(epoch.Truncate(time.Minute))
	each := func() sluice.Decision {
		var out [1]sluice.Decision
		if err := c.nodes[0].TakeEach(context.Background(), []sluice.Hit{{Key: "k", Limit: l, Cost: 1}}, out[:]); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	admitted := 0
	for range 2_000 {
		c.clock.Advance(time.Millisecond)
		if each().Allowed {
			admitted++
		}
	}
	if admitted > 1_000 {
		t.Fatalf("%d admitted, limit 1,000", admitted)
	}
	calls, grants := c.calls.calls, c.nodes[0].Stats().Grants
	const denials = 10_000
	for range denials {
		c.clock.Advance(time.Millisecond / 4)
		if each().Allowed {
			t.Fatal("a hit admitted after the window ran out")
		}
	}
	calls, grants = c.calls.calls-calls, c.nodes[0].Stats().Grants-grants
	t.Logf("%d denials: %d calls, %d of them grants", denials, calls, grants)
	if float64(calls) > 1.1*denials {
		t.Errorf("%d calls for %d denials (%d grants), want at most 1.1 a denial", calls, denials, grants)
	}
}

// TestFullSweepsBounded: a node whose leases are all held (MaxLeases),
// none expired, under a flood of new keys decides them in the store and
// looks for expired leases at most once a second, not on every hit (a
// hostile client spraying keys made every decision walk the whole table);
// once leases have expired, new keys lease again.
func TestFullSweepsBounded(t *testing.T) {
	c := &cluster{clock: storetest.NewClock(epoch.Truncate(time.Hour))}
	c.mem = memstore.New(memstore.Config{Now: c.clock.Now, SweepInterval: -1})
	t.Cleanup(func() { c.mem.Close() })
	c.calls = &countingStore{next: c.mem}
	node := lease.New(c.calls, lease.Config{Now: func() time.Duration { return c.clock.Now().Sub(epoch) }, Go: inline, MaxLeases: 100})
	c.nodes = []*lease.Store{node}
	l := &sluice.Limit{Name: "w", Rate: 100_000, Period: time.Hour, LeaseOvershoot: 1000}
	for i := range 100 {
		c.take(t, 0, sluice.Hit{Key: fmt.Sprint("held", i), Limit: l, Cost: 1})
	}
	calls := c.calls.calls
	const flood = 10_000
	for i := range flood {
		c.clock.Advance(time.Millisecond) // 10 s
		if !c.take(t, 0, sluice.Hit{Key: fmt.Sprint("new", i), Limit: l, Cost: 1}).Allowed {
			t.Fatal("a hit denied far below the limit")
		}
	}
	if n := c.calls.calls - calls; n != flood {
		t.Errorf("%d store calls for %d hits of new keys on a full node, want one each", n, flood)
	}
	if n := node.Sweeps(); n > 11 {
		t.Errorf("%d sweeps over 10 s of hits on a full node, want at most 11 (one a second)", n)
	}
	if g := node.Stats().Grants; g != 100 {
		t.Errorf("%d grants, want the 100 of the held keys alone", g)
	}
	// The window ends: the leases expire, a sweep frees them, and a new
	// key is granted a lease again.
	c.clock.Set(epoch.Truncate(time.Hour).Add(time.Hour + time.Second))
	c.take(t, 0, sluice.Hit{Key: "after", Limit: l, Cost: 1})
	if g := node.Stats().Grants; g != 101 {
		t.Errorf("%d grants after the leases expired, want 101: no lease for a new key", g)
	}
}

// demand is a random trace of hits over n nodes: at each step, a node
// (chosen unevenly: node 0 most often) asks for a hit of cost 1 or 2.
type demand struct {
	rng *rand.Rand
	n   int
}

func (d demand) node() int {
	// Node 0 half the time, the others share the rest.
	if d.rng.IntN(2) == 0 || d.n == 1 {
		return 0
	}
	return 1 + d.rng.IntN(d.n-1)
}

// TestBucketOvershootBound: on a GCRA, a token bucket and a leaky bucket
// shared by 4 nodes with uneven demand, no interval admits more than the
// limit's own bound (its burst and its rate over the interval) plus the
// lease bound U; and the bound is tight enough to mean something: with
// leases some interval admits beyond the limit's own bound.
func TestBucketOvershootBound(t *testing.T) {
	for _, alg := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyBucket} {
		t.Run(alg.String(), func(t *testing.T) {
			const u = 400
			l := &sluice.Limit{Name: "b", Algorithm: alg, Rate: 1000, Period: time.Second, Burst: 100, LeaseOvershoot: u}
			c := newCluster(t, 4)
			d := demand{rng: rand.New(rand.NewPCG(7, uint64(alg))), n: 4}
			type adm struct {
				at time.Duration
				n  int64
			}
			var log []adm
			steps := 0
			ask := func(node int) {
				steps++
				cost := int64(1 + d.rng.IntN(2))
				if c.take(t, node, sluice.Hit{Key: "k", Limit: l, Cost: cost}).Allowed {
					log = append(log, adm{c.clock.Now().Sub(epoch), cost})
				}
			}
			// Cycles of uneven demand: a steady phase well below the rate
			// on every node (node 0 most), in which leases grow; a pause
			// shorter than a lease's life, in which the bucket refills
			// while leases sit unspent; then a burst from every node at
			// ten times the rate, which spends both.
			for range 300 {
				for range 60 { // 200 ms at ~300 asks a second
					c.clock.Advance(time.Duration(2000+d.rng.IntN(2667)) * time.Microsecond)
					ask(d.node())
				}
				c.clock.Advance(time.Duration(5+d.rng.IntN(10)) * time.Millisecond)
				for range 200 { // 20 ms at ~10,000 a second
					c.clock.Advance(time.Duration(d.rng.IntN(200)) * time.Microsecond)
					ask(d.rng.IntN(4))
				}
			}
			// Every interval [log[i].at, log[j].at]: admitted ≤ burst +
			// rate·len + U. The worst excess over the limit's own bound
			// is found with two pointers over the sorted log.
			var worst float64
			for i := range log {
				var sum int64
				for j := i; j < len(log); j++ {
					sum += log[j].n
					span := (log[j].at - log[i].at).Seconds()
					if span > 2 {
						break
					}
					own := float64(l.Burst) + float64(l.Rate)*span
					worst = max(worst, float64(sum)-own)
				}
			}
			if worst > u {
				t.Errorf("an interval admitted %.1f beyond the limit's own bound; the lease bound is %d", worst, u)
			}
			if worst <= 0 {
				t.Errorf("no interval admitted beyond the limit's own bound: the trace does not exercise the leases' bound")
			}
			calls := c.calls.calls
			st := nodeStats(c)
			granted := st.grants - st.refused
			t.Logf("%d admissions (%d from leases), %d store calls for %d decisions (%d grants, %d grant calls refused), worst excess %.1f (bound %d)",
				len(log), st.local, calls, steps, granted, st.refused, worst, u)
			// The admissions come from leases, a grant for every few of
			// them (the bursts empty the bucket, so grants there are
			// small); the denials in the bursts cost a call each (a
			// refused grant of their cost, whose answer is theirs).
			if float64(granted) > 0.4*float64(len(log)) {
				t.Errorf("%d grants for %d admissions: the leases spared little", granted, len(log))
			}
		})
	}
}

// TestWindowNeverOver: a fixed window and a sliding window shared by 4
// nodes never admit more than the limit in a window, and a saturated
// fixed window admits at least its limit less what the nodes' leases may
// hold unspent when it ends (⌈U/4⌉ a node).
func TestWindowNeverOver(t *testing.T) {
	for _, alg := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			const u, rate = 50, 1000
			l := &sluice.Limit{Name: "w", Algorithm: alg, Rate: rate, Period: time.Second, LeaseOvershoot: u}
			c := newCluster(t, 4)
			c.clock.Set(epoch.Truncate(time.Second))
			d := demand{rng: rand.New(rand.NewPCG(11, uint64(alg))), n: 4}
			per := map[int64]int64{}
			for range 30_000 {
				c.clock.Advance(time.Duration(d.rng.IntN(500)) * time.Microsecond)
				at := c.clock.Now()
				if c.take(t, d.node(), sluice.Hit{Key: "k", Limit: l, Cost: 1}).Allowed {
					per[at.UnixNano()/int64(time.Second)]++
				}
			}
			windows := 0
			for w, n := range per {
				if alg == sluice.FixedWindow && n > rate {
					t.Errorf("window %d admitted %d, over the limit of %d", w, n, rate)
				}
				windows++
			}
			if alg == sluice.FixedWindow {
				// Demand is ~4,000 a second: every full window but the
				// first and last is saturated.
				// Unspent at a window's end: at most b = ⌈U/4⌉ a node.
				held := int64(4 * ((u + 3) / 4))
				for w, n := range per {
					if per[w-1] > 0 && per[w+1] > 0 && n < rate-held {
						t.Errorf("window %d admitted %d: below the limit less what 4 leases may hold (%d)", w, n, rate-held)
					}
				}
			}
			t.Logf("%d windows, %d store calls for 30,000 decisions", windows, c.calls.calls)
		})
	}
}

// TestWindowCostsKeepRemainders: hits that cost more than one on a
// window (costs of 100, and of 1 to 400, over three nodes) lose no more
// than ⌈U/4⌉ a node of the window's limit: what a lease has left too
// small for a hit goes into the next grant, not away (each grant dropped
// it: about 11% of the limit was never admitted).
func TestWindowCostsKeepRemainders(t *testing.T) {
	for _, tc := range []struct {
		name     string
		min, max int64
	}{{"cost 100", 100, 100}, {"costs 1 to 400", 1, 400}} {
		t.Run(tc.name, func(t *testing.T) {
			const limit, u, nodes = 100_000, 1000, 3
			l := &sluice.Limit{Name: "w", Rate: limit, Period: time.Hour, LeaseOvershoot: u}
			c := newCluster(t, nodes)
			c.clock.Set(epoch.Truncate(time.Hour))
			rng := rand.New(rand.NewPCG(3, uint64(tc.max)))
			var admitted int64
			denied := 0
			for i := 0; denied < 1000; i++ {
				c.clock.Advance(time.Millisecond)
				cost := tc.min + rng.Int64N(tc.max-tc.min+1)
				if c.take(t, i%nodes, sluice.Hit{Key: "k", Limit: l, Cost: cost}).Allowed {
					admitted += cost
				} else if cost == tc.min {
					denied++ // the smallest hit denied: the window is spent
				}
			}
			var expired int64
			for _, n := range c.nodes {
				expired += n.Stats().Expired
			}
			b := int64((u + 3) / 4)
			t.Logf("%d of %d admitted, %d expired in leases", admitted, limit, expired)
			if admitted > limit {
				t.Errorf("%d admitted, over the limit of %d", admitted, limit)
			}
			// Left in leases at most b a node, plus what a node's last
			// hits could not use of it (less than a hit each).
			if admitted < limit-nodes*(b+tc.max) {
				t.Errorf("%d admitted of %d: more lost than ⌈U/4⌉ = %d a node (and a hit's cost)", admitted, limit, b)
			}
		})
	}
}

// TestAllOrNothing: a request whose leased hit is covered but whose other
// hit the store denies consumes neither: the lease keeps its units.
func TestAllOrNothing(t *testing.T) {
	c := newCluster(t, 1)
	leased := &sluice.Limit{Name: "l", Rate: 1000, Period: time.Hour, LeaseOvershoot: 100}
	strict := &sluice.Limit{Name: "s", Rate: 1, Period: time.Hour}
	ctx := context.Background()
	out := make([]sluice.Decision, 2)
	// Warm the lease.
	for range 10 {
		if err := c.nodes[0].Take(ctx, []sluice.Hit{{Key: "a", Limit: leased, Cost: 1}}, out[:1]); err != nil || !out[0].Allowed {
			t.Fatal(out[0], err)
		}
	}
	if err := c.nodes[0].Take(ctx, []sluice.Hit{{Key: "a", Limit: leased, Cost: 1}, {Key: "b", Limit: strict, Cost: 1}}, out); err != nil || !out[0].Allowed || !out[1].Allowed {
		t.Fatalf("first pair: %+v %v", out, err)
	}
	before := c.nodes[0].Stats().Local
	if err := c.nodes[0].Take(ctx, []sluice.Hit{{Key: "a", Limit: leased, Cost: 1}, {Key: "b", Limit: strict, Cost: 1}}, out); err != nil || out[1].Allowed {
		t.Fatalf("second pair: %+v %v, want the strict limit to deny", out, err)
	}
	if got := c.nodes[0].Stats().Local; got != before {
		t.Errorf("a denied request still counted %d hits from the lease", got-before)
	}
	// What the lease held is all there: 1,000 in the hour, 12 taken so far
	// (10 + 1 + the released one not), so 989 more.
	n := 0
	for range 2000 {
		if err := c.nodes[0].Take(ctx, []sluice.Hit{{Key: "a", Limit: leased, Cost: 1}}, out[:1]); err != nil {
			t.Fatal(err)
		}
		if out[0].Allowed {
			n++
		}
	}
	if n != 1000-11 {
		t.Errorf("%d more admitted, want %d: the denied request consumed from the lease", n, 1000-11)
	}
}

// TestCrashedNode: a node that dies with its leases unspent costs the
// others at most the lease bound, and only until the leases expire.
func TestCrashedNode(t *testing.T) {
	const u = 60
	l := &sluice.Limit{Name: "c", Algorithm: sluice.GCRA, Rate: 100, Period: time.Second, Burst: 100, LeaseOvershoot: u}
	c := newCluster(t, 2)
	for range 50 {
		c.take(t, 0, sluice.Hit{Key: "k", Limit: l, Cost: 1})
		c.clock.Advance(time.Millisecond)
	}
	// Node 0 crashes: its lease is never spent. Node 1 asks for all it can
	// get at once: the bucket less what node 0 held.
	got := 0
	for range 200 {
		if c.take(t, 1, sluice.Hit{Key: "k", Limit: l, Cost: 1}).Allowed {
			got++
		}
	}
	held := 100 - 50 - got // the bucket's 100 (and ~5 refilled), less node 0's 50 spent and node 1's
	if held > u {
		t.Errorf("node 1 got %d: node 0's dead lease held %d, over the bound %d", got, held, u)
	}
	// After the lease lifetime, the bucket refills as if node 0 had spent
	// its lease then: node 1 gets the refill.
	c.clock.Advance(2 * time.Second)
	got = 0
	for range 200 {
		if c.take(t, 1, sluice.Hit{Key: "k", Limit: l, Cost: 1}).Allowed {
			got++
		}
	}
	if got < 100-u {
		t.Errorf("2 s after the crash node 1 got %d of a full bucket of 100", got)
	}
}

// TestNoLease: a bound under 2 leaves a lease no life: every hit is
// decided by the store, one call each.
func TestNoLease(t *testing.T) {
	c := newCluster(t, 1)
	l := &sluice.Limit{Name: "n", Rate: 1000, Period: time.Hour, LeaseOvershoot: 1}
	for i := range 100 {
		if !c.take(t, 0, sluice.Hit{Key: fmt.Sprint("k", i%3), Limit: l, Cost: 1}).Allowed {
			t.Fatal("denied")
		}
	}
	if c.calls.calls != 100 {
		t.Errorf("%d calls for 100 decisions, want 100", c.calls.calls)
	}
}

type sums struct{ local, grants, refused int64 }

func nodeStats(c *cluster) sums {
	var s sums
	for _, n := range c.nodes {
		s.local += n.Stats().Local
		s.grants += n.Stats().Grants
		s.refused += n.Stats().Refused
	}
	return s
}

// TestPassThroughAllocs: a limit that does not lease costs nothing more in
// front of the store: no allocation of the lease store's own.
func TestPassThroughAllocs(t *testing.T) {
	m := memstore.New(memstore.Config{SweepInterval: -1})
	defer m.Close()
	ls := lease.New(m, lease.Config{})
	l := &sluice.Limit{Name: "p", Rate: 1 << 30, Period: time.Hour}
	hits := []sluice.Hit{{Key: "k", Limit: l, Cost: 1}}
	out := make([]sluice.Decision, 1)
	ctx := context.Background()
	direct := testing.AllocsPerRun(200, func() { m.Take(ctx, hits, out) })
	through := testing.AllocsPerRun(200, func() { ls.Take(ctx, hits, out) })
	each := testing.AllocsPerRun(200, func() { ls.TakeEach(ctx, hits, out) })
	if through > direct || each > direct {
		t.Errorf("allocations a decision: %v through the lease store (%v one by one), %v directly", through, each, direct)
	}
}

// inline runs a lease store's renewals at once, in the call that asked:
// tests on a virtual clock stay deterministic.
func inline(f func()) { f() }

// TestRenewalKeepsNothingOfTheCaller: a caller may reuse its hits as soon
// as Take returns, while renewals run in the background (real goroutines
// here). Under -race, a renewal that read the caller's hit would be
// reported: the hits below are rewritten right after every call.
func TestRenewalKeepsNothingOfTheCaller(t *testing.T) {
	m := memstore.New(memstore.Config{SweepInterval: -1})
	defer m.Close()
	ls := lease.New(m, lease.Config{})
	a := &sluice.Limit{Name: "a", Rate: 1_000_000, Period: time.Hour, LeaseOvershoot: 400}
	b := &sluice.Limit{Name: "b", Algorithm: sluice.GCRA, Rate: 1_000_000, Period: time.Hour, Burst: 1000, LeaseOvershoot: 400}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			hits := make([]sluice.Hit, 1)
			out := make([]sluice.Decision, 1)
			for i := range 2000 {
				hits[0] = sluice.Hit{Key: fmt.Sprint("k", g), Limit: a, Cost: 1}
				if i%2 == 1 {
					hits[0].Limit = b
				}
				if err := ls.Take(context.Background(), hits, out); err != nil {
					t.Error(err)
					return
				}
				hits[0] = sluice.Hit{} // the caller reuses its slice
			}
		})
	}
	wg.Wait()
	if ls.Stats().Renewals == 0 {
		t.Fatal("no renewal ran: the test tests nothing")
	}
}
