package hitters

import "slices"

// A merged summary is one of the hour's parts: the 10 s summaries of its
// 5 minutes folded in one by one as each ends (fold), so that a hit
// updates one summary, not two. It is kept in the form of Misra and
// Gries's summary, whose merge keeps its bound (Agarwal et al.,
// "Mergeable summaries", 2012): each counter's count g is a lower bound
// of its key's hits, and one number for the whole summary, delta, bounds
// what any key's hits exceed its g by (a key not held has g = 0). With
// N the hits folded in and G the sum of the counts, the invariant is
//
//	(M) g ≤ true ≤ g + delta for every key, and delta ≤ (N − G)/m,
//
// so a key's true count is within [g, g + delta], delta ≤ N/m, and a key
// with more than N/m hits is held: the bound of a fed summary.
//
// A fed summary S (m counters, n hits, its smallest count min, or 0 while
// it is not full) is of that form with g = count − min and delta = min:
// count − err ≥ count − min is at most the truth, count ≥ the truth, a
// key not held had at most its cell ≤ min, and its counts add up to at
// most n, so m·min ≤ n − G.
//
// fold adds up the two summaries' g for each key (at most 2m keys),
// subtracts the (m+1)-th largest sum, T, from every key, and keeps those
// left above 0 (at most m); delta becomes deltaP + deltaS + T. (M) holds
// after: a key kept lost T of its lower bound and its upper bound grew
// by the same; a key dropped had a sum of at most T, so at most
// deltaP + deltaS + T hits; and G fell by at least (m+1)·T, since the m+1
// largest sums lost T each, so (N − G)/m grew by at least
// deltaP's and deltaS's shares plus T.

// initMerged makes s an empty merged summary of m counters: without the
// filter and the heap, which only a fed summary needs.
func (s *summary) initMerged(m int) {
	n := pow2(2 * m)
	*s = summary{
		cnt:    make([]counter, 0, m),
		keys:   make([]keyText, m),
		slots:  make([]uint64, n),
		merged: true,
	}
}

// foldScratch is what folding needs, kept to allocate nothing.
type foldScratch struct {
	add  []uint64 // what S adds to each of P's counters
	news []int32  // S's counters whose keys P does not hold
	sums []uint64 // every key's sum, sorted
}

// fold merges s, a fed summary whose slice has ended, into p, a merged
// summary (see above).
func (p *summary) fold(s *summary, sc *foldScratch) {
	m := cap(p.cnt)
	ds := s.floor
	sc.add = slices.Grow(sc.add[:0], m)[:len(p.cnt)]
	clear(sc.add)
	sc.news = sc.news[:0]
	for j := range s.cnt {
		c := &s.cnt[j]
		g := c.count - ds
		if g == 0 {
			continue // as good as not held
		}
		if i := p.find(c.hash); i >= 0 {
			sc.add[i] += g
		} else {
			sc.news = append(sc.news, int32(j))
		}
	}
	sc.sums = sc.sums[:0]
	for i := range p.cnt {
		sc.sums = append(sc.sums, p.cnt[i].count+sc.add[i])
	}
	for _, j := range sc.news {
		sc.sums = append(sc.sums, s.cnt[j].count-ds)
	}
	var t uint64 // the (m+1)-th largest sum
	if len(sc.sums) > m {
		slices.Sort(sc.sums)
		t = sc.sums[len(sc.sums)-1-m]
	}
	p.total += s.total
	p.delta += ds + t
	// Keep P's keys left above 0 in place, then give S's newcomers left
	// above 0 the free counters; then index them all again.
	kept := 0
	for i := range p.cnt {
		if g := p.cnt[i].count + sc.add[i]; g > t {
			if kept != i {
				p.cnt[kept] = p.cnt[i]
				p.keys[kept] = p.keys[i]
			}
			p.cnt[kept].count = g - t
			kept++
		}
	}
	p.cnt = p.cnt[:m]
	for _, j := range sc.news {
		c := &s.cnt[j]
		if g := c.count - ds; g > t {
			p.cnt[kept] = counter{hash: c.hash, count: g - t, klen: c.klen}
			p.keys[kept] = s.keys[j]
			kept++
		}
	}
	p.cnt = p.cnt[:kept]
	clear(p.slots)
	for i := range p.cnt {
		p.link(int32(i))
	}
}
