package memstore_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/storetest"
)

var ctx = context.Background()

func limitOf(k algo.Kind, rate int64, period time.Duration) *sluice.Limit {
	return &sluice.Limit{Name: k.String(), Algorithm: sluice.Algorithm(k), Rate: rate, Period: period}
}

// TestExpiry checks, at fixed times, that idle keys are dropped by Sweep
// and when a lookup meets them, and that dropping them changes no decision.
func TestExpiry(t *testing.T) {
	clock := storetest.NewClock(storetest.Start)
	s := memstore.New(memstore.Config{Now: clock.Now, SweepInterval: -1, Shards: 2})
	defer s.Close()
	lim := sluice.NewLimiter(s)
	steps := []struct {
		at      time.Duration
		sweep   bool
		wantLen int
	}{
		{0, false, 8},                     // a key per algorithm but the sketch, key b and its block
		{500 * time.Millisecond, true, 8}, // nothing idle yet
		{time.Second, true, 4},            // the sliding window counter, the block, and two fixed windows (below)
		// A fixed window in the word table is idle up to 2^24 ns (16.8 ms)
		// after its window ends (memstore/words.go).
		{time.Second + 17*time.Millisecond, true, 2}, // the sliding window counter still weighs its previous window, and the block
		{2 * time.Second, true, 1},                   // the block
		{10 * time.Second, true, 0},                  // block over
	}
	for i, st := range steps {
		clock.Set(storetest.Start.Add(st.at))
		if i == 0 {
			for _, k := range algo.Kinds() {
				l := limitOf(k, 1, time.Second)
				if _, err := lim.Allow(ctx, "k", l); err != nil {
					t.Fatal(err)
				}
			}
			blocking := &sluice.Limit{Rate: 1, Period: time.Second, BlockFor: 10 * time.Second}
			lim.Allow(ctx, "b", blocking)
			lim.Allow(ctx, "b", blocking)
		}
		if st.sweep {
			s.Sweep()
		}
		if got := s.Stats().Keys; got != st.wantLen {
			t.Fatalf("step %d (+%v): Len %d, want %d", i, st.at, got, st.wantLen)
		}
	}
	// Everything is forgotten: every algorithm sees a fresh key.
	for _, k := range algo.Kinds() {
		if d, _ := lim.Allow(ctx, "k", limitOf(k, 1, time.Second)); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("%s after expiry: %+v", k, d)
		}
	}
}

// TestLookupDropsIdle checks the opportunistic reclaim: a lookup that meets
// an idle entry removes it.
func TestLookupDropsIdle(t *testing.T) {
	clock := storetest.NewClock(storetest.Start)
	s := memstore.New(memstore.Config{Now: clock.Now, SweepInterval: -1, Shards: 1})
	lim := sluice.NewLimiter(s)
	l := limitOf(algo.GCRA, 10, time.Second)
	lim.Allow(ctx, "k", l)
	if s.Stats().Keys != 1 {
		t.Fatalf("Len %d after one hit", s.Stats().Keys)
	}
	clock.Advance(time.Hour)
	lim.AllowN(ctx, "k", l, 0)
	if s.Stats().Keys != 0 {
		t.Fatalf("Len %d after a peek at an idle key", s.Stats().Keys)
	}
}

// TestSweeper runs the background sweep on synctest's fake clock.
func TestSweeper(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memstore.New(memstore.Config{SweepInterval: time.Second})
		defer s.Close()
		lim := sluice.NewLimiter(s)
		for i := range 1000 {
			lim.Allow(ctx, fmt.Sprint("k", i), limitOf(algo.FixedWindow, 5, 500*time.Millisecond))
			lim.Allow(ctx, fmt.Sprint("l", i), limitOf(algo.SlidingLog, 5, 500*time.Millisecond))
		}
		full := s.Stats().Bytes
		if s.Stats().Keys != 2000 {
			t.Fatalf("Len %d, want 2000", s.Stats().Keys)
		}
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		if s.Stats().Keys != 0 {
			t.Fatalf("Len %d after a sweep, want 0", s.Stats().Keys)
		}
		if s.Stats().Bytes >= full {
			t.Fatalf("Bytes %d after sweeping everything, %d before: tables did not shrink", s.Stats().Bytes, full)
		}
	})
}

// TestMemoryCap fills a capped store with far more keys than fit.
func TestMemoryCap(t *testing.T) {
	for _, k := range []algo.Kind{algo.FixedWindow, algo.SlidingLog} {
		t.Run(k.String(), func(t *testing.T) {
			clock := storetest.NewClock(storetest.Start)
			const maxBytes = 64 << 10
			s := memstore.New(memstore.Config{Now: clock.Now, MaxBytes: maxBytes, Shards: 4, SweepInterval: -1})
			lim := sluice.NewLimiter(s)
			l := limitOf(k, 1, time.Hour)
			const keys = 20000
			for i := range keys {
				d, err := lim.Allow(ctx, fmt.Sprint("key", i), l)
				if err != nil || !d.Allowed {
					t.Fatalf("key %d: %+v %v", i, d, err)
				}
				if i%1000 == 0 {
					clock.Advance(time.Second)
				}
			}
			if b := s.Stats().Bytes; b > maxBytes {
				t.Fatalf("Bytes %d over MaxBytes %d", b, maxBytes)
			}
			if s.Stats().Keys >= keys || s.Stats().Evictions != int64(keys-s.Stats().Keys) {
				t.Fatalf("Len %d, Evictions %d after %d keys", s.Stats().Keys, s.Stats().Evictions, keys)
			}
			// Evicting hands a client a fresh quota: most of the early keys
			// (the earliest idle-at times) were evicted and admit again; the
			// newest keys were not.
			early, late := 0, 0
			for i := range 1000 {
				if d, _ := lim.AllowN(ctx, fmt.Sprint("key", i), l, 0); d.Remaining == 1 {
					early++
				}
				if d, _ := lim.AllowN(ctx, fmt.Sprint("key", keys-1-i), l, 0); d.Remaining == 1 {
					late++
				}
			}
			if early < 900 || late > early/2 {
				t.Fatalf("fresh quota for %d of the 1000 oldest keys and %d of the 1000 newest", early, late)
			}
		})
	}
}

// TestNoAllocs checks that a decision on an existing key, and on a new key
// that fits, does not allocate.
func TestNoAllocs(t *testing.T) {
	s := memstore.New(memstore.Config{SweepInterval: -1, Shards: 1})
	lim := sluice.NewLimiter(s)
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprint("key", i)
	}
	for _, k := range algo.Kinds() {
		if !k.HasState() {
			continue
		}
		l := limitOf(k, 1000, time.Hour)
		// Make room for the keys first, so that no table grows below.
		for _, key := range keys {
			lim.Allow(ctx, "warm"+key, l)
		}
		s.Sweep()
		i := 0
		if a := testing.AllocsPerRun(500, func() {
			lim.Allow(ctx, keys[i%len(keys)], l)
			i++
		}); a != 0 {
			t.Errorf("%s: %.1f allocs per Allow", k, a)
		}
		one := []sluice.Hit{{Limit: l, Cost: 1}}
		out1 := make([]sluice.Decision, 1)
		if a := testing.AllocsPerRun(500, func() {
			one[0].Key = keys[i%len(keys)]
			lim.Take(ctx, one, out1)
			i++
		}); a != 0 {
			t.Errorf("%s: %.1f allocs per decision", k, a)
		}
		other := limitOf(algo.TokenBucket, 5, time.Second)
		hits := []sluice.Hit{{Key: "a", Limit: l, Cost: 1}, {Key: "b", Limit: other, Cost: 1}}
		out := make([]sluice.Decision, 2)
		if a := testing.AllocsPerRun(500, func() { lim.Take(ctx, hits, out) }); a != 0 {
			t.Errorf("%s: %.1f allocs per two-limit decision", k, a)
		}
	}
}

// TestOddInput feeds the store input the Limiter would reject, and times
// at the ends of the range: it must not panic.
func TestOddInput(t *testing.T) {
	for _, now := range []time.Time{time.Unix(0, 0), time.Unix(0, math.MaxInt64-1), time.Unix(-1e9, 0)} {
		s := memstore.New(memstore.Config{Now: func() time.Time { return now }, SweepInterval: -1})
		for _, k := range algo.Kinds() {
			for _, l := range []*sluice.Limit{
				{Algorithm: sluice.Algorithm(k), Rate: math.MaxInt64, Period: 1},
				{Algorithm: sluice.Algorithm(k), Rate: 1, Period: math.MaxInt64, BlockFor: math.MaxInt64},
				{Algorithm: sluice.Algorithm(k), Rate: 0, Period: 0},
				{Algorithm: sluice.Algorithm(k), Rate: -1, Period: -5, Burst: -1},
			} {
				for _, cost := range []int64{-1, 0, 1, math.MaxInt64} {
					hits := []sluice.Hit{{Key: "k", Limit: l, Cost: cost}, {Key: "k", Limit: l, Cost: cost}}
					out := make([]sluice.Decision, 2)
					if err := s.Take(ctx, hits, out); err != nil {
						t.Fatal(err)
					}
					if err := s.Take(ctx, hits[:1], out); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		s.Sweep()
		if err := s.Take(ctx, make([]sluice.Hit, 2), nil); err == nil {
			t.Fatalf("Take with a short out: no error")
		}
	}
}

func Example() {
	clock := storetest.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	store := memstore.New(memstore.Config{Now: clock.Now})
	defer store.Close()
	lim := sluice.NewLimiter(store)

	login := &sluice.Limit{Name: "login", Algorithm: sluice.TokenBucket, Rate: 1, Period: time.Hour, Burst: 3}
	for range 4 {
		d, _ := lim.Allow(context.Background(), "login:kristie", login)
		fmt.Println(d.Allowed, d.Remaining, d.RetryAfter)
	}
	clock.Advance(time.Hour)
	d, _ := lim.Allow(context.Background(), "login:kristie", login)
	fmt.Println(d.Allowed, d.Remaining)
	// Output:
	// true 2 0s
	// true 1 0s
	// true 0 0s
	// false 0 1h0m0s
	// true 0
}
