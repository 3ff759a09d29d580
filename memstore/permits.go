package memstore

import (
	"context"
	"slices"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
	"github.com/sluicehq/sluice/internal/vocab/limits"
)

// permitSet is the permits of one key of a Concurrency limit: each ID
// with its expiry (algo.PermitStep), and the same by expiry, so that the
// expired ones are found at the front and the earliest is read in O(1).
//
// q holds an entry for every permit held, sorted by expiry from head on,
// and stale entries besides: a permit refreshed or released leaves its
// old entry, which is skipped, and dropped, when it reaches the front. A
// permit's entry is live when ids still gives it that expiry (a permit
// released and held again with the same expiry may have two: the first
// to reach the front takes it, the other is then stale). Stale
// entries are bounded: when they outnumber the live ones twice over (and
// by 16), q is rebuilt from ids.
type permitSet struct {
	ids     map[string]int64 // ID -> expiry: the permits held
	idBytes int64            // the bytes of their IDs
	q       []permitEntry
	head    int
	last    int64 // the latest expiry given: the set is empty at and after it
}

type permitEntry struct {
	exp int64
	id  string
}

// Estimates of the memory a permit set holds: the set itself with its map
// and the shard's map slot; a permit in the map (its ID's bytes besides);
// an entry of the queue.
const (
	permSetBytes   = 160
	permIDBytes    = 40
	permEntryBytes = 24
)

// bytes estimates the memory the set holds.
func (ps *permitSet) bytes() int64 {
	return permSetBytes + int64(cap(ps.q))*permEntryBytes + int64(len(ps.ids))*permIDBytes + ps.idBytes
}

// del forgets the permit id.
func (ps *permitSet) del(id string) {
	if _, ok := ps.ids[id]; ok {
		delete(ps.ids, id)
		ps.idBytes -= int64(len(id))
	}
}

// live reports whether e is the entry of a permit held.
func (ps *permitSet) live(e *permitEntry) bool {
	exp, ok := ps.ids[e.id]
	return ok && exp == e.exp
}

// drop drops the permits expired at now and the stale entries before the
// first live one, and returns how many permits it dropped.
func (ps *permitSet) drop(now int64) int {
	n := 0
	for ps.head < len(ps.q) {
		e := &ps.q[ps.head]
		if ps.live(e) {
			if !algo.PermitExpired(e.exp, now) {
				break
			}
			ps.del(e.id)
			n++
		}
		*e = permitEntry{}
		ps.head++
	}
	if ps.head == len(ps.q) {
		ps.q, ps.head = ps.q[:0], 0
	} else if ps.head > 16 && 2*ps.head >= len(ps.q) {
		k := copy(ps.q, ps.q[ps.head:])
		clear(ps.q[k:])
		ps.q, ps.head = ps.q[:k], 0
	}
	return n
}

// view returns what a hit on id finds in the set, its expired permits
// dropped.
func (ps *permitSet) view(id string) algo.PermitSet {
	v := algo.PermitSet{Held: int64(len(ps.ids)), Old: ps.ids[id]}
	if ps.head < len(ps.q) {
		v.Earliest = ps.q[ps.head].exp
	}
	return v
}

// hold holds id with expiry exp: adds it, or moves it.
func (ps *permitSet) hold(id string, exp int64) {
	old, ok := ps.ids[id]
	switch {
	case ok && old == exp:
		return // its entry stands
	case !ok:
		ps.idBytes += int64(len(id))
	}
	ps.ids[id] = exp
	ps.last = max(ps.last, exp)
	e := permitEntry{exp: exp, id: id}
	if n := len(ps.q); n == ps.head || ps.q[n-1].exp <= exp {
		ps.q = append(ps.q, e)
	} else {
		// The clock went backwards: keep q sorted.
		i, _ := slices.BinarySearchFunc(ps.q[ps.head:], exp, func(e permitEntry, t int64) int {
			if e.exp <= t {
				return -1
			}
			return 1
		})
		ps.q = slices.Insert(ps.q, ps.head+i, e)
	}
	if stale := len(ps.q) - ps.head - len(ps.ids); stale > 2*len(ps.ids)+16 {
		ps.rebuild()
	}
}

// rebuild makes q of the live permits alone.
func (ps *permitSet) rebuild() {
	q := make([]permitEntry, 0, len(ps.ids))
	for id, exp := range ps.ids {
		q = append(q, permitEntry{exp: exp, id: id})
	}
	slices.SortFunc(q, func(a, b permitEntry) int {
		switch {
		case a.exp < b.exp:
			return -1
		case a.exp > b.exp:
			return 1
		}
		return 0
	})
	ps.q, ps.head = q, 0
}

// permitsOf returns the permit set of key k in sh, its expired permits
// dropped, or nil when it holds none (a set left empty is deleted).
func (s *Store) permitsOf(sh *shard, k uint64, now int64) *permitSet {
	ps := sh.perms[k]
	if ps == nil {
		return nil
	}
	b := ps.bytes()
	if n := ps.drop(now); n > 0 {
		s.permsExpired.Add(int64(n))
	}
	if len(ps.ids) == 0 {
		delete(sh.perms, k)
		sh.permBytes -= b
		return nil
	}
	sh.permBytes += ps.bytes() - b
	return ps
}

// holdPermit holds id with expiry exp in the set of key k in sh, creating
// it. Permits held are never evicted for memory (permitsFull).
func (s *Store) holdPermit(sh *shard, k uint64, id string, exp int64) {
	ps := sh.perms[k]
	if ps == nil {
		if sh.perms == nil {
			sh.perms = make(map[uint64]*permitSet)
		}
		ps = &permitSet{ids: make(map[string]int64, 1)}
		sh.perms[k] = ps
		sh.permBytes += ps.bytes()
	}
	b := ps.bytes()
	ps.hold(id, exp)
	sh.permBytes += ps.bytes() - b
}

// permitsFull reports whether the permits held in sh take its whole share
// of the memory cap. A new permit is then refused as if its key were at
// its limit: evicting other keys' permits would free slots their holders
// still use, and a flood of keys would let another key's holders be
// doubled (the rates' entries are evicted first: the table's room is what
// the permits leave, makeRoom).
func (s *Store) permitsFull(sh *shard) bool {
	bud := s.budget()
	return bud > 0 && sh.permBytes >= bud
}

// sweepPerms drops the expired permits of sh's sets, and the sets left
// empty; it returns how many permits it dropped (all of them expired:
// a set is dropped whole once its latest expiry is past).
func sweepPerms(sh *shard, now int64) int {
	n := 0
	for k, ps := range sh.perms {
		if ps.last > now {
			b := ps.bytes()
			n += ps.drop(now)
			sh.permBytes += ps.bytes() - b
			continue
		}
		n += len(ps.ids)
		sh.permBytes -= ps.bytes()
		delete(sh.perms, k)
	}
	return n
}

// evaluatePermit is evaluate for a Concurrency hit: the set it finds is
// the stored one (its expired permits dropped by the request's first hit
// on it) with the permits the earlier hits of the request on it hold if
// they commit.
func (s *Store) evaluatePermit(hits []sluice.Hit, ops []op, i int, now int64) {
	o, h := &ops[i], &hits[i]
	if o.prev < 0 {
		o.perms = s.permitsOf(&s.shards[s.shardOf(o.k)], o.k, now)
	} else {
		o.perms = chainHead(ops, i).perms
	}
	o.pset = permitView(hits, ops, i, o.perms)
	if o.pset.Old == 0 && h.Cost == 1 && s.permitsFull(&s.shards[s.shardOf(o.k)]) {
		o.pset.Held = max(o.pset.Held, o.p.Capacity)
		if o.pset.Earliest == 0 {
			o.pset.Earliest = now + int64(time.Second) // a bound to retry after
		}
	}
	o.r, o.pexp = algo.PermitStep(&o.p, o.pset, now, h.Cost)
}

// permitView returns the set hit i finds: ps (nil: none) with the permits
// of the earlier hits of the request on it that commit (pexp > 0), in
// order, as algo.PermitStep adds them: a new ID adds one permit held, an
// ID held is refreshed, and the earliest expiry is the least of those
// found and added.
func permitView(hits []sluice.Hit, ops []op, i int, ps *permitSet) algo.PermitSet {
	id := hits[i].Permit
	var v algo.PermitSet
	if ps != nil {
		v = ps.view(id)
	}
	var chain [sluice.MaxHits]int
	n := 0
	for j := ops[i].prev; j >= 0 && n < len(chain); j = ops[j].prev {
		chain[n] = j
		n++
	}
	var pend [sluice.MaxHits]permitEntry
	np := 0
	for c := n - 1; c >= 0; c-- {
		j := chain[c]
		if ops[j].pexp == 0 {
			continue
		}
		e := permitEntry{exp: ops[j].pexp, id: hits[j].Permit}
		k := 0
		for k < np && pend[k].id != e.id {
			k++
		}
		if k == np {
			np++
			if ps == nil || ps.ids[e.id] == 0 {
				v.Held++
			}
		}
		pend[k] = e
		if v.Earliest == 0 || e.exp < v.Earliest {
			v.Earliest = e.exp
		}
		if e.id == id {
			v.Old = e.exp
		}
	}
	return v
}

// commitPermit holds the permit of an admitted Concurrency hit.
func (s *Store) commitPermit(o *op, h *sluice.Hit) {
	s.holdPermit(&s.shards[s.shardOf(o.k)], o.k, h.Permit, o.pexp)
}

// peekPermit is a peek at the set as the request's first hit on it found
// it, for hit i of a denied request.
func peekPermit(hits []sluice.Hit, ops []op, i int, now int64) algo.Result {
	var v algo.PermitSet
	if ps := ops[i].perms; ps != nil {
		v = ps.view(hits[i].Permit)
	}
	r, _ := algo.PermitStep(&ops[i].p, v, now, 0)
	return r
}

// Permits releases the permits of hits (release true) or renews them,
// and writes their decisions to out, which may be nil for a release (the
// permits of Concurrency limits: see sluice.Store). It never waits, and
// ignores ctx.
func (s *Store) Permits(ctx context.Context, hits []sluice.Hit, out []sluice.Decision, release bool) error {
	if release {
		return s.release(ctx, hits, out)
	}
	return s.renew(ctx, hits, out)
}

// release removes the permit of each hit: its Key, Limit and Permit, and
// writes to out (if not nil) whether it was held (Permits). Releasing a
// permit not held does nothing. It never waits, and ignores ctx.
func (s *Store) release(_ context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	now := s.now()
	for i := range hits {
		h := &hits[i]
		p := limits.Params(h.Limit)
		k := s.keyHash(h.Key, &p)
		sh := &s.shards[s.shardOf(k)]
		sh.mu.Lock()
		held := false
		if ps := s.permitsOf(sh, k, now); ps != nil {
			if _, held = ps.ids[h.Permit]; held {
				b := ps.bytes()
				ps.del(h.Permit)
				if len(ps.ids) == 0 {
					delete(sh.perms, k)
					sh.permBytes -= b
				} else {
					sh.permBytes += ps.bytes() - b
				}
			}
		}
		sh.mu.Unlock()
		if out != nil {
			out[i] = limits.Released(h.Limit, &p, held)
		}
	}
	return nil
}

// renew extends the permit of each hit, if still held, to a Period from
// now, and writes its decision to out (Permits): a permit no longer held
// is held again if its key has room (algo.PermitRenew), else lost and
// denied. It never waits, and ignores ctx.
func (s *Store) renew(_ context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	now := s.now()
	for i := range hits {
		h := &hits[i]
		p := limits.Params(h.Limit)
		k := s.keyHash(h.Key, &p)
		sh := &s.shards[s.shardOf(k)]
		sh.mu.Lock()
		var v algo.PermitSet
		ps := s.permitsOf(sh, k, now)
		if ps != nil {
			v = ps.view(h.Permit)
		}
		r, exp := algo.PermitRenew(&p, v, now, h.Cost == 1)
		if exp > 0 {
			s.holdPermit(sh, k, h.Permit, exp)
		}
		sh.mu.Unlock()
		out[i] = limits.Decision(h.Limit, r, &p)
	}
	return nil
}
