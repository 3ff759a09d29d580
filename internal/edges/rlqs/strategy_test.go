package rlqs

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/base/algo"

	"github.com/sluicehq/sluice"
)

// TestBucketsWithinLimit: the token buckets of shares that sum to at most
// 1 add at most the limit's rate and hold at most its burst plus one token
// per share, for limits from 10 an hour to a million a second.
func TestBucketsWithinLimit(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	limits := []*sluice.Limit{
		{Rate: 10, Period: time.Hour},
		{Rate: 600, Period: time.Minute},
		{Rate: 1000, Period: time.Second},
		{Rate: 1_000_000, Period: time.Second},
		{Algorithm: sluice.TokenBucket, Rate: 200, Period: time.Second, Burst: 50},
		{Algorithm: sluice.GCRA, Rate: 7, Period: 3 * time.Second, Burst: 1},
	}
	for _, l := range limits {
		f := fillInterval(l)
		if f < time.Second || f%time.Second != 0 || (f > l.Period && f > time.Second) {
			t.Errorf("%+v: fill interval %v, want whole seconds, at most the period", l, f)
		}
		for range 2000 {
			n := 1 + rng.IntN(12)
			shares := make([]float64, n)
			sum := 0.0
			for i := range shares {
				shares[i] = rng.Float64()
				sum += shares[i]
			}
			scale := rng.Float64() // sum to at most 1
			for i := range shares {
				shares[i] *= scale / sum
			}
			var rate float64
			var size uint64
			for _, s := range shares {
				if b, ok := bucketOf(l, s); ok {
					rate += b.rate()
					size += uint64(b.max)
				}
			}
			if limitRate := float64(l.Rate) / l.Period.Seconds(); rate > limitRate*(1+1e-12) {
				t.Fatalf("%+v, shares %v: buckets add %v a second, over the limit's %v", l, shares, rate, limitRate)
			}
			if size > uint64(algo.Nominal(algo.Kind(l.Algorithm), l.Rate, l.Burst))+uint64(n) {
				t.Fatalf("%+v, shares %v: buckets hold %d, over the burst %d plus %d", l, shares, size, algo.Nominal(algo.Kind(l.Algorithm), l.Rate, l.Burst), n)
			}
		}
	}
}
