package main

import (
	"io"
	"testing"
	"time"
)

// TestBound: from 4 to 64 Envoys with uneven, shifting demand over the
// limit, answers delayed up to the grace and a quarter of the streams
// killed at half time, on a window and on a bucket: the rates the Envoys
// enforce never sum to more than the limit's, the admitted hits stay
// within the bound (and, over the run, within the limit's rate), the
// admitted follow max-min fair shares of the demand, and the killed
// streams' shares go to the others within TTL, grace and a few reports.
func TestBound(t *testing.T) {
	for _, c := range []config{
		{envoys: 4, algorithm: "fixed_window", rate: 1000, period: time.Second, demand: 1.5, skew: 1},
		{envoys: 64, algorithm: "fixed_window", rate: 60000, period: time.Minute, demand: 1.5, skew: 0.5},
		{envoys: 16, algorithm: "gcra", rate: 500, period: time.Second, burst: 100, demand: 2, skew: 1},
	} {
		c.phase, c.interval, c.ttl, c.grace, c.delay = 10*time.Second, time.Second, 5*time.Second, 2*time.Second, 2*time.Second
		c.kill, c.duration, c.seed = 0.25, 40*time.Second, 7
		r, err := run(c)
		if err != nil {
			t.Fatal(err)
		}
		r.print(io.Discard, c)
		if r.WorstRate > r.LimitRate*(1+1e-9) {
			t.Errorf("%d Envoys, %s: the Envoys enforced %.1f a second at once, over the limit's %.1f", c.envoys, c.algorithm, r.WorstRate, r.LimitRate)
		}
		if r.Admitted > r.Bound || float64(r.Admitted) > r.LimitRate*c.duration.Seconds() {
			t.Errorf("%d Envoys, %s: %d admitted, over the bound %d or the limit's rate over the run", c.envoys, c.algorithm, r.Admitted, r.Bound)
		}
		if float64(r.Admitted) < 0.7*r.LimitRate*c.duration.Seconds() {
			t.Errorf("%d Envoys, %s: %d admitted of a demand 1.5 times the limit: under 70%% of the limit, the shares are not handed out", c.envoys, c.algorithm, r.Admitted)
		}
		if r.Fairness < 0.95 {
			t.Errorf("%d Envoys, %s: fairness %.3f, want at least 0.95", c.envoys, c.algorithm, r.Fairness)
		}
		if r.Reclaimed < 0 || r.Reclaimed > c.ttl+c.grace+3*c.interval {
			t.Errorf("%d Envoys, %s: killed streams' shares reclaimed after %v, want within TTL + grace + 3 reports", c.envoys, c.algorithm, r.Reclaimed)
		}
		t.Logf("%d Envoys, %s: %d admitted (%.3f of the limit's rate; bound %d), worst %.1f/s of %.1f, fairness %.3f, reclaimed after %v",
			c.envoys, c.algorithm, r.Admitted, float64(r.Admitted)/c.duration.Seconds()/r.LimitRate, r.Bound, r.WorstRate, r.LimitRate, r.Fairness, r.Reclaimed)
	}
}

// TestFlags: bad flags are refused with a reason.
func TestFlags(t *testing.T) {
	for _, args := range [][]string{{"-envoys", "0"}, {"-ttl", "1s", "-interval", "1s"}, {"-delay", "5s"}, {"-kill", "2"}} {
		if _, err := parse(args, io.Discard); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
	if _, err := parse(nil, io.Discard); err != nil {
		t.Errorf("defaults: %v", err)
	}
}
