package decide

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/vocab/permitfunc"
)

// The permits that the store holds for permit tokens (sluice serve) are
// held in it again when it answers after this node saw it down: nothing
// renews a token's permits (RLS has no renewal), so a Redis restarted
// empty, or one that failed over and lost its latest writes, would have
// forgotten them until their holders end, and admitted up to N newcomers
// beside them (docs/internals/concurrency.md, a store restarted empty).
//
// The Decider records each token's Permit that the store granted, or that
// a hand-over moved to the store, with its permit IDs and the hash of its
// keys, until its token is released or its permits expire (a Period after
// they were acquired, as in the store). When this node sees the store down
// (its policy answered, or watchStore saw Health down or a failed call),
// the records are due: the first request the store decides after that
// starts a regrant of them all in the background (with the write-back and
// the hand-over), and a request that holds permits, before the store
// decides it, regrants first those on its own keys, so that the store
// never decides a key before it counts this node's token holders of it.
// A regrant holds each permit again whatever the room (its holder runs),
// until its own expiry: a store that kept them is unchanged. A token
// released during a regrant is released again after it, in case the
// regrant held it after the release. At most maxLedger Permits are
// recorded; those beyond are not (grants.dropped) and are as before.
type grants struct {
	mu       sync.Mutex
	list     []*grant
	byID     map[string]*grant
	pruned   int          // len(list) after the last prune
	gone     int          // grants in list released since the last prune
	prunedAt int64        // when, Unix ns
	n        atomic.Int64 // len(list)
	live     atomic.Int64 // len(list) - gone: the tokens not released
	epoch    atomic.Int64 // outages seen: a grant of an older epoch is due
	full     atomic.Int64 // every grant was held again in this epoch
	fullAt   atomic.Int64 // when the last regrant of them all began, Unix ns
	moved    atomic.Int64 // permits held again, not logged yet
	busy     sync.Mutex   // one regrant at a time
	dropped  atomic.Int64
}

// grant is a token's Permit that the store holds.
type grant struct {
	p     *sluice.Permit
	ids   []string
	tags  []uint32 // the hashes of its store keys
	until int64    // when its permits expire, Unix ns
	epoch int64    // held in the store since that epoch began
	gone  bool     // its token was released
}

// keyTag is the hash of key by which a token (appendTag) and a grant name
// it: FNV-1a, 32 bits.
func keyTag(key string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return h
}

// add records p, whose permits are those of hits that out allowed (the
// store's hits, with their IDs), acquired at now.
func (g *grants) add(p *sluice.Permit, hits []sluice.Hit, out []sluice.Decision, now int64) {
	e := &grant{p: p, until: math.MaxInt64, epoch: g.epoch.Load()}
	for i := range hits {
		h := &hits[i]
		if h.Permit == "" || h.Limit == nil || h.Limit.Algorithm != sluice.Concurrency || out != nil && !out[i].Allowed {
			continue
		}
		e.ids = append(e.ids, h.Permit)
		e.tags = append(e.tags, keyTag(h.Key))
		e.until = min(e.until, satAdd(now, int64(h.Limit.Period)))
	}
	if len(e.ids) > 0 {
		g.put(e, now)
	}
}

// addHanded records the token's Permit e that a hand-over moved to the
// store.
func (g *grants) addHanded(e *handed, now int64) {
	r := &grant{p: e.p, ids: e.ids, until: e.until, epoch: g.epoch.Load()}
	for _, k := range e.keys {
		r.tags = append(r.tags, keyTag(k))
	}
	g.put(r, now)
}

func (g *grants) put(e *grant, now int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	// Full, it prunes when an eighth was released, or once a second for
	// those expired.
	if len(g.list) >= 2*g.pruned+64 || len(g.list) >= maxLedger && (g.gone >= maxLedger/8 || now-g.prunedAt >= int64(time.Second)) {
		g.pruneLocked(now)
	}
	if len(g.list) >= maxLedger {
		g.dropped.Add(1)
		return
	}
	if g.byID == nil {
		g.byID = make(map[string]*grant)
	}
	for _, id := range e.ids {
		g.byID[id] = e
	}
	g.list = append(g.list, e)
	g.count()
}

// count sets n and live. g.mu is held.
func (g *grants) count() {
	g.n.Store(int64(len(g.list)))
	g.live.Store(int64(len(g.list) - g.gone))
}

// pruneLocked drops the grants released or expired at now. g.mu is held.
func (g *grants) pruneLocked(now int64) {
	keep := g.list[:0]
	for _, e := range g.list {
		if e.gone || e.until <= now {
			for _, id := range e.ids {
				if g.byID[id] == e {
					delete(g.byID, id)
				}
			}
			continue
		}
		keep = append(keep, e)
	}
	clear(g.list[len(keep):])
	g.list, g.pruned, g.gone, g.prunedAt = keep, len(keep), 0, now
	g.count()
}

// forget notes that a token released the permit id.
func (g *grants) forget(id string) {
	if g.n.Load() == 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if e := g.byID[id]; e != nil {
		e.gone = true
		g.gone++
		g.count()
		for _, id := range e.ids {
			delete(g.byID, id)
		}
	}
}

// sawDown notes that the store was seen down: every grant is due.
func (g *grants) sawDown() {
	if g.n.Load() > 0 {
		g.epoch.Add(1)
	}
}

// due reports whether some grant may be due.
func (g *grants) due() bool { return g.n.Load() > 0 && g.epoch.Load() > g.full.Load() }

// dueAll reports whether, at now, a regrant of them all is due and may
// start (minRegrant after the last).
func (g *grants) dueAll(now int64) bool {
	return g.due() && now-g.fullAt.Load() >= int64(minRegrant)
}

// minRegrant is the least time between two regrants of all the grants: a
// store that fails a call now and then (busy, not restarted) would
// otherwise have them all held again at every failure; they stay due
// meanwhile, and a request holds its own keys' again first.
const minRegrant = time.Second

// regrant holds in the store again, until their expiry, the permits of
// the grants due with one of keys (all when keys is nil), at now.
func (g *grants) regrant(ctx context.Context, keys []string, now int64) error {
	if g.n.Load() == 0 {
		return nil
	}
	var tags []uint32
	for _, k := range keys {
		tags = append(tags, keyTag(k))
	}
	if keys == nil {
		if !g.dueAll(now) {
			return nil
		}
		g.fullAt.Store(now)
	}
	g.busy.Lock()
	defer g.busy.Unlock()
	epoch := g.epoch.Load()
	var ps []any
	var left []time.Duration
	var mine []*grant
	g.mu.Lock()
	for _, e := range g.list {
		if e.gone || e.epoch >= epoch || e.until <= now || tags != nil && !touchesTag(e.tags, tags) {
			continue
		}
		mine = append(mine, e)
		ps = append(ps, e.p)
		left = append(left, time.Duration(e.until-now))
	}
	g.mu.Unlock()
	if len(mine) > 0 {
		if err := permitfunc.Rehold(ctx, ps, left); err != nil {
			return err
		}
	}
	if keys == nil {
		g.full.Store(epoch)
	}
	g.moved.Add(int64(len(mine)))
	// Those whose tokens were released meanwhile are released again: the
	// regrant may have held them after the release.
	var again []*sluice.Permit
	g.mu.Lock()
	for _, e := range mine {
		e.epoch = epoch
		if e.gone {
			again = append(again, e.p)
		}
	}
	g.mu.Unlock()
	for _, p := range again {
		_ = p.Release(ctx) // failing, it expires at its time
	}
	return nil
}

func touchesTag(have, want []uint32) bool {
	for _, t := range have {
		for _, w := range want {
			if t == w {
				return true
			}
		}
	}
	return false
}

// granted records p, the Permit the store granted for a token, when the
// store is one that can fail (Failover.Health is set: a store in process
// does not forget).
func (d *Decider) granted(p *sluice.Permit, hits []sluice.Hit, out []sluice.Decision) {
	if d.failover.Health != nil {
		d.held.tokens.add(p, hits, out, d.now())
	}
}
