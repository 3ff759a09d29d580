package ratelimitheaders

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
)

// RateLimit-Policy's w is the time over which a limit admits its quota
// q: a window algorithm's period, a bucket's time to refill its burst, so
// that q/w is the sustained rate and q the most admitted at once.
func TestPolicyWindow(t *testing.T) {
	for _, tc := range []struct {
		l    sluice.Limit
		want string
	}{
		{sluice.Limit{Name: "w", Rate: 100, Period: time.Minute}, `"w";q=100;w=60`},
		{sluice.Limit{Name: "w", Rate: 5, Period: time.Minute, Algorithm: sluice.SlidingWindow}, `"w";q=5;w=60`},
		{sluice.Limit{Name: "b", Rate: 10, Period: time.Minute, Algorithm: sluice.TokenBucket}, `"b";q=10;w=60`},
		{sluice.Limit{Name: "b", Rate: 10, Burst: 100, Period: time.Minute, Algorithm: sluice.TokenBucket}, `"b";q=100;w=600`},
		{sluice.Limit{Name: "b", Rate: 1, Burst: 10, Period: time.Hour, Algorithm: sluice.TokenBucket, RefillInterval: time.Hour}, `"b";q=10;w=36000`},
		{sluice.Limit{Name: "g", Rate: 30, Burst: 10, Period: time.Minute, Algorithm: sluice.GCRA}, `"g";q=10;w=20`},
		{sluice.Limit{Name: "l", Rate: 3, Burst: 2, Period: time.Second, Algorithm: sluice.LeakyBucket}, `"l";q=2;w=1`},
		{sluice.Limit{Name: "z", Rate: 0, Burst: 5, Period: time.Minute, Algorithm: sluice.GCRA}, `"z";q=5;w=60`},
	} {
		if got := string(AppendPolicy(nil, []decide.LimitOutcome{{Limit: &tc.l}})); got != tc.want {
			t.Errorf("%+v: %s, want %s", tc.l, got, tc.want)
		}
	}
}

// Of limits with the same quota left, the headers describe the one whose
// quota comes back later: a client that waits its t finds the others'
// back too.
func TestDecidingLaterQuota(t *testing.T) {
	day := &sluice.Limit{Name: "day", Rate: 1000, Period: 24 * time.Hour}
	// 10 tokens, one back an hour, all spent: full in 10 hours, a token
	// in 1.
	bucket := &sluice.Limit{Name: "bucket", Rate: 1, Burst: 10, Period: time.Hour, Algorithm: sluice.TokenBucket}
	o := &decide.Outcome{
		Overall: sluice.Decision{Allowed: true, Index: 0},
		Limits: []decide.LimitOutcome{
			{Limit: bucket, Decision: sluice.Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: 10 * time.Hour}},
			{Limit: day, Decision: sluice.Decision{Allowed: true, Limit: 1000, Remaining: 0, ResetAfter: 5 * time.Hour}},
		},
	}
	if d := Deciding(o); d != 1 {
		t.Fatalf("deciding %d, want the day's window (1)", d)
	}
	if got := string(AppendRateLimit(nil, &o.Limits[1])); got != `"day";r=0;t=18000` {
		t.Errorf("RateLimit %s", got)
	}
	if got := Reset(&o.Limits[0]); got != 3600 {
		t.Errorf("the bucket's t: %d, want 3600", got)
	}
}

// A denial's Retry-After is never earlier than the t of the limit the
// headers describe, even when the overall decision's own wait is shorter
// (a denial by something the limits do not describe).
func TestRetryAfterNotBeforeReset(t *testing.T) {
	l := &sluice.Limit{Name: "m", Rate: 3, Period: time.Minute}
	o := &decide.Outcome{
		Overall: sluice.Decision{Allowed: false, RetryAfter: time.Second, Index: -1},
		Limits:  []decide.LimitOutcome{{Limit: l, Decision: sluice.Decision{Allowed: true, Limit: 3, ResetAfter: 40 * time.Second}}},
	}
	dl := &o.Limits[Deciding(o)]
	if r, ra := Reset(dl), RetryAfter(o, dl); r != 40 || ra != 40 {
		t.Errorf("t=%d, Retry-After %d; want 40 and 40", r, ra)
	}
	// A zero limit admits nothing whenever one waits: both say its
	// period, after which it may have been changed.
	z := &sluice.Limit{Name: "z", Rate: 0, Period: time.Minute, Algorithm: sluice.GCRA}
	o = &decide.Outcome{
		Overall: sluice.Decision{Allowed: false, RetryAfter: sluice.Never, Index: 0},
		Limits:  []decide.LimitOutcome{{Limit: z, Decision: sluice.Decision{Allowed: false, RetryAfter: sluice.Never}}},
	}
	if r, ra := Reset(&o.Limits[0]), RetryAfter(o, &o.Limits[0]); r != 60 || ra != 60 {
		t.Errorf("zero limit: t=%d, Retry-After %d; want 60 and 60", r, ra)
	}
}
