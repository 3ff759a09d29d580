package localcache

import (
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
)

// never is the until (or reset deadline) of an entry that does not expire.
const never = math.MaxInt64

// ways is the number of slots of a bucket.
const ways = 8

// ident identifies an entry: a 128-bit hash of the key and the limit. hi has
// its low bit set, so that it is never 0 (the empty slot).
type ident struct{ hi, lo uint64 }

func (id ident) tag() uint32 { return uint32(id.hi) }

// entry is what the cache knows of one identity. Times are on the cache's
// clock, in nanoseconds.
type entry struct {
	until     int64 // denied until then (never: until evicted)
	reset     int64 // the ResetAfter deadline (never: none)
	minCost   int64 // denied for a cost of at least this
	limit     int64
	remaining int64 // -1: blocked
}

// slot holds one entry as a sequence lock: writers (under their shard's
// mutex) make seq odd, write the words, and make it even again; a reader
// that sees the same even seq before and after reading the words has read
// one entry whole. Every word is atomic, so readers take no lock and write
// nothing. A slot is 64 bytes, one cache line.
type slot struct {
	seq       atomic.Uint64
	hi, lo    atomic.Uint64 // hi == 0: empty
	until     atomic.Int64
	reset     atomic.Int64
	minCost   atomic.Int64
	limit     atomic.Int64
	remaining atomic.Int64
}

// bucket is the slots an identity can live in. tags holds the low 32 bits
// of each slot's hi, 0 for an empty slot, so that a lookup reads one cache
// line before the slot it wants. A tag is a hint, checked against the slot.
type bucket struct {
	tags  [ways]atomic.Uint32
	_     [64 - 4*ways]byte
	slots [ways]slot
}

// table is the buckets of a shard. It is replaced, never resized in place:
// a reader still holding an old table reads entries that were true when
// written, which is all a cached denial claims.
type table struct {
	b    []bucket
	mask uint64
}

// shard is an independently locked part of the cache. Readers only load t.
type shard struct {
	mu       sync.Mutex
	t        atomic.Pointer[table]
	n        atomic.Int64 // entries held; written under mu
	minUntil int64        // at most the earliest until of the entries; under mu
	rng      uint64       // picks the bucket to evict from; under mu
	_        [64]byte
}

// buckets returns the two buckets id can live in.
func (t *table) buckets(id ident) (*bucket, *bucket) {
	return &t.b[id.lo&t.mask], &t.b[id.hi>>32&t.mask]
}

// find reads the entry of id in t into e, lock-free, and reports whether
// there was one. It reports false too when a writer was changing the slot
// (a miss is always safe).
func (t *table) find(id ident, e *entry) bool {
	b1, b2 := t.buckets(id)
	return b1.find(id, e) || b2 != b1 && b2.find(id, e)
}

func (b *bucket) find(id ident, e *entry) bool {
	tag := id.tag()
	for w := range ways {
		if b.tags[w].Load() != tag {
			continue
		}
		sl := &b.slots[w]
		seq := sl.seq.Load()
		if seq&1 != 0 {
			return false
		}
		if sl.hi.Load() != id.hi || sl.lo.Load() != id.lo {
			continue
		}
		*e = entry{
			until:     sl.until.Load(),
			reset:     sl.reset.Load(),
			minCost:   sl.minCost.Load(),
			limit:     sl.limit.Load(),
			remaining: sl.remaining.Load(),
		}
		return sl.seq.Load() == seq
	}
	return false
}

// locate returns the bucket and slot holding id in t, or w = -1. Call it
// under the shard's mutex.
func (t *table) locate(id ident) (*bucket, int) {
	b1, b2 := t.buckets(id)
	if w := b1.way(id); w >= 0 {
		return b1, w
	}
	return b2, b2.way(id)
}

// place returns where a new entry of id goes in t: a free slot of the
// emptier of its two buckets, or w = -1 with the bucket of the two whose
// earliest entry expires first (the slot to evict) in ew.
func (t *table) place(id ident) (b *bucket, w int, ew int) {
	b1, b2 := t.buckets(id)
	n1, n2 := b1.used(), b2.used()
	switch {
	case n1 < ways && n1 <= n2:
		return b1, b1.free(), -1
	case n2 < ways:
		return b2, b2.free(), -1
	}
	e1, e2 := b1.earliest(), b2.earliest()
	if b2.slots[e2].until.Load() < b1.slots[e1].until.Load() {
		return b2, -1, e2
	}
	return b1, -1, e1
}

// way returns the slot of id in b, or -1. Call it under the shard's mutex.
func (b *bucket) way(id ident) int {
	for w := range ways {
		if sl := &b.slots[w]; sl.hi.Load() == id.hi && sl.lo.Load() == id.lo {
			return w
		}
	}
	return -1
}

// used returns the number of occupied slots of b. Call it under the
// shard's mutex.
func (b *bucket) used() int {
	n := 0
	for w := range ways {
		if b.slots[w].hi.Load() != 0 {
			n++
		}
	}
	return n
}

// free returns an empty slot of b, or -1. Call it under the shard's mutex.
func (b *bucket) free() int {
	for w := range ways {
		if b.slots[w].hi.Load() == 0 {
			return w
		}
	}
	return -1
}

// earliest returns the occupied slot of b that expires first, or -1.
func (b *bucket) earliest() int {
	best := -1
	var bestUntil int64
	for w := range ways {
		sl := &b.slots[w]
		if sl.hi.Load() == 0 {
			continue
		}
		if u := sl.until.Load(); best < 0 || u < bestUntil {
			best, bestUntil = w, u
		}
	}
	return best
}

func (b *bucket) set(w int, id ident, e *entry) {
	sl := &b.slots[w]
	sl.seq.Add(1)
	sl.hi.Store(id.hi)
	sl.lo.Store(id.lo)
	sl.until.Store(e.until)
	sl.reset.Store(e.reset)
	sl.minCost.Store(e.minCost)
	sl.limit.Store(e.limit)
	sl.remaining.Store(e.remaining)
	sl.seq.Add(1)
	b.tags[w].Store(id.tag())
}

func (b *bucket) clear(w int) {
	sl := &b.slots[w]
	sl.seq.Add(1)
	sl.hi.Store(0)
	sl.lo.Store(0)
	sl.seq.Add(1)
	b.tags[w].Store(0)
}

// load reads the slot w of b. Call it under the shard's mutex.
func (b *bucket) load(w int) (ident, entry) {
	sl := &b.slots[w]
	return ident{sl.hi.Load(), sl.lo.Load()}, entry{
		until:     sl.until.Load(),
		reset:     sl.reset.Load(),
		minCost:   sl.minCost.Load(),
		limit:     sl.limit.Load(),
		remaining: sl.remaining.Load(),
	}
}

func newTable(buckets int) *table {
	return &table{b: make([]bucket, buckets), mask: uint64(buckets - 1)}
}

// lookup reads the entry of id into e, lock-free, and reports whether
// there was one. It is table.find, flattened for the hot path.
func (s *Store) lookup(id ident, e *entry) bool {
	t := s.shardOf(id).t.Load()
	if t == nil {
		return false
	}
	if t.b[id.lo&t.mask].find(id, e) {
		return true
	}
	return t.b[id.hi>>32&t.mask].find(id, e)
}

func (s *Store) shardOf(id ident) *shard {
	return &s.shards[id.lo>>s.shardShift&s.shardMask]
}

// expire removes the entry of id if it has expired at now.
func (s *Store) expire(id ident, now int64) {
	sh := s.shardOf(id)
	sh.mu.Lock()
	if t := sh.t.Load(); t != nil {
		if b, w := t.locate(id); w >= 0 && b.slots[w].until.Load() <= now {
			b.clear(w)
			sh.n.Add(-1)
		}
	}
	sh.mu.Unlock()
}

// forget removes the entry of id, if any.
func (s *Store) forget(id ident) {
	sh := s.shardOf(id)
	t := sh.t.Load()
	if t == nil {
		return
	}
	var e entry
	if !t.find(id, &e) {
		return
	}
	sh.mu.Lock()
	if b, w := sh.t.Load().locate(id); w >= 0 {
		b.clear(w)
		sh.n.Add(-1)
	}
	sh.mu.Unlock()
}

// store records e under id, replacing what the cache knew of id.
func (s *Store) store(id ident, e *entry, now int64) {
	s.inserts.Add(1)
	sh := s.shardOf(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := sh.t.Load()
	if t == nil {
		t = newTable(1)
		sh.t.Store(t)
		sh.minUntil = never
	}
	if b, w := t.locate(id); w >= 0 {
		b.set(w, id, e)
		sh.minUntil = min(sh.minUntil, e.until)
		return
	}
	if sh.n.Load() >= s.shardCap {
		if now >= sh.minUntil {
			s.sweep(sh, t, now)
		}
		if sh.n.Load() >= s.shardCap {
			s.evictNear(sh, t, id, now)
		}
	}
	b, w, ew := t.place(id)
	for w < 0 && len(t.b) < s.maxBuckets {
		t = s.grow(sh, t, now)
		b, w, ew = t.place(id)
	}
	if w < 0 {
		// Both buckets are full and the table is as large as it gets.
		s.evict(sh, b, ew, now)
		w = ew
	}
	b.set(w, id, e)
	sh.n.Add(1)
	sh.minUntil = min(sh.minUntil, e.until)
}

// evict drops slot w of b, counting an eviction if its entry was live.
func (s *Store) evict(sh *shard, b *bucket, w int, now int64) {
	if b.slots[w].until.Load() > now {
		s.evictions.Add(1)
	}
	b.clear(w)
	sh.n.Add(-1)
}

// sweep drops the expired entries of sh, whose table is t, and recomputes
// sh.minUntil.
func (s *Store) sweep(sh *shard, t *table, now int64) {
	m := int64(never)
	for i := range t.b {
		b := &t.b[i]
		for w := range ways {
			sl := &b.slots[w]
			if sl.hi.Load() == 0 {
				continue
			}
			if u := sl.until.Load(); u <= now {
				b.clear(w)
				sh.n.Add(-1)
			} else {
				m = min(m, u)
			}
		}
	}
	sh.minUntil = m
}

// evictNear evicts one entry of the full shard sh: the one that expires
// first in the buckets of id or, if both are empty, in the first bucket
// that is not after a random one.
func (s *Store) evictNear(sh *shard, t *table, id ident, now int64) {
	if b, w, ew := t.place(id); w < 0 {
		s.evict(sh, b, ew, now)
		return
	}
	b1, b2 := t.buckets(id)
	best, bw := b1, b1.earliest()
	if w := b2.earliest(); w >= 0 && (bw < 0 || b2.slots[w].until.Load() < b1.slots[bw].until.Load()) {
		best, bw = b2, w
	}
	if bw >= 0 {
		s.evict(sh, best, bw, now)
		return
	}
	sh.rng += 0x9e3779b97f4a7c15
	i := mix(sh.rng) & t.mask
	for range t.b {
		if b := &t.b[i]; b.used() > 0 {
			s.evict(sh, b, b.earliest(), now)
			return
		}
		i = (i + 1) & t.mask
	}
}

// grow replaces the table t of sh by one twice its size, without the
// expired entries, and returns it.
func (s *Store) grow(sh *shard, t *table, now int64) *table {
	nt := newTable(2 * len(t.b))
	m := int64(never)
	for i := range t.b {
		b := &t.b[i]
		for w := range ways {
			id, e := b.load(w)
			if id.hi == 0 {
				continue
			}
			if e.until <= now {
				sh.n.Add(-1)
				continue
			}
			nb, v, ev := nt.place(id)
			if v < 0 {
				// Rare: both buckets of id are full in the new table.
				s.evict(sh, nb, ev, now)
				v = ev
			}
			nb.set(v, id, &e)
			m = min(m, e.until)
		}
	}
	sh.minUntil = m
	sh.t.Store(nt)
	return nt
}

// mix scrambles x (the wyhash mix: a 128-bit product folded).
func mix(x uint64) uint64 {
	hi, lo := bits.Mul64(x^0x2d358dccaa6c78a5, 0x8bb84b93962eacc9)
	return hi ^ lo
}
