package main

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

// TestServeRedisOutageSpent: a Redis that comes back does not hand out
// quota already spent. Three nodes on one Redis, a key of 300 an hour with
// half of it used; Redis frozen (SIGSTOP) for five seconds under load, long
// enough that every node's registration expires, then thawed with its data.
// During the outage each node admits its third of the limit on its own;
// once Redis is back, the nodes together admit at most what Redis had left
// when it stopped (150), whatever node count they read while they
// register again, and what they admitted during the outage is written
// back to Redis. Exact and lease rules alike.
func TestServeRedisOutageSpent(t *testing.T) {
	beside(t)
	sluiceBinary(t)
	const (
		nodes  = 3
		limit  = 300
		used   = 150
		freeze = 5 * time.Second // past the registry's three seconds
	)
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	rule := "  - key: k\n    rate_limit: {unit: hour, requests_per_unit: " + strconv.Itoa(limit) + "}\n"
	writeRules(t, filepath.Join(dir, "exact.yaml"), "domain: exact\nfailure_policy: local\ndescriptors:\n"+rule)
	writeRules(t, filepath.Join(dir, "lease.yaml"), "domain: lease\nfailure_policy: local\nconsistency: lease\nmax_overshoot: 10\ndescriptors:\n"+rule)
	domains := []string{"exact", "lease"}
	// What a lease rule's nodes may admit beyond the local policy's share
	// during the outage: the hits of the leases they held when Redis
	// froze, taken from Redis before (at most max_overshoot each).
	beyond := []int{0, nodes * 10}

	// One hour window for the whole test: not within two minutes of its
	// end.
	if left := time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)); left < 2*time.Minute {
		t.Logf("waiting %s for the next hour", left.Round(time.Second))
		time.Sleep(left + time.Second)
	}
	procs := startSluices(t, nodes, "--config", dir, "--debug-addr", "",
		"--store", "redis", "--redis-url", srv.URL(), "--redis-timeout", "100ms")
	poll(t, "sluice_nodes 3 on every process", func() bool { return allMetric(procs, "sluice_nodes", strconv.Itoa(nodes)) })
	for _, d := range domains {
		for i := range used {
			if got := codesOf(procs[i%nodes].must(d, desc("k", "a"))); got != "OK:OK" {
				t.Fatalf("%s: request %d before the outage: %s", d, i, got)
			}
		}
	}

	targets := make([]*target, len(domains))
	for i, d := range domains {
		targets[i] = newTarget(d, "k", "a", limitSpec{alg: "fixed_window", n: limit, period: time.Hour}, true)
	}
	srv.Freeze()
	frozen := time.Now()
	l := startLoad(t, procs, 48, targets, func(c, i int) int { return (c + i) % len(targets) }, time.Now())
	defer l.finish()
	poll(t, "sluice_redis_up 0 on every process", func() bool { return allMetric(procs, "sluice_redis_up", "0") })
	time.Sleep(time.Until(frozen.Add(freeze)))
	srv.Thaw()
	thawed := time.Now()
	// Each process closes its breaker at its first probe that succeeds,
	// at most 5s apart; under -race, on a loaded machine, a probe may
	// miss its deadline and the next come 5s later.
	recovery := 12 * time.Second
	if raceEnabled() {
		recovery = 20 * time.Second
	}
	for i := 0; !allMetric(procs, "sluice_redis_up", "1"); i++ {
		if time.Since(thawed) > recovery {
			t.Fatalf("sluice_redis_up not 1 on every process %s after Redis was back", recovery)
		}
		time.Sleep(pollPause(i))
	}
	up := time.Now()
	// Long enough for every process to learn it is one of three again,
	// and for their write-backs.
	time.Sleep(4 * time.Second)
	samples := l.finish()

	for ti, d := range domains {
		var during, after int
		for _, s := range samples {
			switch {
			case s.target != ti || !s.ok():
			case s.send < thawed.UnixNano():
				during++
			default:
				after++
			}
		}
		t.Logf("%s: %d used before Redis froze; %d admitted while it was frozen (%d nodes, %d each at most); %d admitted after it was back (at most %d); every process up %s after the thaw",
			d, used, during, nodes, limit/nodes, after, limit-used, up.Sub(thawed).Round(time.Millisecond))
		if during > limit+beyond[ti] {
			t.Errorf("%s: %d admitted during the outage, more than the %d of the local policy's bound", d, during, limit+beyond[ti])
		}
		if after > limit-used {
			t.Errorf("%s: %d admitted after Redis came back, where %d remained: quota spent handed out again", d, after, limit-used)
		}
	}
	for i, p := range procs {
		if !strings.Contains(p.log(), "wrote back to the store what it admitted") {
			t.Errorf("process %d did not write back what its local policy admitted:\n%s", i, tail(p.log(), 20))
		}
	}
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n") + fmt.Sprintf("\n(%d lines)", len(lines))
}
