// Package fairshare splits a capacity among demands, max-min fairly: the
// yardstick the simulators (cmd/rlqssim, cmd/regionsim) measure their
// allocators against.
package fairshare

import (
	"cmp"
	"math"
	"slices"
)

// MaxMin returns the max-min fair split of capacity among demands: the
// smallest demands are met in full, and what is left is shared evenly by
// the rest.
func MaxMin(demands []float64, capacity float64) []float64 {
	idx := make([]int, len(demands))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(demands[a], demands[b]) })
	out := make([]float64, len(demands))
	left := capacity
	for k, i := range idx {
		give := math.Min(demands[i], left/float64(len(idx)-k))
		out[i] = give
		left -= give
	}
	return out
}
