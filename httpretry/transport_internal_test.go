package httpretry

import (
	"strconv"
	"testing"
	"time"
)

// TestJitterBounds draws the backoff many times with the default source:
// every draw within [0, ceiling], spread over it (the mean near half the
// ceiling, both halves well used), the ceiling doubling up to MaxDelay.
func TestJitterBounds(t *testing.T) {
	tr := New(Config{BaseDelay: 100 * time.Millisecond, MaxDelay: 3 * time.Second})
	for k, ceil := range []time.Duration{100, 200, 400, 800, 1600, 3000, 3000} {
		ceil *= time.Millisecond
		if k == 6 {
			k = 100 // far past the cap: no overflow
		}
		const draws = 5000
		var sum float64
		low := 0
		for range draws {
			d := tr.backoff(k)
			if d < 0 || d > ceil {
				t.Fatalf("retry %d: drew %v, outside [0, %v]", k, d, ceil)
			}
			sum += float64(d)
			if d < ceil/2 {
				low++
			}
		}
		mean := time.Duration(sum / draws)
		if mean < ceil*45/100 || mean > ceil*55/100 || low < draws*4/10 || low > draws*6/10 {
			t.Errorf("retry %d: mean %v and %d of %d below half of %v; want uniform", k, mean, low, draws, ceil)
		}
	}
}

// TestBackoffBadRand checks that a Rand out of its contract cannot make
// a negative or over-cap sleep.
func TestBackoffBadRand(t *testing.T) {
	for _, r := range []func(int64) int64{
		func(int64) int64 { return -5 },
		func(n int64) int64 { return n * 3 },
	} {
		tr := New(Config{BaseDelay: time.Second, Rand: r})
		if d := tr.backoff(0); d < 0 || d > time.Second {
			t.Errorf("drew %v, outside [0, 1s]", d)
		}
	}
}

// TestHostMapBounded checks that the host map never holds more than
// MaxHosts, forgetting idle hosts first.
func TestHostMapBounded(t *testing.T) {
	hm := hostMap{max: 4}
	const slot = int64(10 * time.Second)
	t0 := now.UnixNano()
	busy := hm.getOrCreate("busy", t0, slot)
	busy.hold = t0 + int64(time.Hour)
	for i := range 100 {
		hm.getOrCreate("h"+strconv.Itoa(i), t0, slot)
		if n := hm.len(); n > 4 {
			t.Fatalf("%d hosts held, want at most 4", n)
		}
	}
	if hm.get("busy") != busy {
		t.Errorf("the held host was forgotten while idle ones were there")
	}
}

// TestWindowSlides checks the budget's counts: kept for twelve slots,
// forgotten after.
func TestWindowSlides(t *testing.T) {
	var w window
	const slot = int64(10 * time.Second)
	t0 := now.UnixNano()
	w.add(t0, slot, 3, 1)
	w.add(t0+5*slot, slot, 2, 2)
	if req, acc := w.sums(t0+11*slot, slot); req != 5 || acc != 3 {
		t.Errorf("after 11 slots: %d, %d; want 5, 3", req, acc)
	}
	if req, acc := w.sums(t0+12*slot, slot); req != 2 || acc != 2 {
		t.Errorf("after 12 slots: %d, %d; want 2, 2", req, acc)
	}
	if req, _ := w.sums(t0+20*slot, slot); req != 0 {
		t.Errorf("after 20 slots: %d requests, want 0", req)
	}
}

func TestErrorText(t *testing.T) {
	cases := []struct {
		e    Error
		want string
	}{
		{Error{Err: ErrDeadline, Status: 429, Wait: 30 * time.Second, Source: SourceRetryAfter}, "httpretry: a wait of 30s (Retry-After) reaches the request's deadline (after 429 Too Many Requests)"},
		{Error{Err: ErrDeadline, Wait: time.Minute, Source: SourceQuota}, "httpretry: a wait of 1m0s (quota) reaches the request's deadline"},
		{Error{Err: ErrRejected}, "httpretry: rejected locally by the adaptive retry budget"},
	}
	for _, c := range cases {
		if got := c.e.Error(); got != c.want {
			t.Errorf("got %q, want %q", got, c.want)
		}
	}
}

// TestSpreadBounds checks that a server's wait is only ever extended, by
// at most HintJitter, whatever Rand returns, and not at all when the
// jitter is off or the wait is at the end of time.
func TestSpreadBounds(t *testing.T) {
	for _, r := range []func(int64) int64{nil, func(int64) int64 { return -5 }, func(n int64) int64 { return n * 3 }} {
		tr := New(Config{HintJitter: 500 * time.Millisecond, Rand: r})
		for range 1000 {
			if d := tr.spread(3 * time.Second); d < 3*time.Second || d > 3500*time.Millisecond {
				t.Fatalf("spread 3s to %v, want within [3s, 3.5s]", d)
			}
		}
		if d := tr.spread(time.Duration(1<<63 - 1)); d != time.Duration(1<<63-1) {
			t.Errorf("spread of the largest duration overflowed to %v", d)
		}
	}
	if d := New(Config{HintJitter: -1}).spread(3 * time.Second); d != 3*time.Second {
		t.Errorf("HintJitter -1 spread 3s to %v", d)
	}
}
