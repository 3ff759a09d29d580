// Package hitters keeps, per rule, the keys that ask the most and the keys
// denied the most, over the last minute and the last hour, in memory that
// does not grow with the number of keys: space-saving summaries (Metwally,
// Agrawal and El Abbadi, 2005) of a fixed number of counters.
//
// The bound: a summary of m counters over a stream of N hits holds every
// key with more than N/m hits, and says of each key it holds a count that
// is at least its true count and at most N/m above it. A window is several
// summaries (one per slice of time) merged when read; the merged count of
// a key is within [Low, High] (Item), and High − true ≤ N/m for the
// window's N (summaries merge with their errors adding up, and N adds up
// the same way).
//
// This package imports the standard library and xxh3; nothing of sluice's
// transports or stores.
package hitters

// MaxKeyLen is the longest key a summary keeps the text of; longer keys
// are kept cut, ending in "…", and counted by their whole hash.
const MaxKeyLen = 96

// counter is one counter of a summary.
type counter struct {
	hash  uint64
	count uint64
	err   uint64 // what the count may exceed the key's true count by
	pos   int32  // in the heap
	klen  uint8
	key   [MaxKeyLen]byte
}

// summary is a space-saving summary of m counters: the counters, an index
// by key hash, and a min-heap of counters by count. It allocates nothing
// once made.
type summary struct {
	cnt   []counter
	heap  []int32
	idx   map[uint64]int32
	total uint64 // hits added
}

func newSummary(m int) *summary {
	return &summary{cnt: make([]counter, 0, m), heap: make([]int32, 0, m), idx: make(map[uint64]int32, m)}
}

// reset empties s, keeping its storage.
func (s *summary) reset() {
	s.cnt, s.heap, s.total = s.cnt[:0], s.heap[:0], 0
	clear(s.idx)
}

// min is the smallest count held (0 while not full): the most a key not
// held may have had.
func (s *summary) min() uint64 {
	if len(s.cnt) < cap(s.cnt) || len(s.heap) == 0 {
		return 0
	}
	return s.cnt[s.heap[0]].count
}

// add adds n hits of the key with hash h; name writes the key's text
// (called only when the key takes a counter).
func (s *summary) add(h uint64, n, errIn uint64, name func([]byte) []byte) {
	s.total += n
	if i, ok := s.idx[h]; ok {
		c := &s.cnt[i]
		c.count += n
		c.err += errIn
		s.down(int(c.pos))
		return
	}
	var i int32
	var base uint64
	if len(s.cnt) < cap(s.cnt) {
		i = int32(len(s.cnt))
		s.cnt = s.cnt[:i+1]
		s.cnt[i].pos = int32(len(s.heap))
		s.heap = append(s.heap, i)
	} else {
		// The smallest counter goes to the newcomer, which inherits its
		// count as its error.
		i = s.heap[0]
		base = s.cnt[i].count
		delete(s.idx, s.cnt[i].hash)
	}
	c := &s.cnt[i]
	c.hash, c.count, c.err = h, base+n, base+errIn
	k := name(c.key[:0])
	if len(k) > MaxKeyLen {
		k = append(k[:MaxKeyLen-3], "…"...)
	}
	c.klen = uint8(copy(c.key[:], k))
	s.idx[h] = i
	s.down(int(c.pos))
	s.up(int(c.pos))
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

// mergeInto adds s into dst (mergeable summaries: the errors add up).
func (s *summary) mergeInto(dst *summary) {
	for i := range s.cnt {
		c := &s.cnt[i]
		dst.add(c.hash, c.count, c.err, func(b []byte) []byte { return append(b, c.key[:c.klen]...) })
	}
	// The counts of a summary add up to its hits (a newcomer takes over
	// the count of the counter it replaces), so dst.total grew by s.total.
}
