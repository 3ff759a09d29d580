package main

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

// redisNow reads a real redis-server's TIME, the clock sluice serve
// decides by on Redis (it cannot be set, so the rules are built around it).
func redisNow(t *testing.T, srv *redistest.Server) time.Time {
	t.Helper()
	now, err := srv.Time()
	if err != nil {
		t.Fatal(err)
	}
	return now
}

// Two sluice serve nodes on one real Redis, with schedules built around
// Redis's time: a window that holds now replaces the rule's limit; a
// window that ends at the next minute hands over, at Redis's minute, to
// the rule's own limit, and one that starts then takes over from it, each
// in counters of its own; both nodes switch together.
func TestServeScheduleOnRedis(t *testing.T) {
	besideFromTheStart(t)
	srv := redistest.Standalone(t)
	now := redisNow(t, srv).UTC()
	// The limits are per hour, and a counter starts afresh on the hour:
	// the test (at most 80 s from now) must not cross one.
	if hour := now.Truncate(time.Hour).Add(time.Hour); hour.Sub(now) < 80*time.Second {
		time.Sleep(hour.Sub(now) + time.Second)
		now = redisNow(t, srv).UTC()
	}
	boundary := now.Truncate(time.Minute).Add(time.Minute)
	if boundary.Sub(now) < 5*time.Second { // room for the nodes to start before it
		boundary = boundary.Add(time.Minute)
	}
	hm := func(t time.Time) string { return t.Format("15:04") }
	rules := filepath.Join(t.TempDir(), "sched.yaml")
	writeRules(t, rules, fmt.Sprintf(`domain: sched
descriptors:
  - key: held
    rate_limit: {unit: hour, requests_per_unit: 100}
    schedules:
      - {name: now, from: "%[1]s", to: "%[2]s", tz: UTC, rate_limit: {unit: hour, requests_per_unit: 3}}
  - key: ending
    rate_limit: {unit: hour, requests_per_unit: 4}
    schedules:
      - {name: ending, from: "%[1]s", to: "%[3]s", tz: UTC, rate_limit: {unit: hour, requests_per_unit: 2}}
  - key: starting
    rate_limit: {unit: hour, requests_per_unit: 5}
    schedules:
      - {name: starting, from: "%[3]s", to: "%[2]s", tz: UTC, rate_limit: {unit: hour, requests_per_unit: 1}}
`, hm(boundary.Add(-3*time.Minute)), hm(boundary.Add(3*time.Minute)), hm(boundary)))
	nodes := startSluices(t, 2, "--config", rules, "--store", "redis", "--redis-url", srv.URL(), "--debug-addr", "")
	count := func(key string, n int) int {
		t.Helper()
		ok := 0
		for i := range n {
			if nodes[i%2].must("sched", desc(key, "x")).GetOverallCode() == rlsv3.RateLimitResponse_OK {
				ok++
			}
		}
		return ok
	}
	if got := count("held", 8); got != 3 {
		t.Errorf("a window that holds: %d of 8 admitted across two nodes, want its 3", got)
	}
	if redisNow(t, srv).After(boundary.Add(-time.Second)) {
		t.Fatalf("the nodes took until %v to answer: too close to the switch at %v to tell", redisNow(t, srv), boundary)
	}
	if got := count("ending", 6); got != 2 {
		t.Errorf("before the switch: %d of 6 admitted, want the window's 2", got)
	}
	if got := count("starting", 7); got != 5 {
		t.Errorf("before the switch: %d of 7 admitted, want the rule's own 5", got)
	}
	// Wait for Redis's clock to pass the boundary, and a little more than
	// the nodes' estimate of it may be off.
	for redisNow(t, srv).Before(boundary.Add(200 * time.Millisecond)) {
		time.Sleep(100 * time.Millisecond)
	}
	if got := count("ending", 6); got != 4 {
		t.Errorf("after the switch: %d of 6 admitted, want the rule's own 4 (the window's count does not carry)", got)
	}
	if got := count("starting", 3); got != 1 {
		t.Errorf("after the switch: %d of 3 admitted, want the window's 1 (the rule's count does not carry)", got)
	}
	if got := count("held", 2); got != 0 {
		t.Errorf("the held window, spent: %d of 2 admitted after the switch", got)
	}
}
