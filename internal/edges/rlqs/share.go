package rlqs

import (
	"context"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A pool is one limit of one counter key (a sluice.Hit's key and limit)
// shared by every Envoy bucket that reports against it, on any sluice node.
// Each participant (one bucket of one stream) holds a share: a fraction of
// the limit's rate and burst. Pools keeps, per participant, its demand
// (requests a second, as a fraction of the limit's rate), its share, and
// for a share just lowered the share it had, held for Grace after the
// lowering (the old share may still be in force in Envoy until the lower
// one arrives).
//
// The invariant: at every moment, the shares that any Envoy may still be
// enforcing sum to at most 1. A share is raised only to what the others
// leave (1 less the sum of their committed shares, where a participant's
// committed share is the larger of its share and, within Grace of a
// lowering, the share it had); a participant's record lives TTL+Grace
// after its last report, longer than Envoy keeps the assignment it got
// (TTL from receiving it, which is at most Grace after it was decided).

// Ask is one participant's report to a pool.
type Ask struct {
	Pool   string  // the pool's key
	Client string  // the participant: a stream and one of its buckets
	Demand float64 // requests a second, as a fraction of the limit's rate (>= 0)
}

// Share is what a pool gave a participant.
type Share struct {
	Share float64 // the fraction of the limit the participant may use now
	Fair  float64 // its fair share by demand, which Share converges to
}

// Pools assigns shares of pools; it is safe for concurrent use.
type Pools interface {
	// Assign records each ask's demand and sets out[i] to the share of
	// asks[i]. len(out) must be len(asks).
	Assign(ctx context.Context, asks []Ask, out []Share) error
}

// Policy is the timing of shares, common to every pool.
type Policy struct {
	// TTL is how long Envoy may keep an assignment after receiving it
	// (the assignment_time_to_live sent).
	TTL time.Duration
	// Grace bounds how long an assignment takes from being decided to
	// reaching Envoy: a lowered share is held for Grace, and a record
	// lives TTL+Grace.
	Grace time.Duration
	// Hysteresis keeps a participant's share while its fair share is
	// within this fraction of it (and the others leave room for it), so
	// that small changes of demand do not send Envoy a new token bucket
	// (which Envoy starts full). 0.1 when zero; negative for none.
	Hysteresis float64
}

func (p Policy) hysteresis() float64 {
	switch {
	case p.Hysteresis == 0:
		return 0.1
	case p.Hysteresis < 0:
		return 0
	}
	return p.Hysteresis
}

// entry is one participant's record in a pool. Times are milliseconds.
type entry struct {
	id        string
	demand    float64
	share     float64
	prev      float64 // the share before the last lowering
	prevUntil int64   // prev counts until then
	expires   int64
}

// committed is the most of the pool e's Envoy may be enforcing at now.
func (e *entry) committed(now int64) float64 {
	if e.prevUntil > now && e.prev > e.share {
		return e.prev
	}
	return e.share
}

// assign is the allocation, on the live entries of one pool (expired ones
// already dropped): it updates me (which is one of entries, or nil for a
// newcomer, then added) and returns its share and fair share. It is
// mirrored step for step by share.lua; a differential test holds them
// together. Float sums run in the order of (demand, id) so that both give
// the same bits.
func assign(entries []*entry, id string, demand float64, now, ttl, grace int64, hyst float64) ([]*entry, Share) {
	var me *entry
	for _, e := range entries {
		if e.id == id {
			me = e
		}
	}
	if me == nil {
		me = &entry{id: id}
		entries = append(entries, me)
	}
	me.demand = demand
	sortEntries(entries)

	// Max-min fairness by demand (water-filling), then what nobody
	// demands spread evenly, so that every participant has room to grow
	// until its next report.
	n := len(entries)
	remaining := 1.0
	var fair float64
	fairOf := make([]float64, n)
	for k, e := range entries {
		give := math.Min(e.demand, remaining/float64(n-k))
		fairOf[k] = give
		remaining -= give
	}
	if remaining < 0 {
		remaining = 0
	}
	used, need := 0.0, 0.0 // the others' committed shares; the larger of those and their fair shares
	for k, e := range entries {
		if e == me {
			fair = fairOf[k] + remaining/float64(n)
			continue
		}
		c := e.committed(now)
		used += c
		need += math.Max(c, fairOf[k]+remaining/float64(n))
	}
	avail := math.Max(0, 1-used)
	target := math.Min(fair, avail)
	// Keep the share while it is near enough its target, fits, and
	// leaves the others room for their fair shares.
	if me.share > 0 && math.Abs(target-me.share) <= hyst*me.share && me.share <= avail && me.share+need <= 1 {
		target = me.share
	}
	// One lowering per grace: while the last one's old share may still be
	// in force, a lower share waits (else holding every old share would
	// need a list, and holding the largest would never let go).
	if target < me.share && me.prevUntil > now {
		target = me.share
	}
	if target < me.share {
		me.prev, me.prevUntil = me.share, now+grace
	}
	me.share = target
	me.expires = now + ttl + grace
	return entries, Share{Share: target, Fair: fair}
}

func sortEntries(entries []*entry) {
	slices.SortFunc(entries, func(a, b *entry) int {
		switch {
		case a.demand < b.demand:
			return -1
		case a.demand > b.demand:
			return 1
		}
		return strings.Compare(a.id, b.id)
	})
}

// formatFloat writes f as share.lua reads and writes it.
func formatFloat(f float64) string { return strconv.FormatFloat(f, 'g', 17, 64) }

// MemPools keeps the pools in this process: for one sluice node (the
// embedded store), where no other node shares them.
type MemPools struct {
	policy Policy
	now    func() time.Time

	mu    sync.Mutex
	pools map[string][]*entry
	sweep int64 // next sweep of idle pools, ms
}

// NewMemPools returns pools kept in memory; now is the clock (time.Now
// when nil).
func NewMemPools(p Policy, now func() time.Time) *MemPools {
	if now == nil {
		now = time.Now
	}
	return &MemPools{policy: p, now: now, pools: make(map[string][]*entry)}
}

// Assign implements Pools.
func (m *MemPools) Assign(_ context.Context, asks []Ask, out []Share) error {
	now := m.now().UnixMilli()
	ttl, grace := m.policy.TTL.Milliseconds(), m.policy.Grace.Milliseconds()
	m.mu.Lock()
	defer m.mu.Unlock()
	if now >= m.sweep {
		for k, es := range m.pools {
			if es = live(es, now); len(es) == 0 {
				delete(m.pools, k)
			} else {
				m.pools[k] = es
			}
		}
		m.sweep = now + ttl + grace
	}
	for i, a := range asks {
		es := live(m.pools[a.Pool], now)
		es, out[i] = assign(es, a.Client, a.Demand, now, ttl, grace, m.policy.hysteresis())
		m.pools[a.Pool] = es
	}
	return nil
}

// Len returns the number of pools held, idle ones not yet swept included.
func (m *MemPools) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.pools)
}

// live drops the expired entries of es, in place.
func live(es []*entry, now int64) []*entry {
	return slices.DeleteFunc(es, func(e *entry) bool { return e.expires <= now })
}
