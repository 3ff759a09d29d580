package rlsclient_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/internal/rls"
	"github.com/sluicehq/sluice/internal/rlsclient"
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
// made by an rls.Decider in process, for scale.
func BenchmarkClient(b *testing.B) {
	r := startRemote(b, benchRules)
	reqs := func(keys int) []*rlsv3.RateLimitRequest {
		rs := make([]*rlsv3.RateLimitRequest, keys)
		for i := range rs {
			rs[i] = &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{d("user=u" + strconv.Itoa(i))}}
		}
		return rs
	}
	run := func(b *testing.B, dec any, rs []*rlsv3.RateLimitRequest, wantDegraded bool) {
		decideInto := rlsDecide(dec)
		var next atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			var o rls.Outcome
			for pb.Next() {
				rq := rs[int(next.Add(1))%len(rs)]
				if err := decideInto(ctx, rq, &o); err != nil {
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
	c := newClient(b, rlsclient.Config{Target: r.addr})
	for _, keys := range []int{1, 10000} {
		b.Run("remote/keys="+strconv.Itoa(keys), func(b *testing.B) {
			run(b, c, reqs(keys), false)
		})
	}
	b.Run("local/keys=1", func(b *testing.B) {
		run(b, r.local(), reqs(1), false)
	})
	b.Run("remote_down/keys=1", func(b *testing.B) {
		down := newClient(b, rlsclient.Config{Target: serveRLS(b, &hangingService{calls: make(chan struct{}, 1)}), BreakerCooldown: 1 << 40})
		rs := reqs(1)
		var o rls.Outcome
		for range 5 { // open the breaker, for good
			down.DecideRLS(context.Background(), rs[0], &o)
		}
		run(b, down, rs, true)
	})
}
