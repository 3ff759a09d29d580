package server

import (
	"fmt"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/hitters"
	"github.com/sluicehq/sluice/rls"
)

// BenchmarkRecordHitters is what top keys add to a decision, alone: the
// key hashed and recorded, for requests of one descriptor over 10,000
// keys taken in turn, allowed.
func BenchmarkRecordHitters(b *testing.B) {
	top := hitters.New(hitters.Config{})
	defer top.Close()
	reqs := make([]*rlsv3.RateLimitRequest, 10_000)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: fmt.Sprint(i)}},
		}}}
	}
	o := &rls.Outcome{}
	o.Descriptors = []decide.DescriptorOutcome{{Limited: true, StatKey: "bench.user"}}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		recordHitters(top, reqs[i%len(reqs)], o)
		i++
	}
}
