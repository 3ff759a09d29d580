package memstore

import (
	"math"
	"math/bits"

	"github.com/sluicehq/sluice/internal/base/algo"
)

// put stores st under k in sh, or deletes k if st is idle at now.
func (s *Store) put(sh *shard, k uint64, st algo.State, now int64) {
	s.putAt(sh, sh.t.find(k), k, st, now)
}

// putAt is put with i the slot of k in sh's table, or -1 if absent.
func (s *Store) putAt(sh *shard, i int, k uint64, st algo.State, now int64) {
	switch {
	case i >= 0 && st.A > now:
		sh.t.slots[i].st = st
	case i >= 0:
		sh.t.remove(i)
	case st.A > now:
		s.insert(sh, k, st, now)
	}
}

// insert adds k, absent from sh, making room first if the table is full.
func (s *Store) insert(sh *shard, k uint64, st algo.State, now int64) {
	if sh.t.n >= limitFor(len(sh.t.slots)) {
		s.makeRoom(sh, now, s.budget())
	}
	sh.t.insert(k, st)
}

// budget returns the bytes each shard may hold, or 0 for no cap.
func (s *Store) budget() int64 {
	if s.maxBytes == 0 {
		return 0
	}
	return max((s.maxBytes-s.sketches.bytes.Load())/int64(len(s.shards))-shardBytes, 1)
}

// makeRoom makes room for one more entry in the full table of sh, whose
// budget is b bytes (0: no cap). A table at its budget evicts one entry.
// Otherwise idle entries are dropped in place; if that frees less than an
// eighth of the table, it grows (up to its budget). Tables shrink only in
// Sweep, so that keys touched less often than their period do not make a
// table shrink and grow again.
func (s *Store) makeRoom(sh *shard, now int64, b int64) {
	t := &sh.t
	c := len(t.slots)
	if c == 0 {
		t.rebuild(minCap, now)
		return
	}
	maxC := math.MaxInt
	if b > 0 {
		maxC = max(int((b-sh.logBytes-sh.permBytes-sh.wordsOf().bytes())/entryBytes), minCap)
	}
	if c >= maxC {
		s.evict(sh, now)
		return
	}
	lim := limitFor(c)
	if t.sweep(0, c, now) > 0 && t.n < lim-lim/8 {
		return
	}
	t.rebuild(min(capFor(t.n+1), maxC), now)
	if t.n >= limitFor(len(t.slots)) {
		s.evict(sh, now)
	}
}

// evictSample is how many entries (or logs) eviction compares.
const evictSample = 8

func (sh *shard) rand() uint64 {
	sh.rng += 0x9e3779b97f4a7c15
	return mix64(sh.rng)
}

// evict removes, among evictSample entries from a random slot of sh's
// table, the one with the earliest idle-at time.
func (s *Store) evict(sh *shard, now int64) {
	t := &sh.t
	c := len(t.slots)
	hi, _ := bits.Mul64(sh.rand(), uint64(c))
	i := int(hi)
	best, bestA := -1, int64(0)
	for seen, probes := 0, 0; seen < evictSample && probes < c; probes++ {
		if e := &t.slots[i]; e.key != 0 {
			if best < 0 || e.st.A < bestA {
				best, bestA = i, e.st.A
			}
			seen++
		}
		if i++; i == c {
			i = 0
		}
	}
	if best >= 0 {
		if bestA > now {
			s.evicted.Add(1)
		}
		t.remove(best)
	}
}
