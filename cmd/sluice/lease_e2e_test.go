package main

import (
	"cmp"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
	"github.com/sluicehq/sluice/internal/testsupport/stall"
)

// TestServeE2ELease: two sluice serve nodes on one real redis-server
// decide a limit with consistency: lease (10,000 an hour, max_overshoot
// 10%: 1,000 hits) under 16 concurrent clients asking far more. The hour admits
// at most its limit and at least its limit less the bound; leases carry
// most of the admitted hits, and Redis sees under a tenth of the
// decisions.
func TestServeE2ELease(t *testing.T) {
	beside(t)
	srv := redistest.Standalone(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, `domain: lease
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 10000, consistency: lease, max_overshoot: 10%}
`)
	args := []string{"--config", rules, "--store", "redis", "--redis-url", srv.URL(), "--redis-prefix", t.Name() + ":"}
	nodes := []*proc{startSluice(t, nil, args...), startSluice(t, nil, args...)}
	const limit, bound = 10000, 1000
	var admitted, decisions atomic.Int64
	var wg sync.WaitGroup
	for c := range 16 {
		wg.Go(func() {
			p := nodes[c%2]
			for denied := 0; denied < 100; {
				r, err := p.rl("lease", desc("k", "v"))
				if err != nil {
					t.Error(err)
					return
				}
				decisions.Add(1)
				if r.GetOverallCode() == rlsv3.RateLimitResponse_OK {
					admitted.Add(1)
				} else {
					denied++
				}
			}
		})
	}
	wg.Wait()
	n := admitted.Load()
	if n > limit || n < limit-bound {
		t.Errorf("%d admitted in the hour by two nodes, want between %d and %d", n, limit-bound, limit)
	}
	var local, calls int64
	for _, p := range nodes {
		local += metricInt(p, "sluice_lease_local_hits_total")
		calls += metricInt(p, `sluice_redis_calls_total{result="ok"}`)
		t.Logf("node: %d local, %d grant calls (%d refused), %d granted, %d expired, %d decided by Redis", metricInt(p, "sluice_lease_local_hits_total"),
			metricInt(p, "sluice_lease_grant_calls_total"), metricInt(p, "sluice_lease_grant_refused_total"), metricInt(p, "sluice_lease_granted_hits_total"),
			metricInt(p, "sluice_lease_expired_hits_total"), metricInt(p, "sluice_lease_store_hits_total"))
	}
	t.Logf("%d admitted of %d decisions; %d from leases; %d Redis calls (%.3f a decision)", n, decisions.Load(), local, calls, float64(calls)/float64(decisions.Load()))
	// A window's grants go as fast as demand asks (no ledger): leases
	// carry nearly all admitted hits, and the local cache answers most
	// denials, so Redis sees a small fraction of the decisions.
	if local < n*8/10 {
		t.Errorf("%d of %d admitted hits came from leases, want 80%% or more", local, n)
	}
	if calls*10 > decisions.Load() {
		t.Errorf("%d Redis calls for %d decisions: more than 0.1 a decision", calls, decisions.Load())
	}
}

// TestServeE2ELeaseOutage stops Redis (SIGSTOP: connections stay open,
// nothing is answered) under 64 concurrent clients of two sluice serve
// processes, each deciding a limit with consistency: lease (a fixed window
// of a second) of a domain of its own: one failing closed, whose limit the
// clients never reach, so that its lease is renewed all the time, and one
// failing open, whose limit they reach in every window.
//
// Every request is answered within about twice --redis-timeout, as on a
// limit that does not lease: a hit waits for one call to a silent Redis
// at most (its grant, or the grant or renewal it found in flight), never
// for that and then a call of its own. While Redis is stopped the leases
// serve what they hold (at most ⌈U/4⌉ hits a process, within the window
// they were granted in) and the failure policy answers the rest. Once
// Redis is back, it grants the leases again, and no window admits more
// than the limit.
func TestServeE2ELeaseOutage(t *testing.T) {
	// Not beside the tests that wait: with their load, its clients do not reach the limit in every window (seen).
	sluiceBinary(t)
	const (
		// redisTimeout is --redis-timeout (T): Redis is found silent
		// within about 2T of a call, and a lease decision must wait
		// no longer. A hit that waits for another call after that
		// one waits T more (the deadline of connecting again), and
		// several T until five failed calls open the breaker.
		redisTimeout = time.Second
		// answerSlack, on top of 2T: the time the client, gRPC and
		// the process take to pass a request and its answer, and
		// how late a connection's PING timer fires, on a machine
		// whose cores a CPU hog keeps busy, under -race: each is a
		// few waits for a core, milliseconds to tens of
		// milliseconds each. A second covers them many times over
		// and stays below the T that a second call would add.
		answerSlack = time.Second
		window      = time.Second
		procs       = 2
		outage      = 5 * time.Second
	)
	domains := []struct {
		name, policy string
		limit, u     int64 // a window, over both processes; max_overshoot
		full         bool  // the clients reach the limit
	}{
		{"closed", "fail_closed", 100_000, 1000, false},
		{"open", "fail_open", 200, 20, true},
	}
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	var names, policies []string
	for _, d := range domains {
		writeRules(t, filepath.Join(dir, d.name+".yaml"), fmt.Sprintf(`domain: %s
failure_policy: %s
descriptors:
  - key: k
    rate_limit: {algorithm: fixed_window, period: %s, requests_per_unit: %d, consistency: lease, max_overshoot: %d}
`, d.name, d.policy, window, d.limit, d.u))
		names, policies = append(names, d.name), append(policies, d.policy)
	}
	nodes := startSluices(t, procs, "--config", dir, "--debug-addr", "", "--store", "redis", "--redis-url", srv.URL(),
		"--redis-timeout", redisTimeout.String())
	stalls := stall.Watch(t)
	// Process j decides domains[j] alone (the clients of process j
	// ask for it): one key that leases, as a hot key would. (The
	// checks below read the limits from domains.)
	l, start := loadDomains(t, nodes, names, limitSpec{}, func(c, _ int) int { return c / clientsPerConn % procs })
	defer l.finish()
	leaseMetric := func(p *proc, name string) int64 { return metricInt(p, "sluice_lease_"+name) }

	time.Sleep(time.Until(start.Add(1500 * time.Millisecond)))
	poll(t, "leases granted on every process before the outage", func() bool {
		for _, p := range nodes {
			if leaseMetric(p, "granted_hits_total") == 0 || p.metric("sluice_redis_up") != "1" {
				return false
			}
		}
		return true
	})
	failedBefore := policyAnswers(nodes, names, policies)
	srv.Freeze()
	dead := time.Now() // Redis decides nothing after this
	time.Sleep(outage)
	thawing := time.Now() // nor before this
	srv.Thaw()
	poll(t, "sluice_redis_up 1 on every process after the outage", func() bool { return allMetric(nodes, "sluice_redis_up", "1") })
	up := time.Now()
	atUp := policyAnswers(nodes, names, policies)
	granted := make([]int64, procs)
	local := make([]int64, procs)
	for i, p := range nodes {
		granted[i], local[i] = leaseMetric(p, "granted_hits_total"), leaseMetric(p, "local_hits_total")
	}
	P := window.Nanoseconds()
	from := (up.UnixNano()/P + 1) * P // the first whole window after the recovery
	time.Sleep(time.Until(time.Unix(0, from+3*P+100*int64(time.Millisecond))))
	samples := l.finish()
	failedAfter := policyAnswers(nodes, names, policies)
	for di := range domains {
		failedAfter[di] -= atUp[di]
	}

	// Every request answered, within the bound; the waits while Redis
	// was stopped.
	// and the longest the machine stalled this process (a loaded
	// machine holds back the client, the nodes and Redis alike).
	bound := 2*redisTimeout + answerSlack + stalls.Max()
	p50, p99, most := latencies(t, samples, bound)
	t.Logf("%d requests; latency p50 %s, p99 %s, max %s (bound %s)", len(samples), p50, p99, most, bound)
	during := between(t, samples, dead, thawing)
	p50, p99, most = latencies(t, during, bound)
	over := 0
	for _, s := range during {
		if time.Duration(s.recv-s.send) > 2*redisTimeout {
			over++
		}
	}
	t.Logf("Redis stopped at %s for %s, up on every process %s after: %d requests meanwhile, latency p50 %s, p99 %s, max %s; %d over 2×--redis-timeout",
		at(dead.UnixNano()), outage, up.Sub(thawing).Round(time.Millisecond), len(during), p50, p99, most, over)

	// While Redis was stopped: the leases serve what they held, within
	// the window they were granted in; the failure policy the rest.
	deadEnd := (dead.UnixNano()/P + 1) * P // the end of the window Redis stopped in
	for di, d := range domains {
		held := (d.u + 3) / 4
		// Not the policy's answer: an OK on fail_closed, a lease's; a
		// denial on fail_open, the local cache's (its key full).
		notPolicy, wrong := int64(0), 0
		for _, s := range during {
			if s.target != di || s.ok() == (d.policy == "fail_open") {
				continue
			}
			notPolicy++
			if s.send >= deadEnd+int64(timingSlack) {
				if wrong++; wrong <= 3 {
					t.Errorf("%s: %s sent at %s, after the window Redis stopped in ended: not the failure policy's answer", d.name, s.code, at(s.send))
				}
			}
		}
		if d.policy == "fail_closed" && notPolicy > held {
			t.Errorf("%s: %d admitted while Redis was stopped; the lease held at most %d", d.name, notPolicy, held)
		}
		n := nodes[di].metricSum("sluice_failure_policy_total", `domain="`+d.name+`"`, `policy="`+d.policy+`"`)
		t.Logf("%s while Redis was stopped: %d answers not %s's (from the lease or the local cache); %v by the policy", d.name, notPolicy, d.policy, n)
		if n == 0 {
			t.Errorf("%s: no request answered by %s", d.name, d.policy)
		}
	}

	// Redis grants the leases again.
	for i, p := range nodes {
		g, lh := leaseMetric(p, "granted_hits_total")-granted[i], leaseMetric(p, "local_hits_total")-local[i]
		t.Logf("process %d after the outage: %d hits granted, %d admitted from leases; in all %d grant calls, %d refused",
			i, g, lh, leaseMetric(p, "grant_calls_total"), leaseMetric(p, "grant_refused_total"))
		if g == 0 || lh == 0 {
			t.Errorf("process %d after the outage: %d hits granted, %d admitted from leases; want both", i, g, lh)
		}
	}

	// A full key: no window admits more than the limit, before the
	// outage and after it, give or take what the failure policy answered
	// meanwhile (fail_open admits); a window that denied admitted at least
	// the limit less what the lease holds unspent.
	last := slices.MaxFunc(samples, func(a, b sample) int { return cmp.Compare(a.send, b.send) }).send
	to := last / P * P
	if to-from < 2*P {
		t.Errorf("only %d whole windows after the recovery", (to-from)/P)
	}
	for di, d := range domains {
		if !d.full {
			continue
		}
		held := (d.u + 3) / 4
		saturated := 0
		check := func(when string, lo, hi int64, failed int64) {
			var spans []span
			for _, s := range samples {
				if sp := s.span(); s.target == di && s.ok() && sp.lo >= lo && sp.hi < hi {
					spans = append(spans, sp)
				}
			}
			if n, k := overflow(spans, P, d.limit); n > failed {
				t.Errorf("%s, %s: %d admitted beyond %d a window, the first by %s; the failure policy answered %d", d.name, when, n, d.limit, at((k+1)*P), failed)
			}
			for k := lo / P; k < hi/P; k++ {
				got, denied := int64(0), false
				for _, s := range samples {
					sp := s.span()
					if s.target == di && sp.lo/P <= k && k <= sp.hi/P {
						if s.ok() {
							got++
						}
						denied = denied || s.err == nil && !s.ok() && sp.lo/P == k && sp.hi/P == k
					}
				}
				if !denied {
					continue
				}
				saturated++
				if got+failed < d.limit-held {
					t.Errorf("%s, %s, window at %s: %d admitted, and a denial; want at least %d", d.name, when, at(k*P), got, d.limit-held)
				}
			}
		}
		check("before the outage", start.UnixNano()/P*P, dead.UnixNano()/P*P, failedBefore[di])
		check("after the outage", from, to, failedAfter[di])
		t.Logf("%s: %d whole windows before or after the outage denied (the key full)", d.name, saturated)
		if saturated == 0 {
			t.Errorf("%s: no window denied: the bound was not tested", d.name)
		}
	}
}
