package lease

import (
	"context"
	"time"

	"github.com/sluicehq/sluice"
)

// reserve takes h's cost from its key's lease, granting a new one first
// when the lease is missing, spent or expired (and no renewal waits), and
// starting a renewal when the lease runs low. It reports false when the
// hit must be decided by the store; then, when a grant of exactly h's cost
// was denied by the key itself, also that denial: the store's answer to h
// alone, decided all-or-nothing. It returns an error when the store is
// down (see down): the grant h made, or the one it waited for (a renewal,
// or another hit's grant), failed so. A hit waits for one such call at
// most, never for a grant and then a call of its own: on a silent store
// it is answered as soon as one call is found to fail, as a hit that does
// not lease.
func (s *Store) reserve(ctx context.Context, h *sluice.Hit, led *ledger) (held, bool, *sluice.Decision, error) {
	k := lkey{h.Key, h.Limit}
	sh := s.shardOf(k)
	for {
		now := s.clock()
		sh.mu.Lock()
		l := sh.m[k]
		if l != nil && l.spare > 0 && (now >= l.deadline || l.units < h.Cost) {
			l.promote(now, &s.stats, windowed(h.Limit.Algorithm))
		}
		if l != nil && now < l.deadline && l.units >= h.Cost {
			d, size, f := l.spend(h.Cost, now, led)
			sh.mu.Unlock()
			if f != nil {
				s.renewAhead(ctx, h.Limit, k, led, size, l, f)
			}
			return held{l: l, k: k, d: d}, true, nil, nil
		}
		if l != nil && now < l.notBefore {
			// The ledger refused lately: the store decides.
			sh.mu.Unlock()
			return held{}, false, nil, nil
		}
		if l != nil && l.pending != nil {
			// One grant in flight per key and node: wait for it, then
			// look again. (So a node holds one lease per key, and
			// what a grant drops of the last one, on a bucket, is
			// less than the hit that asked.) If it found the store
			// down, so would a call of this hit's own, after as long
			// again: the hit fails with it.
			f := l.pending
			sh.mu.Unlock()
			if again, err := s.await(ctx, f); !again {
				return held{}, false, nil, err
			}
			continue
		}
		if l == nil {
			if s.count.Load() >= s.max {
				// Full: the store decides, and the expired leases go
				// at most once every sweepEvery (a sweep reads every
				// lease: on every hit it made each decision as slow as
				// a walk of MaxLeases).
				sh.mu.Unlock()
				if !s.sweepDue(now) {
					return held{}, false, nil, nil
				}
				s.sweep(now)
				if s.count.Load() >= s.max {
					return held{}, false, nil, nil
				}
				continue
			}
			l = &lease{}
			sh.m[k] = l
			s.count.Add(1)
		}
		size := min(max(l.nextSize(now), h.Cost), max(led.limit.Burst, h.Cost))
		f := newFlight()
		l.pending = f
		sh.mu.Unlock()
		r, ok, denial, err := s.grant(ctx, h, k, led, size)
		s.landed(sh, l, f, err)
		return r, ok, denial, err
	}
}

// spend takes cost from the lease, which holds it and has not expired,
// and returns the hit's decision. When the lease runs low (renewal), it
// also returns the size of the grant to make ahead and its flight, now
// the lease's pending grant, for renewAhead; otherwise f is nil. Call it
// under the shard's lock.
func (l *lease) spend(cost int64, now time.Duration, led *ledger) (d sluice.Decision, size int64, f *flight) {
	l.units -= cost
	l.spent += cost
	d = decisionOf(l, now)
	size, renew := l.renewal(now, led)
	if !renew {
		return d, 0, nil
	}
	f = newFlight()
	l.pending = f
	return d, size, f
}

// renewAhead makes grant f of lease l, running low (spend), in the
// background (renew). The renewal outlives the call: it keeps nothing of
// the caller's (the hit is in a slice the caller reuses).
func (s *Store) renewAhead(ctx context.Context, lim *sluice.Limit, k lkey, led *ledger, size int64, l *lease, f *flight) {
	s.stats.Renewals.Add(1)
	bg := context.WithoutCancel(ctx)
	s.goFn(func() { s.renew(bg, lim, k, led, size, l, f) })
}

// await waits for grant f, in flight for the hit's lease, and reports
// whether to look at the lease again. When not, the store decides the
// hit, and err is f's failure if f found the store down: a call of the
// hit's own would fail so too, after as long again.
func (s *Store) await(ctx context.Context, f *flight) (again bool, err error) {
	if s.Health() != nil {
		// The store says it is down (its breaker open, or never
		// connected): the grant is its probe, or fails at once. The
		// store answers the hit now, as it answers a hit that does not
		// lease, rather than hold it behind the probe.
		return false, nil
	}
	select {
	case <-f.done:
		if f.err != nil {
			return false, f.err
		}
		return true, nil
	case <-ctx.Done():
		return false, nil
	}
}

// landed ends grant f of lease l, in shard sh, with err (nil, or a
// failure that says the store is down): the hits that waited for it look
// again, or fail with err.
func (s *Store) landed(sh *shard, l *lease, f *flight, err error) {
	sh.mu.Lock()
	if l.pending == f {
		l.pending = nil
	}
	sh.mu.Unlock()
	f.err = err
	close(f.done)
}

// promote makes the renewal the lease, when the lease can no longer serve:
// what the lease had left goes, or on a window stays (keep); a renewal
// that expired waiting goes.
func (l *lease) promote(now time.Duration, st *counters, window bool) {
	if now >= l.spareDeadline {
		st.Expired.Add(l.spare)
		l.spare = 0
		return
	}
	l.units = l.keep(now, window, st) + l.spare
	l.deadline, l.since = l.spareDeadline, l.spareSince
	l.size, l.spent = l.spare, 0
	l.spare = 0
}

// keep returns the units of lease l that the grant replacing it (a new
// grant, or the renewal taking over) keeps, and counts the others
// expired. A bucket's go: every unit must die within its own grant's
// life, and the lease has one deadline. A window's stay while l is alive:
// both grants are of the window that is now (the new one was sent after
// l was granted and answered before now; l's deadline, before the end of
// its window, is after now), and each grant's deadline is before that
// window's end, so its units die in the window that counted them
// whichever deadline they take. Dropped, such a remainder (too small for
// the hit that asked) was quota counted and never spent: hits of cost 100
// on leases of 250 lost about 11% of a window's limit, against the
// ⌈U/4⌉ a node that leases.md promises.
func (l *lease) keep(now time.Duration, window bool, st *counters) int64 {
	if window && now < l.deadline {
		return l.units
	}
	st.Expired.Add(l.units)
	return 0
}

// renewal reports whether the lease, just spent from, runs low: no grant
// in flight or waiting, and at the pace it is spent, it runs out before it
// expires with less than half of it left. Then the grant to make ahead is
// twice the lease's size, less what it has left, at most b: a node never
// holds more than b hits of a key, its lease and renewal together.
func (l *lease) renewal(now time.Duration, led *ledger) (int64, bool) {
	if l.pending != nil || l.spare > 0 || now < l.notBefore || 2*l.units >= l.size || l.spent < 2 {
		// (A lease that served one hit says nothing of a pace: a key
		// asked once is not renewed ahead.)
		return 0, false
	}
	// Spent at this pace, the rest lasts (now − since)·units/spent:
	// renew if that is before the deadline.
	if int64(now-l.since)*l.units >= int64(l.deadline-now)*l.spent {
		return 0, false
	}
	size := min(2*l.size, led.limit.Burst) - l.units
	return size, size >= 1
}

// renew makes the grant of a lease running low, in the background: on
// success it waits beside the lease, to be promoted when the lease runs
// out. l is the lease that asked; f is its pending grant, ended when
// done (with the store's failure, when it is down, for the hits that
// waited for it).
func (s *Store) renew(ctx context.Context, lim *sluice.Limit, k lkey, led *ledger, size int64, l *lease, f *flight) {
	sh := s.shardOf(k)
	var failed error
	defer func() { s.landed(sh, l, f, failed) }()
	var out [2]sluice.Decision
	sent, err := s.takeGrant(ctx, lim, k.key, led, size, &out)
	if err != nil {
		if down(err) {
			failed = err
		}
		return
	}
	if !out[0].Allowed || !out[1].Allowed {
		s.stats.Refused.Add(1)
		s.refusedGrant(k, led, sent, &out)
		return
	}
	s.stats.Granted.Add(size)
	life := lifeOf(lim, led, &out[0])
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.m[k] != l {
		// Swept meanwhile (it had expired): the renewal has no lease
		// to wait beside, and its hits are lost.
		s.stats.Expired.Add(size)
		return
	}
	l.spare, l.spareDeadline, l.spareSince = size, sent+life, sent
	l.limit, l.left, l.resetAt = out[0].Limit, out[0].Remaining, sent+out[0].ResetAfter
}

// nextSize is the size of the next grant, from the last one's fate: run
// out while alive (demand outgrew it): twice its size; expired with units
// left: what it spent, so that unspent grants, which the key counted as
// used, stay few.
func (l *lease) nextSize(now time.Duration) int64 {
	if now < l.deadline {
		return max(2*l.size, 1)
	}
	return max(l.spent, 1)
}
