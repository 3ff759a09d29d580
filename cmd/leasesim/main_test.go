package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestBound: across 4 and 64 nodes with uneven demand, on every algorithm
// that leases, the worst excess over the limit's own bound stays within
// the lease bound; and on 4 nodes, for the buckets, the trace does reach
// beyond the limit's own bound (the bound is exercised, not idle; spread
// over 64 nodes, the leases are too small to).
func TestBound(t *testing.T) {
	for _, alg := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyBucket, sluice.FixedWindow, sluice.SlidingWindow} {
		for _, nodes := range []int{4, 64} {
			c := config{nodes: nodes, algorithm: alg, rate: 1000, period: time.Second, burst: 100, overshoot: "400",
				demand: 0.8, skew: 1, duration: 10 * time.Second, phase: 500 * time.Millisecond, burstx: 10, seed: 3}
			r, err := run(c)
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			r.print(&b, c)
			if r.Excess > float64(r.Bound) {
				t.Errorf("%s, %d nodes: excess %.1f over the bound %d\n%s", alg, nodes, r.Excess, r.Bound, b.String())
			}
			bucket := alg != sluice.FixedWindow && alg != sluice.SlidingWindow
			if bucket && nodes == 4 && r.Excess <= 0 {
				t.Errorf("%s, %d nodes: no excess at all: the trace does not exercise the bound\n%s", alg, nodes, b.String())
			}
			if r.Fairness < 0.9 {
				t.Errorf("%s, %d nodes: fairness %.3f\n%s", alg, nodes, r.Fairness, b.String())
			}
			if !strings.Contains(b.String(), "worst excess") {
				t.Errorf("report without the excess:\n%s", b.String())
			}
		}
	}
}

// TestFlags: bad flags are refused with a message.
func TestFlags(t *testing.T) {
	for _, args := range [][]string{{"-algorithm", "sketch"}, {"-nodes", "0"}, {"-burstx", "0.5"}} {
		var b bytes.Buffer
		if _, err := parse(args, &b); err == nil || b.Len() == 0 {
			t.Errorf("%v: %v, %q", args, err, b.String())
		}
	}
	if _, err := bound("150%", 100); err == nil {
		t.Error("150% accepted")
	}
}
