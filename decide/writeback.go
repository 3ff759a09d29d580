package decide

import (
	"context"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/base/algo"

	"github.com/sluicehq/sluice"
)

// What the local failure policy admits is written back to the store when
// it answers again: a store that comes back must not hand out the quota
// that the nodes spent while it could not decide.
//
// The policy records, per key and limit, the hits it admitted (their own
// cost, not multiplied by the number of nodes). The first request that the
// store decides after that starts one write-back in the background: every
// record still in force is charged to the store as a debit, the way a cost
// known after the response is (sluice.Limit.Debit, decided one by one), so
// that it counts even when it takes the key over its limit, and the next
// requests see it. A request that the store is to decide first charges the
// records of its own keys, and waits for a write-back that holds one of
// them, so that the store never decides a key before it counts what this
// node's policy admitted of it (a write-back that fails leaves the request
// to the policy). Other requests never wait for it.
//
// A record is in force while what it spent still bounds admissions had the
// store counted it: until the end of its window for a fixed window; two
// periods for a sliding window or a sketch (the window it fell in and the
// next, whose estimate weighs the previous one); one period for a sliding
// log; for the bucket algorithms, the time the limit takes to refill what
// was spent (at most the whole burst) plus one refill interval. Charged
// later, a bucket's hits are more than it would hold had it counted them at
// once, never less: the write-back may deny a little early, never admit
// beyond the limit. Windows are told by this process's clock, so a write-back
// within the clocks' skew of a window's end may fall in the next window.
//
// The ledger holds at most maxLedger records; the hits admitted on further
// keys during one outage are not written back (Dropped counts them). A
// write-back that fails keeps its records for the next one.
const maxLedger = 1 << 16

type ledgerKey struct {
	key   string
	limit *sluice.Limit
}

type ledgerEntry struct {
	cost   int64 // hits admitted, saturated at MaxCost
	window int64 // a fixed window's index
	until  int64 // Unix nanoseconds after which the hits no longer bound anything
}

// ledger is the local policy's record of what it admitted.
type ledger struct {
	mu       sync.Mutex
	m        map[ledgerKey]ledgerEntry
	flying   map[ledgerKey]inFlight // records being written back
	dropped  atomic.Int64
	written  atomic.Int64 // keys written back first by requests, not logged yet (startWriteBack logs them)
	hits     atomic.Int64 // and their hits
	pending  atomic.Bool  // m or flying has records
	flushing atomic.Bool  // a background write-back runs
	watching atomic.Bool  // watchWriteBack's loop runs
	retryAt  atomic.Int64 // after a failed write-back, none before this (Unix ns)
}

// writeBackRetry is how long a failed write-back waits before the next: the
// store may answer some requests (a node-local cache of keys over their
// limit) while it still cannot take the write-back.
const writeBackRetry = time.Second

// record adds the hits the local policy consumed at now: hit i when
// consumed(i).
func (g *ledger) record(hits []sluice.Hit, consumed func(int) bool, now int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := range hits {
		h := &hits[i]
		if h.Cost <= 0 || !consumed(i) {
			continue
		}
		window, until := horizon(h.Limit, h.Cost, now)
		k := ledgerKey{h.Key, h.Limit}
		e, ok := g.m[k]
		switch {
		case ok && e.window == window:
			e.cost = min(e.cost+h.Cost, sluice.MaxCost)
			e.until = max(e.until, until)
		case !ok && len(g.m) >= maxLedger:
			g.dropped.Add(h.Cost)
			continue
		default:
			if !ok {
				if g.m == nil {
					g.m = make(map[ledgerKey]ledgerEntry)
				}
				k.key = strings.Clone(k.key)
			}
			e = ledgerEntry{cost: h.Cost, window: window, until: until}
		}
		g.m[k] = e
	}
	g.update()
}

// update sets pending. g.mu is held.
func (g *ledger) update() { g.pending.Store(len(g.m) > 0 || len(g.flying) > 0) }

// horizon returns, for cost hits of l admitted at now, a fixed window's
// index (0 for the other algorithms) and the time until which they bound
// admissions (see maxLedger's comment).
func horizon(l *sluice.Limit, cost, now int64) (window, until int64) {
	p := max(int64(l.Period), 1)
	var d float64
	switch l.Algorithm {
	case sluice.FixedWindow:
		window = now / p
		return window, satAdd(window*p, p)
	case sluice.SlidingWindow, sluice.Sketch:
		d = 2 * float64(p)
	case sluice.SlidingLog:
		d = float64(p)
	default:
		d = float64(p)
		if l.Rate > 0 {
			d = float64(min(cost, max(algo.Nominal(algo.Kind(l.Algorithm), l.Rate, l.Burst), 1))) * float64(p) / float64(l.Rate)
		}
		d += float64(l.RefillInterval)
	}
	if d >= math.MaxInt64 {
		return 0, math.MaxInt64
	}
	return 0, satAdd(now, int64(d))
}

func satAdd(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// inForce reports whether a record of k still bounds admissions at now.
func inForce(k ledgerKey, e ledgerEntry, now int64) bool {
	return e.until > now && (k.limit.Algorithm != sluice.FixedWindow || e.window == now/max(int64(k.limit.Period), 1))
}

// flight is records taken from the ledger for one write (at most MaxHits),
// until land: a request on one of their keys waits for done.
type flight struct {
	items []ledgerItem
	done  chan struct{}
	err   error // the write's, once done is closed
}

// inFlight is a record in a flight.
type inFlight struct {
	f    *flight
	cost int64
}

// take removes and returns the records in force at now, in flights of at
// most MaxHits; the others are dropped, having no effect left.
func (g *ledger) take(now int64) []*flight {
	g.mu.Lock()
	defer g.mu.Unlock()
	var flights []*flight
	var items []ledgerItem
	for k, e := range g.m {
		if !inForce(k, e, now) {
			continue
		}
		items = append(items, ledgerItem{k, e})
		if len(items) == sluice.MaxHits {
			flights = append(flights, g.fly(items))
			items = nil
		}
	}
	if len(items) > 0 {
		flights = append(flights, g.fly(items))
	}
	g.m = nil
	g.update()
	return flights
}

// fly marks items as being written back, until land. g.mu is held.
func (g *ledger) fly(items []ledgerItem) *flight {
	if g.flying == nil {
		g.flying = make(map[ledgerKey]inFlight)
	}
	f := &flight{items: items, done: make(chan struct{})}
	for _, it := range items {
		g.flying[it.k] = inFlight{f, it.e.cost}
	}
	return f
}

// land ends f: written back, or failed with err and put back into the
// ledger for a later write-back.
func (g *ledger) land(f *flight, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		g.putBackLocked(f.items)
	}
	for _, it := range f.items {
		if g.flying[it.k].f == f {
			delete(g.flying, it.k)
		}
	}
	f.err = err
	close(f.done)
	g.update()
}

// claim takes, for a request of hits that the store is to decide at now,
// the records of their keys in force, as a flight (nil: none); or returns
// a flight that holds one of them, to wait for.
func (g *ledger) claim(hits []sluice.Hit, now int64) (mine, other *flight) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var items []ledgerItem
	for i := range hits {
		k := ledgerKey{hits[i].Key, hits[i].Limit}
		if f, ok := g.flying[k]; ok {
			g.putBackLocked(items)
			return nil, f.f
		}
		e, ok := g.m[k]
		if !ok {
			continue
		}
		delete(g.m, k)
		if inForce(k, e, now) {
			items = append(items, ledgerItem{ledgerKey{strings.Clone(k.key), k.limit}, e})
		}
	}
	if len(items) > 0 {
		mine = g.fly(items)
	}
	g.update()
	return mine, nil
}

// unwritten returns the hits of k the ledger holds in force at now, or
// is writing back: what the local policy admitted of k that the store may
// not count yet.
func (g *ledger) unwritten(k ledgerKey, now int64) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	var n int64
	if e, ok := g.m[k]; ok && inForce(k, e, now) {
		n = e.cost
	}
	if f, ok := g.flying[k]; ok {
		n = min(n+f.cost, sluice.MaxCost)
	}
	return n
}

type ledgerItem struct {
	k ledgerKey
	e ledgerEntry
}

// putBackLocked returns items not written back to the ledger, merged
// with what was recorded since. g.mu is held.
func (g *ledger) putBackLocked(items []ledgerItem) {
	if len(items) == 0 {
		return
	}
	if g.m == nil {
		g.m = make(map[ledgerKey]ledgerEntry, len(items))
	}
	for _, it := range items {
		e, ok := g.m[it.k]
		switch {
		case !ok:
			if len(g.m) >= maxLedger {
				g.dropped.Add(it.e.cost)
				continue
			}
			e = it.e
		case e.window == it.e.window:
			e.cost = min(e.cost+it.e.cost, sluice.MaxCost)
			e.until = max(e.until, it.e.until)
		}
		g.m[it.k] = e
	}
	g.update()
}

// writeBackTimeout bounds one write-back: its calls to the store take the
// store's own deadlines; this is the whole.
const writeBackTimeout = 30 * time.Second

// writeBack charges the records in force to the store of lim, in requests
// of at most MaxHits debits each. It returns the hits written back and the
// first error; the records not written back on an error stay for the next
// write-back.
func (g *ledger) writeBack(ctx context.Context, lim *sluice.Limiter, now int64) (keys int, hits int64, err error) {
	flights := g.take(now)
	for i, f := range flights {
		if err := g.write(ctx, lim, f); err != nil {
			for _, rest := range flights[i+1:] {
				g.land(rest, err)
			}
			return keys, hits, err
		}
		for _, it := range f.items {
			keys++
			hits += it.e.cost
		}
	}
	return keys, hits, nil
}

// write charges f's records to the store of lim as debits, in one
// request, and lands f: put back into the ledger on an error.
func (g *ledger) write(ctx context.Context, lim *sluice.Limiter, f *flight) error {
	var batch [sluice.MaxHits]sluice.Hit
	var out [sluice.MaxHits]sluice.Decision
	items := f.items
	debits := make(map[*sluice.Limit]*sluice.Limit, len(items))
	for i, it := range items {
		l := debits[it.k.limit]
		if l == nil {
			c := *it.k.limit
			c.Debit = true
			l = &c
			debits[it.k.limit] = l
		}
		batch[i] = sluice.Hit{Key: it.k.key, Limit: l, Cost: it.e.cost}
	}
	_, err := lim.TakeEach(ctx, batch[:len(items)], out[:len(items)])
	g.land(f, err)
	return err
}

// writeBackFirst writes back, before the store decides hits at now, what
// the local policy admitted of their keys and has not written back yet,
// waiting for a write-back that holds some of it. An error is the store's
// (the records stay for a later write-back; a request that waited for
// another's write-back that failed gets its error, rather than trying
// again in turn) or the end of ctx.
func (d *Decider) writeBackFirst(ctx context.Context, hits []sluice.Hit, now int64) error {
	g := &d.spent
	for {
		f, other := g.claim(hits, now)
		if other == nil {
			if f == nil {
				return nil
			}
			if err := g.write(ctx, d.limiter, f); err != nil {
				return err
			}
			for _, it := range f.items {
				g.written.Add(1)
				g.hits.Add(it.e.cost)
			}
			return nil
		}
		select {
		case <-other.done:
			if other.err != nil {
				return other.err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// writeBackPoll is how often a node with hits not written back asks the
// store's health (Failover.Health).
const writeBackPoll = 100 * time.Millisecond

// watchWriteBack starts, unless it runs, the loop that writes the ledger
// back as soon as Failover.Health says the store is up, and ends when the
// ledger is empty. Without Health it does nothing.
func (d *Decider) watchWriteBack() {
	health, g := d.failover.Health, &d.spent
	if health == nil || !g.watching.CompareAndSwap(false, true) {
		return
	}
	go func() {
		t := time.NewTicker(writeBackPoll)
		defer t.Stop()
		for range t.C {
			if !d.owed() {
				g.watching.Store(false)
				// A record made since owed was read keeps the loop.
				if !d.owed() || !g.watching.CompareAndSwap(false, true) {
					return
				}
				continue
			}
			if health() == nil {
				d.startWriteBack()
			}
		}
	}()
}

// owed reports whether the local policy admitted what the store does not
// count yet: hits not written back, permits not handed over.
func (d *Decider) owed() bool { return d.spent.pending.Load() || d.held.n.Load() > 0 }

// startWriteBack starts a write-back of d's ledger, and a hand-over of
// the local policy's permits, unless one runs.
func (d *Decider) startWriteBack() {
	log := d.log
	g := &d.spent
	now := d.now()
	if now < g.retryAt.Load() || !g.flushing.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer g.flushing.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), writeBackTimeout)
		defer cancel()
		keys, hits, err := g.writeBack(ctx, d.limiter, now)
		if err == nil {
			err = d.held.handOver(ctx, d.limiter, nil, d.now())
		}
		if err == nil {
			err = d.held.tokens.regrant(ctx, nil, d.now())
		}
		if err != nil {
			g.retryAt.Store(d.now() + int64(writeBackRetry))
		}
		moved, again := d.held.moved.Swap(0), d.held.tokens.moved.Swap(0)
		keys += int(g.written.Swap(0))
		hits += g.hits.Swap(0)
		if log == nil {
			return
		}
		if err != nil {
			log.Warn("local failure policy: writing back what it admitted failed; will retry", "keys", keys, "hits", hits, "permits", moved, "err", err)
			return
		}
		if keys > 0 || moved > 0 {
			log.Info("local failure policy: wrote back to the store what it admitted", "keys", keys, "hits", hits, "not_recorded", g.dropped.Load(),
				"permits", moved, "permits_not_recorded", d.held.dropped.Load())
		}
		if again > 0 {
			log.Info("permit tokens: the store holds again what it granted before it was seen down", "permits", again, "not_recorded", d.held.tokens.dropped.Load())
		}
	}()
}

// now is the clock of the write-back's horizons.
func (d *Decider) now() int64 {
	if d.clock != nil {
		return d.clock()
	}
	return time.Now().UnixNano()
}

// countedFirst has the store count what the local policy admitted of
// hits' keys before it decides them: the hits it admitted (written back)
// and, for a request that holds permits, the holders of their slots
// (handed over). An error means it could not: the failure policy answers.
func (d *Decider) countedFirst(ctx context.Context, hits []sluice.Hit, permits bool) error {
	if d.spent.pending.Load() {
		if err := d.writeBackFirst(ctx, hits, d.now()); err != nil {
			return err
		}
	}
	if permits && (d.held.n.Load() > 0 || d.held.tokens.due()) {
		return d.heldFirst(ctx, hits)
	}
	return nil
}

// storeAnswered notes that the store decided a request (decided: it had
// hits): the store is back for this node (reserving), and, if the local
// policy admitted what the store does not count yet, it is charged that
// meanwhile (and what requests wrote back or handed over first is
// logged).
func (d *Decider) storeAnswered(decided bool) {
	if d.held.sawDown.Load() && d.held.sawDown.CompareAndSwap(true, false) {
		d.held.backAt.Store(d.now())
	}
	if decided && (d.owed() || d.spent.written.Load() > 0 || d.held.moved.Load() > 0 || d.held.tokens.dueAll(d.now())) {
		d.startWriteBack()
	}
}
