package rlsclient_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/edges/rls"
	"github.com/sluicehq/sluice/internal/edges/rlsclient"
)

const benchRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
`

// BenchmarkClient decides through a real sluice serve on loopback gRPC,
// with 1 and 10000 keys; remote_down is the failure policy's answer
// while the breaker is open (no call), and local is the same decision
// made by a Decider in process, for scale.
func BenchmarkClient(b *testing.B) {
	r := startRemote(b, benchRules)
	reqs := func(keys int) []*rlsv3.RateLimitRequest {
		rs := make([]*rlsv3.RateLimitRequest, keys)
		for i := range rs {
			rs[i] = &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{d("user=u" + strconv.Itoa(i))}}
		}
		return rs
	}
	run := func(b *testing.B, dec *decide.Decider, rs []*rlsv3.RateLimitRequest, wantDegraded bool) {
		var next atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			var r decide.Request
			var o decide.Outcome
			for pb.Next() {
				rq := rs[int(next.Add(1))%len(rs)]
				if err := rls.Request(rq, &r); err != nil {
					b.Error(err)
					return
				}
				if err := dec.Decide(ctx, &r, &o); err != nil {
					b.Error(err)
					return
				}
				if (o.Degraded != 0) != wantDegraded {
					b.Errorf("degraded %v", o.Degraded)
					return
				}
			}
		})
	}
	c := viaRemote(b, newClient(b, rlsclient.Config{Target: r.addr}), nil, decide.Failover{})
	for _, keys := range []int{1, 10000} {
		b.Run("remote/keys="+strconv.Itoa(keys), func(b *testing.B) {
			run(b, c, reqs(keys), false)
		})
	}
	b.Run("local/keys=1", func(b *testing.B) {
		run(b, r.local(), reqs(1), false)
	})
	b.Run("remote_down/keys=1", func(b *testing.B) {
		down := viaRemote(b, newClient(b, rlsclient.Config{Target: serveRLS(b, &hangingService{calls: make(chan struct{}, 1)}), BreakerCooldown: 1 << 40}), nil, decide.Failover{})
		rs := reqs(1)
		for range 5 { // open the breaker, for good
			ask(b, down, rs[0])
		}
		run(b, down, rs, true)
	})
}
