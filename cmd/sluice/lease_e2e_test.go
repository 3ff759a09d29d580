package main

import (
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestServeE2ELease: two sluice serve nodes on one real redis-server
// decide a limit with consistency: lease (10,000 an hour, max_overshoot
// 10%: 1,000 hits) under 16 concurrent clients asking far more. The hour admits
// at most its limit and at least its limit less the bound; leases carry
// most of the admitted hits, and Redis sees under a tenth of the
// decisions.
func TestServeE2ELease(t *testing.T) {
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
