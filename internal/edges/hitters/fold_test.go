package hitters

import (
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/zeebo/xxh3"
)

// TestFoldInvariant checks (M) of fold.go after every fold of streams made
// to evict often (8 counters, a few hundred keys, skewed and even, slices
// of a few hundred to a few thousand hits): every key's true count over
// the slices folded is within [g, g + delta] (g = 0 for a key not held),
// delta ≤ (N − G)/m, and so every key with more than N/m hits is held.
func TestFoldInvariant(t *testing.T) {
	const m = 8
	for seed := range uint64(6) {
		rng := rand.New(rand.NewPCG(seed, 7))
		keys := 40 + int(seed)*90
		zipf := rand.NewZipf(rng, 1.02+float64(seed)/8, 1, uint64(keys-1))
		hash := func(k int) uint64 { return xxh3.HashString("k" + strconv.Itoa(k)) }
		p, s := newMerged(m), newSummary(m)
		var sc foldScratch
		truth := make([]uint64, keys)
		var n uint64
		dropped := 0 // folds that subtracted a T > 0
		for fold := range 40 {
			hits := 100 + rng.IntN(3000)
			for i := range hits {
				// The heavy keys move from slice to slice, so that
				// folds drop keys; some slices are even.
				k := (int(zipf.Uint64()) + fold*7) % keys
				if i%3 == 0 || fold%5 == 4 {
					k = rng.IntN(keys)
				}
				truth[k]++
				s.hit(hash(k), name("k"+strconv.Itoa(k)))
			}
			n += uint64(hits)
			before := p.delta + s.floor
			p.fold(s, &sc)
			if p.delta > before {
				dropped++
			}
			s.reset()
			if p.total != n {
				t.Fatalf("seed %d, fold %d: %d hits folded, want %d", seed, fold, p.total, n)
			}
			var g uint64
			for i := range p.cnt {
				g += p.cnt[i].count
			}
			if p.delta*m > n-g {
				t.Fatalf("seed %d, fold %d: delta %d over (N − G)/m = (%d − %d)/%d", seed, fold, p.delta, n, g, m)
			}
			for k := range keys {
				low, high := uint64(0), p.delta
				if i := p.find(hash(k)); i >= 0 {
					low, high = p.interval(int(i))
					if got := string(p.keys[i][:p.cnt[i].klen]); got != "k"+strconv.Itoa(k) {
						t.Fatalf("seed %d, fold %d: key %d held as %q", seed, fold, k, got)
					}
				}
				if truth[k] < low || truth[k] > high {
					t.Fatalf("seed %d, fold %d: key %d: true %d outside [%d, %d] (delta %d)", seed, fold, k, truth[k], low, high, p.delta)
				}
			}
		}
		if dropped == 0 {
			t.Fatalf("seed %d: no fold dropped a key: the streams test nothing", seed)
		}
	}
}
