package fairshare

import (
	"slices"
	"testing"
)

func TestMaxMin(t *testing.T) {
	for _, tc := range []struct {
		demands  []float64
		capacity float64
		want     []float64
	}{
		{[]float64{600, 300, 150, 50}, 1000, []float64{500, 300, 150, 50}},
		{[]float64{100, 100}, 1000, []float64{100, 100}},
		{[]float64{900, 50, 50}, 300, []float64{200, 50, 50}},
		{[]float64{10, 10, 10}, 9, []float64{3, 3, 3}},
		{nil, 5, []float64{}},
	} {
		if got := MaxMin(tc.demands, tc.capacity); !slices.Equal(got, tc.want) {
			t.Errorf("MaxMin(%v, %v) = %v, want %v", tc.demands, tc.capacity, got, tc.want)
		}
	}
}
