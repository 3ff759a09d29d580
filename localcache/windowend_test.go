package localcache_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/localcache"
	"github.com/sluicehq/sluice/memstore"
)

// slow is a real memstore that takes delay to start deciding, as a store
// across a busy network does: it decides delay after it was asked.
type slow struct {
	*memstore.Store
	delay time.Duration
}

func (s slow) Take(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	time.Sleep(s.delay)
	return s.Store.Take(ctx, hits, out)
}

// TestWindowEndOfSlowStore: a fixed window's denial that the cache answers
// counts down to the end of the window the store decided in, to within a
// few milliseconds, however slow the store was to answer (here 80 ms): the
// answer of the store itself, and of Envoy's duration_until_reset, which
// rounds it up to whole seconds. Without the wall clock's window ends, the
// cache's answer ended the window early by the store's delay, one second
// short when that crossed a second (seen in a loaded test run of envoy-rl's
// integration tests).
func TestWindowEndOfSlowStore(t *testing.T) {
	const delay = 80 * time.Millisecond
	for _, l := range []*sluice.Limit{
		{Algorithm: sluice.FixedWindow, Rate: 1, Period: time.Second},
		{Algorithm: sluice.FixedWindow, Rate: 1, Period: time.Second, WindowOffset: 300 * time.Millisecond},
	} {
		mem := memstore.New(memstore.Config{})
		defer mem.Close()
		cache := localcache.New(slow{mem, delay}, localcache.Config{})
		lim := sluice.NewLimiter(cache)
		for attempt := 0; ; attempt++ {
			if attempt == 5 {
				t.Fatal("every attempt's store answer crossed a window's end")
			}
			// Start 100 ms into a window, so that the store's answers
			// (80 ms each, two of them) stay inside it.
			p, off := int64(l.Period), int64(l.WindowOffset)
			now := time.Now().UnixNano()
			next := (now-off)/p*p + p + off + int64(100*time.Millisecond)
			time.Sleep(time.Until(time.Unix(0, next)))
			key := "k" + time.Now().String()
			h := sluice.Hit{Key: key, Limit: l, Cost: 1}
			if d, err := lim.Take(context.Background(), []sluice.Hit{h}, make([]sluice.Decision, 1)); err != nil || !d.Allowed {
				t.Fatalf("first hit: %+v %v", d, err)
			}
			before := time.Now()
			if d, err := lim.Take(context.Background(), []sluice.Hit{h}, make([]sluice.Decision, 1)); err != nil || d.Allowed {
				t.Fatalf("second hit: %+v %v", d, err)
			}
			after := time.Now()
			// The store decided between before and after: its window
			// ends at the first window end after before.
			end := (before.UnixNano()-off)/p*p + p + off
			if end <= after.UnixNano() {
				continue // the answer crossed the end: again
			}
			asked := time.Now()
			d, err := lim.Take(context.Background(), []sluice.Hit{h}, make([]sluice.Decision, 1))
			answered := time.Now()
			if err != nil || d.Allowed {
				t.Fatalf("third hit: %+v %v", d, err)
			}
			if answered.Sub(asked) >= delay {
				t.Fatalf("the third hit took %s: the store answered it, not the cache", answered.Sub(asked))
			}
			// The cache answered between asked and answered.
			lo, hi := asked.UnixNano()+int64(d.ResetAfter), answered.UnixNano()+int64(d.ResetAfter)
			if slack := int64(5 * time.Millisecond); end < lo-slack || end > hi+slack {
				t.Errorf("offset %s: the cache's answer ends the window between %s and %s before its end",
					l.WindowOffset, time.Duration(end-hi), time.Duration(end-lo))
			}
			break
		}
	}
}
