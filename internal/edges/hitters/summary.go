// Package hitters keeps, per rule, the keys that ask the most and the keys
// denied the most, over the last minute and the last hour, in memory that
// does not grow with the number of keys: space-saving summaries (Metwally,
// Agrawal and El Abbadi, 2005) of a fixed number of counters.
//
// The bound: a summary of m counters over a stream of N hits holds every
// key with more than N/m hits, and says of each key it holds a count that
// is at least its true count and at most N/m above it. A window is several
// summaries added up when read: the minute's, one per 10 s, each fed every
// hit of its slice; the hour's, one per 5 minutes, each the 10 s summaries
// of its slice merged in one by one as they end (fold.go), which keeps the
// same bound. A key's sum is within [Low, High] (Item), and
// High − true ≤ N/m for the window's N, since the parts' N/m add up to it.
//
// This package imports the standard library and internal/base/entrytext (the
// text of its keys); a node's top keys are shared through a Hash the
// caller gives (Shared): nothing of sluice's transports, stores or Redis
// client.
package hitters

import "math/bits"

// MaxKeyLen is the longest key a summary keeps the text of; longer keys
// are kept cut, ending in "…", and counted by their whole hash.
const MaxKeyLen = 96

// counter is one counter of a summary: what a hit reads and writes, 32
// bytes, two to a cache line. Its key's text is apart (summary.keys),
// written only when a key takes the counter and read only by Top.
type counter struct {
	hash  uint64
	count uint64
	err   uint64 // what the count may exceed the key's true count by
	pos   int32  // in the heap
	klen  uint8
}

// keyText is the text of a counter's key.
type keyText [MaxKeyLen]byte

// filterPerCounter is the filter's cells per counter (see summary.alpha).
const filterPerCounter = 16

// summary is a space-saving summary of m counters: the counters, an index
// by key hash (open addressing, linear probing), a min-heap of counters by
// count and, for summaries fed one hit at a time, a filter in front. It
// allocates nothing once made.
//
// The filter (after Homem and Carvalho's filtered space-saving, 2010) is
// alpha: cells indexed by a key's hash, each an upper bound on the hits of
// every key not held whose hash falls in it. A hit of a key not held,
// once the summary is full, adds to the key's cell while the cell is below
// the smallest count; only a key whose cell has reached it takes a counter
// (the smallest, as in space-saving), with count cell+1 = min+1 and error
// min, and the evicted key's count goes into its own cell. Two invariants
// keep the bound of the plain summary:
//
//   - (A) a key not held has had at most its cell's hits: its hits went
//     into the cell while not held, and a key evicted leaves its count
//     (at least its hits) there;
//   - (B) every cell is at most the smallest count: a cell grows only
//     while below it, an evicted count was the smallest, and the smallest
//     count never falls.
//
// A key takes a counter with count min+1 and error min exactly as without
// the filter, and a hit of a key held adds 1, so the counts add up to at
// most the hits N: min ≤ N/m, every key with more than N/m hits is held
// (a key not held has at most its cell ≤ min), and a count exceeds the
// truth by at most its error ≤ N/m. What the filter saves is work: in a
// flood of keys seen once, a hit mostly adds 1 to a cell instead of
// evicting a counter, writing a key and moving it through the heap.
//
// A cell is 28 bits of count, and in its top 4 bits how many keys held
// have their hash in the cell (15 meaning 15 or more): a hit whose cell
// counts none is of a key not held, and skips the index. The argument
// holds while a summary's slice has fewer than 2^28 hits of its rule
// (10 s at 26.8 million a second). Past that a cell saturates and (A)
// may fail for its keys.
//
// A hit of a key not held reads the first 64 bytes of the struct and one
// cell of the filter, and the index only if the cell counts keys held.
type summary struct {
	slots []uint64 // the index by hash (slot), 0 for an empty slot
	alpha []uint32 // the filter
	total uint64   // hits added
	floor uint64   // the smallest count while full, else 0 (min)

	cnt  []counter
	keys []keyText // the text of cnt[i]'s key
	heap []int32

	// merged marks a summary made by folding others in (fold.go): its
	// counts are lower bounds, each at most delta under the truth.
	merged bool
	delta  uint64
}

// init makes s an empty summary of m counters.
func (s *summary) init(m int) {
	n, a := pow2(2*m), pow2(filterPerCounter*m)
	*s = summary{
		cnt:   make([]counter, 0, m),
		keys:  make([]keyText, m),
		heap:  make([]int32, 0, m),
		slots: make([]uint64, n),
		alpha: make([]uint32, a),
	}
}

// pow2 is the least power of 2 at least n.
func pow2(n int) int {
	p := 1
	for p < n {
		p <<= 1
	}
	return p
}

// reset empties s, keeping its storage.
func (s *summary) reset() {
	s.cnt, s.heap, s.total, s.floor, s.delta = s.cnt[:0], s.heap[:0], 0, 0, 0
	clear(s.slots)
	clear(s.alpha)
}

// home is the slot where the search for hash h starts (Fibonacci hashing:
// the top bits of h times 2^64/φ, whatever bits of h vary).
func (s *summary) home(h uint64) int {
	return int((h * 0x9E3779B97F4A7C15) >> (64 - bits.TrailingZeros(uint(len(s.slots)))))
}

// cell is h's cell of the filter (another multiplier than home's).
func (s *summary) cell(h uint64) int {
	return int((h * 0xC2B2AE3D27D4EB4F) >> (64 - bits.TrailingZeros(uint(len(s.alpha)))))
}

// A slot of the index holds the top 32 bits of its counter's hash and
// the counter's index + 1, so that a search reads a counter only when its
// hash may be the one sought.
const slotIdx = 1<<32 - 1

func slot(h uint64, i int32) uint64 { return h&^slotIdx | uint64(i+1) }

// slotCounter is the counter of slot v (not empty).
func slotCounter(v uint64) int32 { return int32(v&slotIdx) - 1 }

// find returns the counter of hash h, or −1.
func (s *summary) find(h uint64) int32 {
	mask := len(s.slots) - 1
	for j := s.home(h); ; j = (j + 1) & mask {
		v := s.slots[j]
		if v == 0 {
			return -1
		}
		if (v^h)&^slotIdx == 0 {
			if i := slotCounter(v); s.cnt[i].hash == h {
				return i
			}
		}
	}
}

// link indexes counter i under its hash (not indexed yet).
func (s *summary) link(i int32) {
	mask := len(s.slots) - 1
	h := s.cnt[i].hash
	j := s.home(h)
	for s.slots[j] != 0 {
		j = (j + 1) & mask
	}
	s.slots[j] = slot(h, i)
}

// unlink removes counter i from the index, moving back the entries after
// it that would no longer be found (deletion without tombstones).
func (s *summary) unlink(i int32) {
	mask := len(s.slots) - 1
	j := s.home(s.cnt[i].hash)
	for slotCounter(s.slots[j]) != i {
		j = (j + 1) & mask
	}
	for k := (j + 1) & mask; s.slots[k] != 0; k = (k + 1) & mask {
		// The entry at k may fill the hole at j if its home is not in
		// (j, k], cyclically.
		if h := s.home(s.cnt[slotCounter(s.slots[k])].hash); (k-h)&mask >= (k-j)&mask {
			s.slots[j] = s.slots[k]
			j = k
		}
	}
	s.slots[j] = 0
}

// setFloor sets floor after the heap's root may have changed.
func (s *summary) setFloor() {
	if len(s.cnt) == cap(s.cnt) && len(s.heap) > 0 {
		s.floor = s.cnt[s.heap[0]].count
	}
}

// bound is the most the key with hash h, not held, may have had: its
// filter cell (at most the smallest count, by (B)), or a merged
// summary's delta.
func (s *summary) bound(h uint64) uint64 {
	if s.merged {
		return s.delta
	}
	return uint64(s.alpha[s.cell(h)] & cellMax)
}

// A filter cell: its count (at most cellMax), and above it (cellShift) how
// many keys held have their hash in it, up to cellHeldMax.
const (
	cellShift   = 28
	cellMax     = 1<<cellShift - 1
	cellHeldMax = 15
	cellOneHeld = 1 << cellShift
)

// interval is what the key of counter i may have had: [low, high].
func (s *summary) interval(i int) (low, high uint64) {
	c := &s.cnt[i]
	if s.merged {
		return c.count, c.count + s.delta
	}
	return c.count - c.err, c.count
}

// hit adds one hit of the key with hash h through the filter; name writes
// the key's text (called only when the key takes a counter).
func (s *summary) hit(h uint64, name func([]byte) []byte) {
	s.total++
	a := &s.alpha[s.cell(h)]
	if *a > cellMax { // keys held in the cell
		if i := s.find(h); i >= 0 {
			c := &s.cnt[i]
			c.count++
			if c.pos == 0 { // the smallest count may have grown
				s.down(0)
				s.setFloor()
			} else {
				s.down(int(c.pos))
			}
			return
		}
	}
	// While not full, floor is 0 and the key takes a free counter.
	if v := *a & cellMax; uint64(v) < s.floor && v < cellMax {
		*a++
		return
	}
	s.place(h, name)
}

// place gives the key with hash h, not held, a counter of its hit: a free
// one, or the smallest, whose count the newcomer inherits as its error.
func (s *summary) place(h uint64, name func([]byte) []byte) {
	var i int32
	var base uint64
	if len(s.cnt) < cap(s.cnt) {
		i = int32(len(s.cnt))
		s.cnt = s.cnt[:i+1]
		s.cnt[i].pos = int32(len(s.heap))
		s.heap = append(s.heap, i)
	} else {
		i = s.heap[0]
		e := &s.cnt[i]
		base = e.count
		ec := s.cell(e.hash)
		a := &s.alpha[ec]
		*a = *a&^cellMax | uint32(max(uint64(*a&cellMax), min(e.count, cellMax)))
		s.unlink(i)
		if *a>>cellShift < cellHeldMax {
			*a -= cellOneHeld
		} else { // 15 or more: count them
			*a = *a&cellMax | uint32(s.heldIn(ec, i))<<cellShift
		}
	}
	c := &s.cnt[i]
	c.hash, c.count, c.err = h, base+1, base
	if a := &s.alpha[s.cell(h)]; *a>>cellShift < cellHeldMax {
		*a += cellOneHeld
	}
	key := &s.keys[i]
	k := name(key[:0])
	if len(k) > MaxKeyLen {
		k = append(k[:MaxKeyLen-3], "…"...)
	}
	c.klen = uint8(copy(key[:], k))
	s.link(i)
	s.down(int(c.pos))
	s.up(int(c.pos))
	s.setFloor()
}

// heldIn counts the keys held, other than counter except's (being
// evicted), with their hash in cell j, up to cellHeldMax: a scan of the
// counters, when a cell that counted 15 or more loses one.
func (s *summary) heldIn(j int, except int32) int {
	n := 0
	for i := range s.cnt {
		if int32(i) != except && s.cell(s.cnt[i].hash) == j {
			n++
		}
	}
	return min(n, cellHeldMax)
}

func (s *summary) less(a, b int) bool { return s.cnt[s.heap[a]].count < s.cnt[s.heap[b]].count }

func (s *summary) swap(a, b int) {
	s.heap[a], s.heap[b] = s.heap[b], s.heap[a]
	s.cnt[s.heap[a]].pos = int32(a)
	s.cnt[s.heap[b]].pos = int32(b)
}

func (s *summary) up(j int) {
	for j > 0 {
		p := (j - 1) / 2
		if !s.less(j, p) {
			return
		}
		s.swap(j, p)
		j = p
	}
}

func (s *summary) down(j int) {
	n := len(s.heap)
	for {
		l := 2*j + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && s.less(r, l) {
			m = r
		}
		if !s.less(m, j) {
			return
		}
		s.swap(j, m)
		j = m
	}
}
