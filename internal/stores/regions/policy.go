package regions

import (
	"math"
)

// shares returns every region's safe share of l, in hits.
func (s *Store) shares(l int64) []int64 {
	out := make([]int64, len(s.cfg.Shares))
	for i, f := range s.cfg.Shares {
		out[i] = int64(math.Floor(f * float64(l)))
	}
	return out
}
