package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
	"github.com/sluicehq/sluice/internal/vocab/limits"
)

// basic: admit up to the limit, deny the next with a finite RetryAfter,
// deny a cost above the limit with Never, admit again once replenished.
func (s suite) basic(t *testing.T) {
	s.forKinds(t, func(t *testing.T, e *env, k algo.Kind) {
		l := &sluice.Limit{Name: "basic", Algorithm: sluice.Algorithm(k), Rate: 4, Period: time.Second}
		for i := range 4 {
			d := e.allow("k", l, 1)
			want(t, fmt.Sprintf("request %d", i+1), d, true, int64(3-i))
			if d.Limit != 4 {
				t.Fatalf("Limit = %d, want 4", d.Limit)
			}
		}
		d := e.allow("k", l, 1)
		want(t, "request 5", d, false, 0)
		if d.RetryAfter > 2*time.Second {
			t.Fatalf("request 5: RetryAfter %v, want at most two periods", d.RetryAfter)
		}
		if d := e.allow("other", l, 5); d.Allowed || d.RetryAfter != sluice.Never {
			t.Fatalf("cost above the limit: %+v, want denied with RetryAfter Never", d)
		}
		if d := e.allow("other", l, 0); !d.Allowed || d.Remaining != 4 {
			t.Fatalf("a denied cost above the limit consumed: peek %+v", d)
		}
		e.clock.Advance(d.RetryAfter)
		if d := e.allow("k", l, 1); !d.Allowed {
			t.Fatalf("denied after waiting the RetryAfter of the denial: %+v", d)
		}
		e.clock.Advance(3 * time.Second)
		want(t, "after replenishing", e.allow("k", l, 1), true, 3)
	})
}

func (s suite) zeroLimit(t *testing.T) {
	s.forKinds(t, func(t *testing.T, e *env, k algo.Kind) {
		l := &sluice.Limit{Algorithm: sluice.Algorithm(k), Rate: 0, Period: time.Minute}
		for range 2 {
			if d := e.allow("k", l, 1); d.Allowed || d.RetryAfter != sluice.Never {
				t.Fatalf("zero limit: %+v, want denied with RetryAfter Never", d)
			}
		}
	})
}

// peek: cost 0 reports without consuming.
func (s suite) peek(t *testing.T) {
	s.forKinds(t, func(t *testing.T, e *env, k algo.Kind) {
		l := &sluice.Limit{Algorithm: sluice.Algorithm(k), Rate: 4, Period: time.Minute}
		want(t, "peek at a fresh key", e.allow("k", l, 0), true, 4)
		e.allow("k", l, 1)
		e.allow("k", l, 1)
		for range 3 {
			want(t, "peek after two hits", e.allow("k", l, 0), true, 2)
		}
		e.allow("k", l, 2)
		if d := e.allow("k", l, 0); d.Remaining != 0 {
			t.Fatalf("peek at an exhausted key: %+v", d)
		}
		want(t, "peek at another key", e.allow("k2", l, 0), true, 4)
	})
}

// softAndElastic: requests within the margin are admitted, reported Over,
// with Remaining 0 and the configured Limit.
func (s suite) softAndElastic(t *testing.T) {
	s.forKinds(t, func(t *testing.T, e *env, k algo.Kind) {
		for _, l := range []*sluice.Limit{
			{Name: "soft", Algorithm: sluice.Algorithm(k), Rate: 10, Period: time.Hour, SoftPercent: 20},
			{Name: "elastic", Algorithm: sluice.Algorithm(k), Rate: 10, Period: time.Hour, ElasticCeiling: 15},
		} {
			top := limits.Params(l).Capacity
			for i := range top {
				d := e.allow(l.Name, l, 1)
				what := fmt.Sprintf("%s request %d", l.Name, i+1)
				want(t, what, d, true, max(9-i, 0))
				if d.Over != (i >= 10) || d.Limit != 10 {
					t.Fatalf("%s: Over=%v Limit=%d", what, d.Over, d.Limit)
				}
			}
			d := e.allow(l.Name, l, 1)
			want(t, l.Name+" beyond the margin", d, false, 0)
			if d.Over {
				t.Fatalf("a denial reported Over: %+v", d)
			}
		}
	})
}

// decisionFields: Limit, Remaining, ResetAfter and RetryAfter at the
// boundaries, for a fixed window, a token bucket and a sliding log.
func (s suite) decisionFields(t *testing.T) {
	type check struct {
		at        time.Duration // since Start
		cost      int64
		allowed   bool
		remaining int64
		reset     time.Duration // -1: not checked
		retry     time.Duration
	}
	cases := []struct {
		limit  sluice.Limit
		checks []check
	}{
		{sluice.Limit{Name: "window", Rate: 5, Period: time.Minute}, []check{
			{10 * time.Second, 1, true, 4, 50 * time.Second, 0},
			{10 * time.Second, 3, true, 1, 50 * time.Second, 0},
			{20 * time.Second, 1, true, 0, 40 * time.Second, 0},
			{20 * time.Second, 1, false, 0, 40 * time.Second, 40 * time.Second},
			{time.Minute - 1, 1, false, 0, 1, 1},
			{time.Minute, 0, true, 5, -1, 0},
			{time.Minute, 5, true, 0, time.Minute, 0},
			{time.Minute, 6, false, 0, time.Minute, sluice.Never},
		}},
		{sluice.Limit{Name: "bucket", Algorithm: sluice.Algorithm(algo.TokenBucket), Rate: 1, Period: time.Second, Burst: 5}, []check{
			{0, 1, true, 4, time.Second, 0},
			{0, 4, true, 0, 5 * time.Second, 0},
			{0, 1, false, 0, 5 * time.Second, time.Second},
			{500 * time.Millisecond, 1, false, 0, 4500 * time.Millisecond, 500 * time.Millisecond},
			{time.Second, 1, true, 0, 5 * time.Second, 0},
			{time.Second, 6, false, 0, 5 * time.Second, sluice.Never},
			{6 * time.Second, 0, true, 5, 0, 0},
		}},
		{sluice.Limit{Name: "log", Algorithm: sluice.Algorithm(algo.SlidingLog), Rate: 3, Period: 10 * time.Second}, []check{
			{0, 1, true, 2, -1, 0},
			{time.Second, 1, true, 1, -1, 0},
			{2 * time.Second, 1, true, 0, -1, 0},
			{3 * time.Second, 1, false, 0, -1, 7 * time.Second},
			{10*time.Second - 1, 1, false, 0, -1, 1},
			{10 * time.Second, 1, true, 0, -1, 0},
			{10 * time.Second, 1, false, 0, -1, time.Second},
		}},
	}
	for _, c := range cases {
		t.Run(c.limit.Name, func(t *testing.T) {
			e := s.env(t)
			for i, ch := range c.checks {
				e.clock.Set(Start.Add(ch.at))
				d := e.allow("k", &c.limit, ch.cost)
				ok := d.Allowed == ch.allowed && d.Remaining == ch.remaining && d.RetryAfter == ch.retry &&
					d.Limit == algo.Nominal(algo.Kind(c.limit.Algorithm), c.limit.Rate, c.limit.Burst) && (ch.reset < 0 || d.ResetAfter == ch.reset)
				if !ok {
					t.Fatalf("check %d (t=+%v cost %d): got %+v, want allowed=%v remaining=%d reset=%v retry=%v limit=%d",
						i, ch.at, ch.cost, d, ch.allowed, ch.remaining, ch.reset, ch.retry, algo.Nominal(algo.Kind(c.limit.Algorithm), c.limit.Rate, c.limit.Burst))
				}
			}
		})
	}
}

func (s suite) canceledContext(t *testing.T) {
	e := s.env(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l := &sluice.Limit{Rate: 1, Period: time.Minute}
	if _, err := e.lim.Allow(ctx, "k", l); err == nil {
		t.Fatalf("Allow with a canceled context returned no error")
	}
	want(t, "after the canceled request", e.allow("k", l, 1), true, 0)
}

// windowOffset: a fixed window whose windows start WindowOffset past the
// epoch's (a calendar period's) counts from there, says so in ResetAfter
// and RetryAfter, and starts afresh at the offset boundary, taken together
// or one by one.
func (s suite) windowOffset(t *testing.T) {
	for _, each := range []bool{false, true} {
		e := s.env(t)
		// Start is a day boundary: the window of now is [Start-7h, Start+17h).
		l := &sluice.Limit{Name: "offset", Algorithm: sluice.FixedWindow, Rate: 3, Period: 24 * time.Hour, WindowOffset: 17 * time.Hour}
		take := func() sluice.Decision {
			if each {
				_, ds := e.each(hit("k", l, 1))
				return ds[0]
			}
			return e.allow("k", l, 1)
		}
		e.clock.Advance(17*time.Hour - 3*time.Second)
		for i := range 3 {
			d := take()
			want(t, fmt.Sprintf("each=%v request %d", each, i+1), d, true, int64(2-i))
			if d.ResetAfter != 3*time.Second {
				t.Fatalf("each=%v: ResetAfter %v, want the 3s left of the offset window", each, d.ResetAfter)
			}
		}
		d := take()
		want(t, fmt.Sprintf("each=%v request 4", each), d, false, 0)
		if d.RetryAfter != 3*time.Second {
			t.Fatalf("each=%v: RetryAfter %v, want 3s, to the offset boundary", each, d.RetryAfter)
		}
		e.clock.Advance(3*time.Second - time.Nanosecond)
		if d := take(); d.Allowed {
			t.Fatalf("each=%v: admitted a nanosecond before the boundary", each)
		}
		e.clock.Advance(time.Nanosecond)
		d = take()
		want(t, fmt.Sprintf("each=%v at the boundary", each), d, true, 2)
		if d.ResetAfter != 24*time.Hour {
			t.Fatalf("each=%v: ResetAfter %v at the boundary, want a whole period", each, d.ResetAfter)
		}
	}
}

// calendarSliding: a sliding window over calendar months, whose Period and
// WindowOffset change from one month to the next, keeps its state under
// its key: March weighs February's count by the share of March still to
// run.
func (s suite) calendarSliding(t *testing.T) {
	for _, each := range []bool{false, true} {
		e := s.env(t)
		month := func(start time.Time, days int) *sluice.Limit {
			per := time.Duration(days) * 24 * time.Hour
			return &sluice.Limit{Name: "month", Algorithm: sluice.SlidingWindow, Rate: 10, Period: per,
				WindowOffset: time.Duration(start.UnixNano() % int64(per))}
		}
		feb := Start.AddDate(0, 1, 0) // Start is 1 January
		mar := feb.AddDate(0, 1, 0)
		take := func(l *sluice.Limit) sluice.Decision {
			if each {
				_, ds := e.each(hit("k", l, 1))
				return ds[0]
			}
			return e.allow("k", l, 1)
		}
		e.clock.Set(mar.Add(-time.Hour))
		for i := range 10 {
			want(t, fmt.Sprintf("each=%v February request %d", each, i+1), take(month(feb, 28)), true, int64(9-i))
		}
		want(t, fmt.Sprintf("each=%v February's 11th", each), take(month(feb, 28)), false, 0)
		// A day into March: February's 10 weigh 30/31 of 10, rounded up.
		e.clock.Set(mar.Add(24 * time.Hour))
		want(t, fmt.Sprintf("each=%v a day into March", each), take(month(mar, 31)), false, 0)
		// Half of March run: February weighs 5, so 5 more.
		e.clock.Set(mar.Add(31 * 12 * time.Hour))
		for i := range 5 {
			want(t, fmt.Sprintf("each=%v mid-March request %d", each, i+1), take(month(mar, 31)), true, int64(4-i))
		}
		want(t, fmt.Sprintf("each=%v mid-March's 6th", each), take(month(mar, 31)), false, 0)
	}
}
