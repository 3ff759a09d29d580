package regions

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
)

// loop runs a round every Interval (unless Manual).
func (s *Store) loop(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Round(ctx)
		}
	}
}

// Round asks for what the keys of this window need beyond what the region
// holds, and gives back what they will not use; while the region's store
// fails, neither (a grant could not be refunded in the store, and a
// give-back waits for the window's end: held).
func (s *Store) Round(ctx context.Context) {
	healthy := s.Health() == nil
	if !healthy {
		s.failed()
	}
	now := s.cfg.Now().UnixNano()
	type job struct {
		k    gkey
		g    *gstate
		want int64 // > 0 ask, < 0 give back
	}
	var jobs []job
	nodes := int64(1)
	if s.cfg.Nodes != nil {
		nodes = max(int64(s.cfg.Nodes()), 1)
	}
	var alloc, demand float64
	s.mu.Lock()
	for k, g := range s.keys {
		p := int64(g.limit.Period)
		if g.window+p <= now {
			if g.window+2*p <= now {
				delete(s.keys, k)
			}
			continue
		}
		if !charged(g) {
			continue
		}
		d := Demand{Limit: g.limit, Asked: g.asked - g.lastAsked, Remaining: g.remaining, Left: time.Duration(g.window + p - now),
			Known: time.Duration(now - g.born.UnixNano()), Nodes: nodes, Interval: s.cfg.Interval, Rate: g.rate, Memo: g.memo}
		want := s.cfg.Plan(&d)
		g.lastAsked = g.asked
		g.rate, g.memo = d.Rate, d.Memo
		demand += g.rate
		share := s.shares(g.limit.Rate)[s.region]
		alloc += float64(share + g.granted - g.given)
		if want != 0 && g.remaining >= 0 {
			jobs = append(jobs, job{k, g, want})
		}
	}
	s.mu.Unlock()
	s.stats.Allocation.Store(int64(alloc))
	s.stats.Demand.Store(int64(demand))
	if !healthy {
		return
	}
	for _, j := range jobs {
		if j.want > 0 {
			s.grant(ctx, j.k, j.g, j.want)
		} else if j.want < 0 {
			s.giveBack(ctx, j.k, j.g, -j.want)
		}
	}
	s.yieldWanted(ctx, now)
}

// charged reports whether g's charge is done and succeeded. s.mu is held.
func charged(g *gstate) bool {
	select {
	case <-g.init:
		return g.initErr == nil
	default:
		return false
	}
}

// yieldWanted gives back what this region holds and does not use of the
// entries another region asked more of than was free: a key this region
// has not decided in the window still holds its safe share, which it gives
// back, but for a headroom, after spending it in the region, as any
// give-back.
func (s *Store) yieldWanted(ctx context.Context, now int64) {
	c, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	wanted, err := s.cfg.Ledger.Wanted(c, now/1e6)
	if err != nil {
		s.stats.LedgerErrors.Add(1)
		return
	}
	for _, w := range wanted {
		if w.Window > now || w.Window+w.Period-now < int64(time.Second) || s.held(w.Window) {
			continue
		}
		k := gkey{key: w.Key, rate: w.Rate, period: w.Period}
		s.mu.Lock()
		g := s.keys[k]
		busy := g != nil && g.window == w.Window && (g.rate > 0 || g.yielded)
		s.mu.Unlock()
		if busy {
			continue // decided here: the round gives back its surplus
		}
		l := &sluice.Limit{Name: w.Name, Algorithm: sluice.FixedWindow, Rate: w.Rate, Period: time.Duration(w.Period), Global: true}
		h := sluice.Hit{Key: w.Key, Limit: l}
		if err := s.ready(c, &h); err != nil {
			continue
		}
		s.mu.Lock()
		g = s.keys[k]
		var b known
		if g != nil {
			b = known{g: g, left: s.ceiling(g), granted: g.granted}
		}
		s.mu.Unlock()
		var out [1]sluice.Decision
		if err := s.Next.Take(c, []sluice.Hit{{Key: w.Key, Limit: l}}, out[:]); err != nil {
			s.failed()
			continue
		}
		if g == nil || g.window != w.Window {
			continue
		}
		if !s.verify(c, k, w.Key, &b, out[0].Remaining) {
			continue
		}
		s.mu.Lock()
		if s.keys[k] != g {
			s.mu.Unlock()
			continue
		}
		g.yielded = true
		if g.remaining < 0 || out[0].Remaining < g.remaining || b.verified {
			g.remaining = out[0].Remaining
		}
		s.mu.Unlock()
		s.giveBack(c, k, g, out[0].Remaining-headroom(l))
	}
}

func (s *Store) entry(k gkey, g *gstate) Entry {
	p := int64(g.limit.Period)
	return Entry{Key: entryKey(k.key, k.rate, k.period, g.limit.Name), Window: g.window, Period: p, TTL: p + int64(time.Minute),
		Limit: g.limit.Rate, Region: s.region, Shares: s.shares(g.limit.Rate)}
}

// grant asks the ledger for want more of k's window and refunds what it
// gives from the region's charge, in that window.
func (s *Store) grant(ctx context.Context, k gkey, g *gstate, want int64) {
	c, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	got, err := s.cfg.Ledger.Grant(c, s.entry(k, g), want)
	if err != nil {
		s.stats.LedgerErrors.Add(1)
		s.cfg.Logger.Debug("regions: grant failed", "err", err)
		return
	}
	if got <= 0 {
		return
	}
	s.stats.LastGrant.Store(time.Now().UnixNano())
	st := sluice.Settlement{
		Hit:        sluice.Hit{Key: k.key, Limit: g.limit, Cost: got},
		Spent:      0,
		ResetAfter: g.limit.Period,
		At:         time.Unix(0, g.window),
		ID:         settleID(s.cfg.Region, k.key, g.limit, g.window, fmt.Sprintf("grant %d %d", time.Now().UnixNano(), got)),
	}
	moved, err := s.Settler.Settle(c, &st)
	if err != nil {
		s.cfg.Logger.Debug("regions: a grant could not be applied; it stays unused this window", "err", err)
		return
	}
	s.stats.Granted.Add(-moved)
	s.mu.Lock()
	g.granted += -moved
	g.remaining += -moved
	s.mu.Unlock()
}

// giveBack spends x of k's window in the region, so that no node can admit
// it, then returns it to the ledger.
func (s *Store) giveBack(ctx context.Context, k gkey, g *gstate, x int64) {
	if x <= 0 {
		return
	}
	c, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	hits := []sluice.Hit{{Key: k.key, Limit: g.limit, Cost: x}}
	var out [1]sluice.Decision
	// The window must still be the one given back for: the take lands in
	// the store's window, so not near its end. Nothing is given back of a
	// window in which the store failed (held).
	if now := s.cfg.Now().UnixNano(); g.window+int64(g.limit.Period)-now < int64(time.Second) || s.held(g.window) {
		return
	}
	s.mu.Lock()
	b := known{g: g, left: s.ceiling(g), granted: g.granted}
	s.mu.Unlock()
	if err := s.Next.Take(c, hits, out[:]); err != nil {
		s.failed()
		return
	}
	if !out[0].Allowed {
		return
	}
	// Spent in the region: what it has left is less by x, whatever the
	// ledger says. An answer above what it had left less x comes from
	// lost counters: nothing is given back.
	if !s.verify(c, k, k.key, &b, out[0].Remaining+x) {
		return
	}
	s.mu.Lock()
	if s.keys[k] == g && (g.remaining < 0 || out[0].Remaining < g.remaining || b.verified) {
		g.remaining = out[0].Remaining
	}
	s.mu.Unlock()
	if err := s.cfg.Ledger.GiveBack(c, s.entry(k, g), x); err != nil {
		s.stats.LedgerErrors.Add(1)
		return // spent in the region, lost to the ledger this window: never over-allocated
	}
	s.stats.GivenBack.Add(x)
	s.mu.Lock()
	g.given += x
	s.mu.Unlock()
}

// verify reports whether an answer of the region's store that leaves rem
// of k's counter, to a call made while this node knew b, can be trusted:
// when rem is above what b says the region had left (and this node was
// granted since), the key's marker must show that the store did not lose
// the counter (check; b.verified is then set). False means lost (g is
// replaced), or the store failed.
func (s *Store) verify(ctx context.Context, k gkey, key string, b *known, rem int64) bool {
	s.mu.Lock()
	g := b.g
	lost := g.lost
	above := rem > b.left+g.granted-b.granted
	s.mu.Unlock()
	if lost {
		return false
	}
	if !above {
		return true
	}
	lost, err := s.check(ctx, k, key, g)
	if err != nil || lost {
		return false
	}
	b.verified = true
	return true
}

// Budget is what the local failure policy of this node's region may
// admit of l on key in the current window while the region's store cannot
// decide (decide.Failover.Budget): what the region has left of its
// allocation as this node last learnt it from the store, or, when it has
// not learnt it in this window, the region's safe share: the ledger's
// default, which only a node that readied the key in the window can have
// lowered (by a give-back) or spent; nothing in a window that began
// before this node started (restart.go). In a region of one node that is this
// node; in a region of several, what the others did since this node's
// last answer is not known here (docs/internals/regions.md bounds it).
// ok is false for a limit that is not global.
//
// Not the allocation: the region may have admitted most of it already,
// and the store still counts those. Not the safe share either, when this
// node knows: a region that gave its share back holds only a headroom,
// and one granted more has more.
func (s *Store) Budget(key string, l *sluice.Limit) (left int64, ok bool) {
	if !l.Global {
		return 0, false
	}
	ws := windowOf(l, s.cfg.Now().UnixNano())
	s.mu.Lock()
	defer s.mu.Unlock()
	if g := s.keys[keyOf(&sluice.Hit{Key: key, Limit: l})]; g != nil && g.window == ws {
		return max(s.known(g), 0), true
	}
	if ws < s.since {
		return 0, true // the window began before this node: unknown here
	}
	return s.shares(l.Rate)[s.region], true
}

// Allocation returns this region's allocation of l for key in the window
// of now, and its safe share: the coordinator's ledger's, or, when it does
// not answer, what this node knows (its share, its grants and give-backs).
func (s *Store) Allocation(ctx context.Context, key string, l *sluice.Limit) (alloc, share int64, err error) {
	share = s.shares(l.Rate)[s.region]
	ws := windowOf(l, s.cfg.Now().UnixNano())
	k := gkey{key: key, rate: l.Rate, period: int64(l.Period)}
	g := &gstate{limit: l, window: ws}
	s.mu.Lock()
	known := share
	if cur := s.keys[k]; cur != nil && cur.window == ws {
		known += cur.granted - cur.given
	}
	s.mu.Unlock()
	c, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	alloc, err = s.cfg.Ledger.Allocation(c, s.entry(k, g))
	if err != nil {
		return known, share, err
	}
	return alloc, share, nil
}
