package limits_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/vocab/limits"
	"github.com/sluicehq/sluice/memstore"
)

// MoreAfter on real decisions: after each request, a peek at MoreAfter
// later reports more quota than the request left, and for the fixed window
// and the buckets a peek a nanosecond earlier does not. Soft margins
// report Remaining against the configured limit: more means more of that.
func TestMoreAfter(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		limit sluice.Limit
		exact bool
	}{
		{"fixed soft", sluice.Limit{Rate: 3, Period: time.Minute, SoftPercent: 100}, true},
		{"bucket soft", sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 1, Burst: 3, Period: time.Hour, SoftPercent: 100}, true},
		{"gcra", sluice.Limit{Algorithm: sluice.GCRA, Rate: 3, Burst: 2, Period: time.Second}, true},
		{"discrete soft", sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 2, Burst: 4, Period: time.Minute, RefillInterval: 30 * time.Second, SoftPercent: 50}, true},
		{"sliding soft", sluice.Limit{Algorithm: sluice.SlidingWindow, Rate: 4, Period: time.Minute, SoftPercent: 50}, false},
		{"log", sluice.Limit{Algorithm: sluice.SlidingLog, Rate: 3, Period: time.Minute}, false},
	} {
		l := tc.limit
		start := time.Date(2026, 1, 1, 12, 0, 20, 0, time.UTC).UnixNano()
		// Request i comes 7 s after request i−1. Peeks ahead may make a
		// store forget a state whose quota is all back, so each request
		// is decided on a store of its own that replays those before it.
		for i := range 8 {
			var now atomic.Int64
			store := memstore.New(memstore.Config{Now: func() time.Time { return time.Unix(0, now.Load()) }})
			lim := sluice.NewLimiter(store)
			var d sluice.Decision
			for j := 0; j <= i; j++ {
				now.Store(start + int64(j)*int64(7*time.Second))
				var err error
				if d, err = lim.Allow(ctx, "k", &l); err != nil {
					t.Fatal(err)
				}
			}
			if !d.Allowed {
				store.Close()
				break
			}
			more := limits.MoreAfter(&l, d)
			if more <= 0 || more >= sluice.Never {
				t.Fatalf("%s: request %d: %+v: MoreAfter %v", tc.name, i, d, more)
			}
			at := now.Load()
			peek := func(after time.Duration) int64 {
				t.Helper()
				now.Store(at + int64(after))
				p, err := lim.AllowN(ctx, "k", &l, 0)
				if err != nil {
					t.Fatal(err)
				}
				return p.Remaining
			}
			if tc.exact {
				if r := peek(more - 2); r > d.Remaining {
					t.Errorf("%s: request %d: %+v: MoreAfter %v, but Remaining is %d already 2 ns earlier", tc.name, i, d, more, r)
				}
			}
			if r := peek(more); r <= d.Remaining {
				t.Errorf("%s: request %d: %+v: %v later, Remaining %d", tc.name, i, d, more, r)
			}
			store.Close()
		}
	}
}

// A denial's MoreAfter is its RetryAfter; a limit that admits nothing
// never has more, but for a fixed window, whose whole quota (or its
// changed limit) comes when the window ends; a limit with all its quota
// has no more to come.
func TestMoreAfterEdges(t *testing.T) {
	bucket := sluice.Limit{Algorithm: sluice.GCRA, Rate: 1, Burst: 5, Period: time.Hour}
	if got := limits.MoreAfter(&bucket, sluice.Decision{Remaining: 0, ResetAfter: 5 * time.Hour, RetryAfter: 3 * time.Hour}); got != 3*time.Hour {
		t.Errorf("denial: %v", got)
	}
	if got := limits.MoreAfter(&bucket, sluice.Decision{Allowed: true, Remaining: 5}); got != 0 {
		t.Errorf("full: %v", got)
	}
	zero := sluice.Limit{Algorithm: sluice.SlidingWindow, Rate: 0, Period: time.Minute}
	if got := limits.MoreAfter(&zero, sluice.Decision{RetryAfter: sluice.Never, ResetAfter: time.Second}); got != sluice.Never {
		t.Errorf("zero sliding window: %v", got)
	}
	zeroFixed := sluice.Limit{Rate: 0, Period: time.Minute}
	if got := limits.MoreAfter(&zeroFixed, sluice.Decision{RetryAfter: sluice.Never, ResetAfter: time.Second}); got != time.Second {
		t.Errorf("zero fixed window: %v", got)
	}
	if got := limits.Window(&sluice.Limit{Rate: 10, Burst: 100, Period: time.Minute, Algorithm: sluice.TokenBucket}); got != 10*time.Minute {
		t.Errorf("Window: %v", got)
	}
}
