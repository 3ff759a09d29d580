package storetest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
)

// concurrency: many goroutines on one hot key; every algorithm admits
// exactly its capacity while the clock stands still.
func (s suite) concurrency(t *testing.T) {
	s.forKinds(t, func(t *testing.T, e *env, k algo.Kind) {
		const limit, workers, tries = 50, 16, 20
		l := &sluice.Limit{Algorithm: sluice.Algorithm(k), Rate: limit, Period: time.Hour}
		var admitted atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for range workers {
			wg.Go(func() {
				for range tries {
					d, err := e.lim.Allow(context.Background(), "hot", l)
					if err != nil {
						errs <- err
						return
					}
					if d.Allowed {
						admitted.Add(1)
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if got := admitted.Load(); got != limit {
			t.Fatalf("admitted %d of %d requests on a hot key, want exactly %d", got, workers*tries, limit)
		}
	})
}

// concurrentAllOrNothing: requests of two limits under contention consume
// both or neither.
func (s suite) concurrentAllOrNothing(t *testing.T) {
	e := s.env(t)
	const limit, workers, tries = 40, 8, 25
	shared := &sluice.Limit{Name: "shared", Rate: limit, Period: time.Hour}
	own := &sluice.Limit{Name: "own", Algorithm: sluice.Algorithm(algo.TokenBucket), Rate: 1000, Period: time.Hour}
	var wg sync.WaitGroup
	var admitted [workers]int64
	for w := range workers {
		wg.Go(func() {
			hits := []sluice.Hit{hit(fmt.Sprintf("own%d", w), own, 1), hit("shared", shared, 1)}
			for range tries {
				out := make([]sluice.Decision, len(hits))
				d, err := e.lim.Take(context.Background(), hits, out)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted[w]++
				}
			}
		})
	}
	wg.Wait()
	total := int64(0)
	for w, n := range admitted {
		total += n
		if d := e.allow(fmt.Sprintf("own%d", w), own, 0); 1000-d.Remaining != n {
			t.Errorf("worker %d: admitted %d but its own limit consumed %d", w, n, 1000-d.Remaining)
		}
	}
	if total != limit {
		t.Fatalf("admitted %d, want %d", total, limit)
	}
}
