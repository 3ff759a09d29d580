package localcache

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

type nopStore struct{}

func (nopStore) Take(context.Context, []sluice.Hit, []sluice.Decision) error { return nil }

// TestTornReads: readers never see an entry made of two writes, while a
// writer rewrites it and other entries make the table grow and evict.
func TestTornReads(t *testing.T) {
	s := New(nopStore{}, Config{MaxEntries: 64})
	hot := ident{hi: 12345<<1 | 1, lo: 67890}
	var stop atomic.Bool
	var reads, found atomic.Int64
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			var e entry
			for !stop.Load() {
				reads.Add(1)
				if !s.lookup(hot, &e) {
					continue
				}
				found.Add(1)
				if e.reset != e.until || e.minCost != e.until || e.limit != e.until || e.remaining != e.until {
					t.Errorf("torn read: %+v", e)
					return
				}
			}
		})
	}
	deadline := time.Now().Add(200 * time.Millisecond)
	// At least 256 rounds: on a loaded machine 200 ms may hold too few to
	// evict.
	for v := int64(1); time.Now().Before(deadline) || v <= 256; v++ {
		s.store(hot, &entry{until: v, reset: v, minCost: v, limit: v, remaining: v}, 0)
		other := ident{hi: uint64(v)*0x9e3779b97f4a7c15 | 1, lo: uint64(v) * 0xc2b2ae3d27d4eb4f}
		s.store(other, &entry{until: never, reset: never, minCost: 1, limit: 1}, 0)
		if v%1000 == 0 {
			s.forget(hot)
		}
	}
	stop.Store(true)
	wg.Wait()
	if st := s.Stats(); st.Entries > 64 || st.Evictions == 0 {
		t.Fatalf("stats %+v", st)
	}
	t.Logf("%d of %d reads found the entry", found.Load(), reads.Load())
}
