package lease

import (
	"context"

	"github.com/sluicehq/sluice"
)

// leasable reports whether hit h may be served from a lease: not a peek,
// nor a shadow limit (whose denials consume nothing) or one with block_for
// (whose denials start a block: a grant too large would), nor the
// algorithms that do not lease, nor a Concurrency limit's permit.
func leasable(h *sluice.Hit) bool {
	l := h.Limit
	return h.Cost > 0 && l.LeaseOvershoot >= 2 && !l.Shadow && l.BlockFor == 0 &&
		l.Algorithm != sluice.SlidingLog && l.Algorithm != sluice.Sketch && l.Algorithm != sluice.Concurrency
}

// Take decides hits together (the sluice.Store contract): the hits its
// leases cover are reserved, the others decided by the store; if the
// store denies, the reservations go back.
func (s *Store) Take(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	return s.take(ctx, hits, out, false)
}

// TakeEach decides hits one by one (sluice.Store's TakeEach): the hits its leases
// cover are admitted, the others decided by the store's TakeEach (or its
// Take, a hit at a time, without one).
func (s *Store) TakeEach(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	return s.take(ctx, hits, out, true)
}

// held is a reservation made from a lease for hit i.
type held struct {
	i int
	l *lease
	k lkey
	d sluice.Decision // the hit's decision, read under the shard's lock
}

// take is Take, or TakeEach when each is set: a request without a hit
// that a lease may serve goes to the store as it is; otherwise takeLeased.
func (s *Store) take(ctx context.Context, hits []sluice.Hit, out []sluice.Decision, each bool) error {
	for i := range hits {
		if leasable(&hits[i]) {
			return s.takeLeased(ctx, hits, out, each)
		}
	}
	// Not through takeLeased, whose frame (its reservations) is 1 KB of
	// the goroutine's stack under the store's call.
	return s.decide(ctx, hits, out, each)
}

// takeLeased is take for a request with hits that leases may serve: they
// are reserved from them (reserveAll), the others decided by the store
// (decideRest).
func (s *Store) takeLeased(ctx context.Context, hits []sluice.Hit, out []sluice.Decision, each bool) error {
	var stack [8]held
	res, answered, err := s.reserveAll(ctx, hits, out, each, stack[:0])
	if answered || err != nil {
		return err
	}
	if len(res) == 0 {
		return s.decide(ctx, hits, out, each)
	}
	for _, r := range res {
		out[r.i] = r.d
	}
	s.stats.Local.Add(int64(len(res)))
	if len(res) == len(hits) {
		return nil
	}
	return s.decideRest(ctx, hits, out, res, each)
}

// reserveAll reserves from their leases the hits that leases may serve,
// appending the reservations to res, and counts in Stats.Fallback the
// leasing hits left to the store. When the store is down (see down), it
// gives back what it reserved and returns the store's error. When the
// request is one hit (Take) that its key itself could not grant, the
// grant's answer is the store's: it is in out[0], and answered is true.
func (s *Store) reserveAll(ctx context.Context, hits []sluice.Hit, out []sluice.Decision, each bool, res []held) (_ []held, answered bool, _ error) {
	var fallback int64 // leasing hits the store decides
	for i := range hits {
		h := &hits[i]
		if !leasable(h) {
			continue
		}
		fallback++
		if sharesKey(hits, i) {
			continue
		}
		led := s.ledgerOf(h.Limit)
		if led == nil {
			continue
		}
		r, ok, denial, err := s.reserve(ctx, h, led)
		if err != nil {
			// The store is down (see down): the failure policy answers
			// the request, and what was reserved goes back.
			s.giveBack(res, hits, out)
			return nil, false, err
		}
		if ok {
			fallback--
			r.i = i
			res = append(res, r)
			continue
		}
		if denial != nil && len(hits) == 1 && !each {
			// A lone hit the key itself could not grant: the grant's
			// answer for it is the store's (nothing was consumed).
			s.stats.Fallback.Add(1)
			out[0] = *denial
			return nil, true, nil
		}
	}
	if fallback > 0 {
		s.stats.Fallback.Add(fallback)
	}
	return res, false, nil
}

// decideRest passes the hits that res does not hold to the store, in one
// call, in their order, and gives res back (release) if that fails or,
// all-or-nothing, if one of them is denied.
func (s *Store) decideRest(ctx context.Context, hits []sluice.Hit, out []sluice.Decision, res []held, each bool) error {
	rest := make([]sluice.Hit, 0, len(hits)-len(res))
	idx := make([]int, 0, len(hits)-len(res))
	for i := range hits {
		if !reserved(res, i) {
			rest = append(rest, hits[i])
			idx = append(idx, i)
		}
	}
	restOut := make([]sluice.Decision, len(rest))
	err := s.decide(ctx, rest, restOut, each)
	if err == nil {
		for j, i := range idx {
			out[i] = restOut[j]
		}
	}
	if each {
		if err != nil {
			s.release(res, hits, out)
		}
		return err
	}
	denied := err != nil
	for j := range rest {
		if !restOut[j].Allowed && !rest[j].Limit.Shadow {
			denied = true
		}
	}
	if denied {
		// All or nothing: the leased hits are not consumed either.
		s.release(res, hits, out)
	}
	return err
}

// decide passes hits to the store, one by one or all together.
func (s *Store) decide(ctx context.Context, hits []sluice.Hit, out []sluice.Decision, each bool) error {
	if !each {
		return s.Next.Take(ctx, hits, out)
	}
	if s.Each != nil {
		return s.Each.TakeEach(ctx, hits, out)
	}
	for i := range hits {
		if err := s.Next.Take(ctx, hits[i:i+1], out[i:i+1]); err != nil {
			return err
		}
	}
	return nil
}

// release gives reservations back to their leases, counted as admitted
// from them. Each hit's decision in out becomes the lease's as it stands.
func (s *Store) release(res []held, hits []sluice.Hit, out []sluice.Decision) {
	s.giveBack(res, hits, out)
	s.stats.Local.Add(-int64(len(res)))
}

// giveBack gives reservations back to their leases, not yet counted.
// Each hit's decision in out becomes the lease's as it stands.
func (s *Store) giveBack(res []held, hits []sluice.Hit, out []sluice.Decision) {
	now := s.clock()
	for _, r := range res {
		sh := s.shardOf(r.k)
		sh.mu.Lock()
		r.l.units += hits[r.i].Cost
		r.l.spent -= hits[r.i].Cost
		out[r.i] = decisionOf(r.l, now)
		sh.mu.Unlock()
	}
}

// sharesKey reports whether another hit of the request has hit i's key and
// limit: those are decided by the store, in order.
func sharesKey(hits []sluice.Hit, i int) bool {
	for j := range hits {
		if j != i && hits[j].Key == hits[i].Key && hits[j].Limit == hits[i].Limit {
			return true
		}
	}
	return false
}

func reserved(res []held, i int) bool {
	for _, r := range res {
		if r.i == i {
			return true
		}
	}
	return false
}
