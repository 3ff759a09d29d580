package server

import (
	"fmt"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/hitters"
	"github.com/sluicehq/sluice/internal/rls"
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
		recordHitters(top, reqs[i%len(reqs)], o, false)
		i++
	}
}

// TestHittersGlobalShadow: in global shadow mode a denial is let through,
// so the top keys count it shadow-denied, not denied; without it, denied.
func TestHittersGlobalShadow(t *testing.T) {
	for _, shadow := range []bool{false, true} {
		top := hitters.New(hitters.Config{})
		defer top.Close()
		r := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "mallory"}},
		}}}
		o := &rls.Outcome{}
		o.Descriptors = []decide.DescriptorOutcome{{Limited: true, Over: true, Cost: 1, StatKey: "bench.user"}}
		recordHitters(top, r, o, shadow)
		var got [3]int64
		for _, p := range top.Series("bench.user") {
			got[0], got[1], got[2] = got[0]+p.Allowed, got[1]+p.Denied, got[2]+p.Shadow
		}
		want := [3]int64{0, 1, 0}
		if shadow {
			want = [3]int64{0, 0, 1}
		}
		if got != want {
			t.Errorf("global shadow %v: allowed, denied, shadow-denied %v, want %v", shadow, got, want)
		}
	}
}
