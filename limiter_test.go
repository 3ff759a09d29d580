package sluice_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/vocab/limits"
	"github.com/sluicehq/sluice/memstore"
)

var epoch = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)

func newLimiter(t *testing.T, now *time.Time) *sluice.Limiter {
	t.Helper()
	s := memstore.New(memstore.Config{Now: func() time.Time { return *now }, SweepInterval: -1})
	t.Cleanup(func() { s.Close() })
	return sluice.NewLimiter(s)
}

func TestBadInputIsAnErrorAndChangesNothing(t *testing.T) {
	now := epoch
	lim := newLimiter(t, &now)
	ctx := context.Background()
	good := &sluice.Limit{Rate: 2, Period: time.Minute}
	for _, tc := range []struct {
		name string
		hits []sluice.Hit
		want string
	}{
		{"negative cost", []sluice.Hit{{Key: "k", Limit: good, Cost: -1}}, "negative cost"},
		{"huge cost", []sluice.Hit{{Key: "k", Limit: good, Cost: sluice.MaxCost + 1}}, "too large"},
		{"10 KB key", []sluice.Hit{{Key: strings.Repeat("k", 10<<10), Limit: good, Cost: 1}}, "key of 10240 bytes"},
		{"nil limit", []sluice.Hit{{Key: "k", Cost: 1}}, "no limit"},
		{"zero period", []sluice.Hit{{Key: "k", Limit: &sluice.Limit{Rate: 1}, Cost: 1}}, "period must be positive"},
		{"negative rate", []sluice.Hit{{Key: "k", Limit: &sluice.Limit{Rate: -1, Period: time.Second}, Cost: 1}}, "rate must not be negative"},
		{"burst on a window", []sluice.Hit{{Key: "k", Limit: &sluice.Limit{Rate: 1, Period: time.Second, Burst: 5}, Cost: 1}}, "burst applies only"},
		{"bad refill", []sluice.Hit{{Key: "k", Limit: &sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 1, Period: time.Hour, RefillInterval: time.Minute}, Cost: 1}}, "whole number of tokens"},
		{"bad soft", []sluice.Hit{{Key: "k", Limit: &sluice.Limit{Rate: 1, Period: time.Second, SoftPercent: -3}, Cost: 1}}, "soft percent"},
		{"offset before the window", []sluice.Hit{{Key: "k", Limit: &sluice.Limit{Rate: 1, Period: time.Minute, WindowOffset: -time.Second}, Cost: 1}}, "window offset must be in"},
		{"offset past the period", []sluice.Hit{{Key: "k", Limit: &sluice.Limit{Rate: 1, Period: time.Minute, WindowOffset: 2 * time.Minute}, Cost: 1}}, "window offset must be in"},
		{"offset on a bucket", []sluice.Hit{{Key: "k", Limit: &sluice.Limit{Algorithm: sluice.GCRA, Rate: 1, Period: time.Minute, WindowOffset: time.Second}, Cost: 1}}, "window offset applies only"},
		{"too many", make([]sluice.Hit, sluice.MaxHits+1), "at most 64"},
		// The good hit comes first: it must not be consumed either.
		{"one bad among good", []sluice.Hit{{Key: "k", Limit: good, Cost: 1}, {Key: "k2", Limit: good, Cost: -5}}, "negative cost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := make([]sluice.Decision, len(tc.hits))
			_, err := lim.Take(ctx, tc.hits, out)
			if !errors.Is(err, sluice.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
	// Nothing was consumed: both hits of the good limit are still there.
	for i := range 2 {
		d, err := lim.Allow(ctx, "k", good)
		if err != nil || !d.Allowed {
			t.Fatalf("request %d after bad input: %+v %v", i, d, err)
		}
	}
	if d, _ := lim.Allow(ctx, "k", good); d.Allowed {
		t.Fatal("third request allowed")
	}
}

func TestOverallPicksTheDecidingLimit(t *testing.T) {
	now := epoch
	lim := newLimiter(t, &now)
	ctx := context.Background()
	perSecond := &sluice.Limit{Name: "s", Rate: 1, Period: time.Second}
	perMinute := &sluice.Limit{Name: "m", Rate: 3, Period: time.Minute}
	hits := []sluice.Hit{{Key: "a", Limit: perMinute, Cost: 1}, {Key: "a", Limit: perSecond, Cost: 1}}
	per := make([]sluice.Decision, len(hits))
	d, err := lim.Take(ctx, hits, per)
	if err != nil {
		t.Fatal(err)
	}
	// Allowed: the hit with the least remaining decides (per second: 0 left).
	if !d.Allowed || d.Index != 1 || d.Remaining != 0 || d.Limit != 1 {
		t.Errorf("allowed decision %+v", d)
	}
	if per[0].Remaining != 2 || per[1].Remaining != 0 {
		t.Errorf("per-hit remaining %d, %d", per[0].Remaining, per[1].Remaining)
	}
	now = now.Add(100 * time.Millisecond)
	d, err = lim.Take(ctx, hits, per)
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.Index != 1 || d.RetryAfter != 900*time.Millisecond {
		t.Errorf("denied decision %+v", d)
	}
	if !per[0].Allowed || per[1].Allowed {
		t.Errorf("per-hit allowed %v, %v", per[0].Allowed, per[1].Allowed)
	}
	// The denial consumed nothing from the per-minute limit.
	d, err = lim.AllowN(ctx, "a", perMinute, 0)
	if err != nil || d.Remaining != 2 {
		t.Errorf("per-minute after a denial: %+v %v", d, err)
	}
}

func TestNoHits(t *testing.T) {
	now := epoch
	var per []sluice.Decision
	d, err := newLimiter(t, &now).Take(context.Background(), nil, per)
	if err != nil || !d.Allowed || d.Index != -1 || len(per) != 0 {
		t.Errorf("%+v %v %v", d, per, err)
	}
}

func TestSoftLimitReportsTheConfiguredLimit(t *testing.T) {
	now := epoch
	lim := newLimiter(t, &now)
	l := &sluice.Limit{Rate: 10, Period: time.Minute, SoftPercent: 20} // enforced: 12
	ctx := context.Background()
	for i := 1; i <= 12; i++ {
		d, err := lim.Allow(ctx, "k", l)
		if err != nil || !d.Allowed {
			t.Fatalf("request %d: %+v %v", i, d, err)
		}
		wantRemaining := max(0, int64(10-i))
		if d.Limit != 10 || d.Remaining != wantRemaining || d.Over != (i > 10) {
			t.Errorf("request %d: limit %d remaining %d over %v", i, d.Limit, d.Remaining, d.Over)
		}
	}
	if d, _ := lim.Allow(ctx, "k", l); d.Allowed {
		t.Error("request 13 allowed past the soft margin")
	}
}

func TestParamsMargins(t *testing.T) {
	for _, tc := range []struct {
		l    sluice.Limit
		want int64
	}{
		{sluice.Limit{Rate: 10, Period: time.Second}, 10},
		{sluice.Limit{Rate: 10, Period: time.Second, SoftPercent: 15}, 12}, // ceil(11.5)
		{sluice.Limit{Algorithm: sluice.GCRA, Rate: 10, Period: time.Second, Burst: 4}, 4},
		{sluice.Limit{Algorithm: sluice.GCRA, Rate: 10, Period: time.Second}, 10},
		{sluice.Limit{Rate: 10, Period: time.Second, ElasticCeiling: 25}, 25},
		{sluice.Limit{Rate: sluice.MaxCost, Period: time.Second, SoftPercent: 1000}, 11 * sluice.MaxCost},
	} {
		if err := tc.l.Validate(); err != nil {
			t.Errorf("%+v: %v", tc.l, err)
			continue
		}
		if p := limits.Params(&tc.l); p.Capacity != tc.want {
			t.Errorf("%+v: capacity %d, want %d", tc.l, p.Capacity, tc.want)
		}
	}
	bad := sluice.Limit{Rate: 10, Period: time.Second, ElasticCeiling: 5}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "below the limit") {
		t.Errorf("elastic ceiling below the limit: %v", err)
	}
	multi := sluice.Limit{Rate: -1, Period: -1, SoftPercent: 5000}
	if err := multi.Validate(); err == nil || strings.Count(err.Error(), "\n") < 2 {
		t.Errorf("want every problem listed, got %v", err)
	}
}

func ExampleLimiter_Take() {
	now := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	store := memstore.New(memstore.Config{Now: func() time.Time { return now }})
	defer store.Close()
	lim := sluice.NewLimiter(store)
	ctx := context.Background()

	perSecond := &sluice.Limit{Name: "1/s", Rate: 1, Period: time.Second}
	perDay := &sluice.Limit{Name: "3/day", Rate: 3, Period: 24 * time.Hour}
	post := func() {
		per := make([]sluice.Decision, 2)
		d, err := lim.Take(ctx, []sluice.Hit{
			{Key: "post/s:ana", Limit: perSecond, Cost: 1},
			{Key: "post/d:ana", Limit: perDay, Cost: 1},
		}, per)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s allowed=%v day-remaining=%d retry-after=%v\n",
			now.Format("15:04:05.000"), d.Allowed, per[1].Remaining, d.RetryAfter)
	}
	post()
	now = now.Add(200 * time.Millisecond)
	post() // denied by the per-second limit: the day quota is untouched
	now = now.Add(800 * time.Millisecond)
	post()
	// Output:
	// 10:00:00.000 allowed=true day-remaining=2 retry-after=0s
	// 10:00:00.200 allowed=false day-remaining=2 retry-after=800ms
	// 10:00:01.000 allowed=true day-remaining=1 retry-after=0s
}
