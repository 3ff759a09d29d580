package loadgen

import (
	"math"
	"math/bits"
	"time"
)

// histogram counts latencies in nanoseconds in log-linear buckets, as
// HdrHistogram does: values below 2^subBits exactly, then each power of two
// split into 2^(subBits-1) equal buckets, so a recorded value is known within
// 1/2^(subBits-1) (0.8%) of itself. Values above maxValue are counted as
// maxValue. The zero value is not ready: use newHistogram.
type histogram struct {
	counts []uint64
	n      uint64
	sum    float64
	min    int64
	max    int64
}

const (
	subBits  = 8
	subCount = 1 << subBits
	maxValue = 1<<38 - 1 // about 275 s in nanoseconds
)

// bucketOf returns the bucket of v >= 0.
func bucketOf(v int64) int {
	u := uint64(v)
	if u < subCount {
		return int(u)
	}
	shift := bits.Len64(u) - subBits
	return shift*(subCount/2) + int(u>>shift)
}

// bucketBounds returns the smallest and the largest value of bucket i.
func bucketBounds(i int) (lo, hi int64) {
	if i < subCount {
		return int64(i), int64(i)
	}
	shift := i/(subCount/2) - 1
	top := int64(i - shift*(subCount/2))
	lo = top << shift
	return lo, lo + 1<<shift - 1
}

func newHistogram() *histogram {
	return &histogram{counts: make([]uint64, bucketOf(maxValue)+1), min: math.MaxInt64}
}

// record counts one latency.
func (h *histogram) record(d time.Duration) {
	v := min(max(int64(d), 0), maxValue)
	h.counts[bucketOf(v)]++
	h.n++
	h.sum += float64(v)
	h.min = min(h.min, v)
	h.max = max(h.max, v)
}

// merge adds the counts of o to h.
func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.min = min(h.min, o.min)
	h.max = max(h.max, o.max)
}

// quantile returns the value at or below which a share q (0..1) of the
// recorded values lie: the largest value of the bucket that holds the
// ceil(q·n)-th smallest value, capped by the largest value recorded. It is
// zero when nothing was recorded.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			_, hi := bucketBounds(i)
			return time.Duration(min(max(hi, h.min), h.max))
		}
	}
	return time.Duration(h.max)
}

// mean returns the mean of the recorded values.
func (h *histogram) mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}
