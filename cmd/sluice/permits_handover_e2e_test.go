package main

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestProxyE2EPermitsHandOver: two proxies on one Redis, failure_policy
// local, N = 4. Redis is killed; requests are held through each proxy up
// to its share of the slots (floor(4/2)). Redis is restarted empty and
// newcomers press on both proxies while the policy's holders stay in
// flight: each proxy hands its holders' permits to Redis before Redis
// decides their key for it, so Redis counts them and admits newcomers only
// to slots no holder has; and a proxy back first leaves the other's share
// to it until it can have handed over. Before the hand-over Redis
// admitted N newcomers beside the policy's N holders (2N in flight);
// with hand-overs alone, up to N plus the share of the proxy that reached
// Redis last; now at most N (docs/internals/concurrency.md). The
// handed-over permits are renewed in Redis past their TTL, and released
// there.
func TestProxyE2EPermitsHandOver(t *testing.T) {
	beside(t)
	const capacity, ttl = 4, 3 * time.Second
	s := startHeld(t, capacity, ttl.String())
	srv, g, a, b, urls, hs := s.srv, s.g, s.a, s.b, s.urls, s.hs
	writeRules(t, s.file, strings.Replace(heldRulesWith(capacity, ttl.String()), "failure_policy: fail_closed", "failure_policy: local", 1))
	waitReloads(t, 2, a, b)
	for _, p := range []*proc{a, b} {
		poll(t, "each proxy counts 2 nodes", func() bool {
			return strings.Contains(p.log(), `"msg":"redis: nodes sharing the limits","component":"redis","nodes":2`)
		})
	}

	srv.Kill()
	shares := make([]int, 2)
	for i, u := range urls {
		for shares[i] < capacity {
			if _, held, _ := hs.try(u, "local"); !held {
				break
			}
			shares[i]++
		}
	}
	local := shares[0] + shares[1]
	if local > capacity || shares[0] == 0 || shares[1] == 0 {
		t.Fatalf("the local policy's shares with Redis down: %v, want at most %d together and some on each", shares, capacity)
	}
	srv.Restart()
	g.mark()
	stopFlood := hs.flood(urls, 2*capacity, "new")
	// Both proxies reach Redis (a breaker's cooldown is at most 5 s) and
	// hand over; then the policy's holders, still in flight, are renewed
	// in Redis past their TTL, and no newcomer gets a slot they hold.
	wrote := regexp.MustCompile(`"msg":"local failure policy: wrote back to the store what it admitted".*"permits":[1-9]`)
	handed := func() bool {
		return wrote.MatchString(a.log()) && wrote.MatchString(b.log())
	}
	for deadline := time.Now().Add(e2eWait); !handed() && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	window := g.mark()
	if !handed() {
		t.Errorf("no log line of each proxy's hand-over within %s", e2eWait)
	}
	newcomers := g.count("new")
	time.Sleep(2 * ttl)
	after := g.mark()
	stopFlood()
	t.Logf("shares %v with Redis down; Redis restarted empty, %d newcomers pressing: at most %d in flight (%d newcomers) until both proxies handed over (bound N = %d; 2N before hand-overs), then at most %d for 2 TTLs",
		shares, 2*capacity, window, newcomers, capacity, after)
	if n := g.count("local"); n != local {
		t.Errorf("%d of the policy's %d holders in flight after the hand-over, want all (%v)", n, local, hs.answers("local"))
	}
	if window > capacity {
		t.Errorf("%d in flight after Redis returned, beyond N: a slot handed out twice", window)
	}
	if after > window || g.count("new") != newcomers {
		t.Errorf("after the hand-overs, %d in flight (%d before) and %d newcomers (%d before): a slot handed out twice", after, window, g.count("new"), newcomers)
	}
	// Released in Redis: the slots return.
	g.letAll()
	hs.wg.Wait()
	hs.hold(urls[0], "last")
	g.letAll()
}
