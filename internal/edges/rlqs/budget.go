package rlqs

import (
	"sync"
	"time"
)

// Estimates of the live memory one bucket holds, in bytes. TestBucketBytes
// measures the heap that buckets of several shapes hold, and holds these
// to at least that (and not more than twice it).
const (
	// bucketBase is a bucket of one entry matched to no limit: its state,
	// its slot in its stream's map, its BucketId (a message and a map) and
	// its participant id. The id's keys and values are counted apart:
	// twice, in the BucketId and in the stream's key of the bucket.
	bucketBase = 720
	// bucketEntry is each further entry of its id: the map's slots, as it
	// grows.
	bucketEntry = 64
	// bucketLimit is each limit it shares, besides the bytes of the
	// limit's pool key: the key's header, the limit and the slices' room.
	bucketLimit = 160
	// poolRecord is, with the pools in memory (MemPools), the pool's record
	// of the bucket: an entry, its slot in the pool's slice, its share of
	// the pool's map slot.
	poolRecord = 160
)

// bucketBytes estimates the memory bucket b, kept under key (its
// canonical id), holds.
func (s *Server) bucketBytes(b *bucketState, key string) int64 {
	n := bucketBase + bucketEntry*int64(max(len(b.id.Bucket)-1, 0)) + 2*stringBytes(key)
	for _, p := range b.pools {
		n += bucketLimit + stringBytes(p) + s.recordBytes
	}
	return n
}

// stringBytes is what the bytes of s take on the heap, at most: its
// length and the rounding up to the allocator's size classes, which are
// at most an eighth apart beyond the smallest.
func stringBytes(s string) int64 { return int64(len(s) + len(s)/8) }

// budget is the memory the buckets of every stream hold, as bucketBytes
// estimates it, against Config.MaxBytes. A bucket dropped gives its bytes
// back at once, or later when something it leaves behind lives on (the
// records of MemPools); it is safe for concurrent use.
type budget struct {
	max int64

	mu   sync.Mutex
	held int64
	due  []refund // bytes given back later, in the order given
}

// refund is bytes given back at a time.
type refund struct {
	at    time.Time
	bytes int64
}

// take counts n bytes of a new bucket at now, unless that would hold more
// than max: then it counts nothing and returns false.
func (m *budget) take(n int64, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.settle(now)
	if m.held+n > m.max {
		return false
	}
	m.held += n
	return true
}

// fits reports whether n bytes more would fit at now.
func (m *budget) fits(n int64, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.settle(now)
	return m.held+n <= m.max
}

// resize counts a kept bucket's change of size (a new match may change
// its limits), whatever max says: what is held already is not refused.
func (m *budget) resize(delta int64) {
	m.mu.Lock()
	m.held += delta
	m.mu.Unlock()
}

// give gives n bytes back at at: now, or later.
func (m *budget) give(n int64, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.due = append(m.due, refund{at: at, bytes: n})
}

// settle gives back what is due at now. (Refunds are given in time order,
// but for a clock that steps back: then one waits for the one before it.)
func (m *budget) settle(now time.Time) {
	i := 0
	for ; i < len(m.due) && !m.due[i].at.After(now); i++ {
		m.held -= m.due[i].bytes
	}
	if i > 0 {
		m.due = append(m.due[:0], m.due[i:]...)
	}
}

// bytes returns the bytes held at now.
func (m *budget) bytes(now time.Time) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.settle(now)
	return m.held
}
