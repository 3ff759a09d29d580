package decide

import (
	"context"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/algo"

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
// requests see it. Nothing on the request path waits for it.
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
	dropped  atomic.Int64
	pending  atomic.Bool  // m has records
	flushing atomic.Bool  // a write-back runs
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
	g.pending.Store(len(g.m) > 0)
}

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
			d = float64(min(cost, max(algo.Nominal(l.Algorithm, l.Rate, l.Burst), 1))) * float64(p) / float64(l.Rate)
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

// take removes and returns the records in force at now; the others are
// dropped, having no effect left.
func (g *ledger) take(now int64) []ledgerItem {
	g.mu.Lock()
	m := g.m
	g.m = nil
	g.pending.Store(false)
	g.mu.Unlock()
	items := make([]ledgerItem, 0, len(m))
	for k, e := range m {
		if e.until <= now || k.limit.Algorithm == sluice.FixedWindow && e.window != now/max(int64(k.limit.Period), 1) {
			continue
		}
		items = append(items, ledgerItem{k, e})
	}
	return items
}

type ledgerItem struct {
	k ledgerKey
	e ledgerEntry
}

// putBack returns items not written back to the ledger, merged with what
// was recorded since.
func (g *ledger) putBack(items []ledgerItem) {
	g.mu.Lock()
	defer g.mu.Unlock()
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
	g.pending.Store(len(g.m) > 0)
}

// writeBackTimeout bounds one write-back: its calls to the store take the
// store's own deadlines; this is the whole.
const writeBackTimeout = 30 * time.Second

// writeBack charges the records in force to the store of lim, in requests
// of at most MaxHits debits each. It returns the hits written back and the
// first error; the records not written back on an error stay for the next
// write-back.
func (g *ledger) writeBack(ctx context.Context, lim *sluice.Limiter, now int64) (keys int, hits int64, err error) {
	items := g.take(now)
	debits := make(map[*sluice.Limit]*sluice.Limit)
	batch := make([]sluice.Hit, 0, sluice.MaxHits)
	out := make([]sluice.Decision, sluice.MaxHits)
	for start := 0; start < len(items); start += sluice.MaxHits {
		part := items[start:min(start+sluice.MaxHits, len(items))]
		batch = batch[:0]
		for _, it := range part {
			l := debits[it.k.limit]
			if l == nil {
				c := *it.k.limit
				c.Debit = true
				l = &c
				debits[it.k.limit] = l
			}
			batch = append(batch, sluice.Hit{Key: it.k.key, Limit: l, Cost: it.e.cost})
		}
		if _, err := lim.TakeEach(ctx, batch, out); err != nil {
			g.putBack(items[start:])
			return keys, hits, err
		}
		for _, it := range part {
			keys++
			hits += it.e.cost
		}
	}
	return keys, hits, nil
}

// startWriteBack starts a write-back of d's ledger, unless one runs.
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
		if err != nil {
			g.retryAt.Store(d.now() + int64(writeBackRetry))
		}
		if log == nil {
			return
		}
		if err != nil {
			log.Warn("local failure policy: writing back what it admitted failed; will retry", "keys", keys, "hits", hits, "err", err)
			return
		}
		if keys > 0 {
			log.Info("local failure policy: wrote back to the store what it admitted", "keys", keys, "hits", hits, "not_recorded", g.dropped.Load())
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
