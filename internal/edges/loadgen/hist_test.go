package loadgen

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestBucketBounds(t *testing.T) {
	prevHi := int64(-1)
	for i := 0; i <= bucketOf(maxValue); i++ {
		lo, hi := bucketBounds(i)
		if lo != prevHi+1 {
			t.Fatalf("bucket %d starts at %d, previous ended at %d", i, lo, prevHi)
		}
		if bucketOf(lo) != i || bucketOf(hi) != i {
			t.Fatalf("bucket %d = [%d, %d], but bucketOf gives %d and %d", i, lo, hi, bucketOf(lo), bucketOf(hi))
		}
		if w := hi - lo + 1; w > 1 && float64(w) > float64(lo)/(subCount/2) {
			t.Fatalf("bucket %d = [%d, %d] is wider than 1/%d of its values", i, lo, hi, subCount/2)
		}
		prevHi = hi
	}
	if prevHi != maxValue {
		t.Fatalf("last bucket ends at %d, want %d", prevHi, maxValue)
	}
}

func TestHistogramQuantiles(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	h := newHistogram()
	var vals []time.Duration
	for range 100_000 {
		// log-uniform from 10µs to 100ms: every scale is exercised
		v := time.Duration(10_000 * math.Pow(10, 4*rng.Float64()))
		vals = append(vals, v)
		h.record(v)
	}
	slices.Sort(vals)
	for _, q := range []float64{0, 0.001, 0.5, 0.9, 0.99, 0.999, 1} {
		rank := min(max(int(math.Ceil(q*float64(len(vals)))), 1), len(vals))
		want := vals[rank-1]
		got := h.quantile(q)
		if got < want || float64(got-want) > float64(want)/(subCount/2) {
			t.Errorf("quantile(%v) = %v, exact %v: off by more than one bucket", q, got, want)
		}
	}
	if h.quantile(1) != vals[len(vals)-1] || time.Duration(h.min) != vals[0] {
		t.Errorf("max %v min %v, want %v %v", h.quantile(1), time.Duration(h.min), vals[len(vals)-1], vals[0])
	}

	// merging two halves gives the same histogram as recording all
	a, b := newHistogram(), newHistogram()
	for i, v := range vals {
		if i%2 == 0 {
			a.record(v)
		} else {
			b.record(v)
		}
	}
	a.merge(b)
	if !slices.Equal(a.counts, h.counts) || a.n != h.n || a.min != h.min || a.max != h.max {
		t.Error("merged halves differ from the whole")
	}
}

func TestHistogramEdges(t *testing.T) {
	h := newHistogram()
	if h.quantile(0.99) != 0 || h.mean() != 0 {
		t.Error("empty histogram: want zeros")
	}
	h.record(-5)
	h.record(time.Hour)
	if h.min != 0 || h.max != maxValue {
		t.Errorf("clamping: min %d max %d", h.min, h.max)
	}
	if h.quantile(0.5) != 0 || h.quantile(1) != maxValue {
		t.Errorf("quantiles of {0, max}: %v %v", h.quantile(0.5), h.quantile(1))
	}
}
