package lease

import (
	"context"
	"time"

	"github.com/sluicehq/sluice"
)

// ledger is the ledger limit of a leasing limit, and the lifetime of its
// leases.
type ledger struct {
	limit *sluice.Limit
	life  time.Duration // D
}

// ledgerOf returns the ledger of a leasing limit l, nil when l cannot lease
// (its bound leaves a lease no lifetime).
func (s *Store) ledgerOf(l *sluice.Limit) *ledger {
	if v, ok := s.ledgers.Load(l); ok {
		return v.(*ledger)
	}
	led := newLedger(l)
	v, _ := s.ledgers.LoadOrStore(l, led)
	return v.(*ledger)
}

// MaxLife is the longest a bucket's lease lives. A shorter life lets the
// ledger grant faster (the bound is on what is outstanding, so a ledger
// that forgets sooner may give more): leases keep up with a bucket's
// demand up to (U − ⌈U/4⌉)/MaxLife hits a second, or the limit's own rate
// if higher, which is all a bucket admits once its burst is spent.
const MaxLife = 100 * time.Millisecond

// newLedger builds the ledger of l: a GCRA of burst b = ⌈U/4⌉ and rate
// U − b per lease life D, where D = min(MaxLife, (U − b)·Period/Rate): in
// any span of D it grants at most b + (U − b) = U hits, at a rate of at
// least the limit's own. The burst caps one grant: a quarter of the bound
// leaves most of it to the ledger's rate, what leases can carry. Nil when
// U < 2 or the rate is zero.
func newLedger(l *sluice.Limit) *ledger {
	u := l.LeaseOvershoot
	if u < 2 || l.Rate <= 0 {
		return nil
	}
	burst := (u + 3) / 4
	life := min(MaxLife, time.Duration(float64(u-burst)*float64(l.Period)/float64(l.Rate)))
	if life < time.Microsecond {
		return nil
	}
	return &ledger{
		limit: &sluice.Limit{Name: l.Name + "#lease", Algorithm: sluice.GCRA, Rate: u - burst, Period: life, Burst: burst},
		life:  life,
	}
}

// ledgerKey is the key of a leased key's ledger: its own string, so that
// its state never meets another limit's.
func ledgerKey(key string) string { return key + "\x00lease" }

// grant asks the store for size hits of h's key, with as many of its
// ledger, in one all-or-nothing call. On success the lease holds what was
// granted, less h's cost. A refused grant makes the next one no larger
// than there was room for, and not sooner than the ledger has room for
// the one refused (nor than a sixteenth of a lease's life); when it asked
// for h's cost alone and the key itself refused, its answer is the
// store's answer to h. A grant that found the store down returns its
// error (the hit does not ask again); one that failed otherwise leaves
// the hit to the store.
func (s *Store) grant(ctx context.Context, h *sluice.Hit, k lkey, led *ledger, size int64) (held, bool, *sluice.Decision, error) {
	var out [2]sluice.Decision
	sent, err := s.takeGrant(ctx, h.Limit, h.Key, led, size, &out)
	if err != nil {
		if down(err) {
			return held{}, false, nil, err
		}
		return held{}, false, nil, nil
	}
	if out[0].Allowed && out[1].Allowed {
		s.stats.Granted.Add(size)
		return s.install(h, k, led, size, sent, &out[0]), true, nil, nil
	}
	s.stats.Refused.Add(1)
	// The store decides the key's hits for a while, a grant of exactly
	// the hit's cost refused too: otherwise every hit on a key out of
	// room made a grant, one at a time behind the one in flight, and
	// then (TakeEach) a call of its own.
	s.refusedGrant(k, led, sent, &out)
	if size == h.Cost && !out[0].Allowed {
		d := out[0]
		return held{}, false, &d, nil
	}
	return held{}, false, nil, nil
}

// takeGrant asks the store for a grant of size hits of key (grantOf),
// counted, and returns when it was asked and the store's answer in out.
func (s *Store) takeGrant(ctx context.Context, lim *sluice.Limit, key string, led *ledger, size int64, out *[2]sluice.Decision) (time.Duration, error) {
	var hits [2]sluice.Hit
	sent := s.clock()
	n := grantOf(lim, key, led, size, &hits, out)
	s.stats.Grants.Add(1)
	return sent, s.Next.Take(ctx, hits[:n], out[:n])
}

// refusedGrant records a grant sent at sent and refused with out: the next
// grant asks for what there was room for, not before the ledger has room
// for it nor before a sixteenth of a lease's life. The store decides the
// hits meanwhile, one call each, so that refused grants add at most one
// call per node and key in that time.
func (s *Store) refusedGrant(k lkey, led *ledger, sent time.Duration, out *[2]sluice.Decision) {
	s.refused(k, min(out[0].Remaining, out[1].Remaining), sent+max(out[1].RetryAfter, led.life/16))
}

// lifeOf is how long a lease granted with decision d lives: the ledger's
// lease life on a bucket; on a window, until the window of its grant ends,
// and no longer: its hits are spent in the window that counted them, so
// no window admits more than its limit, however long they wait.
func lifeOf(lim *sluice.Limit, led *ledger, d *sluice.Decision) time.Duration {
	if windowed(lim.Algorithm) {
		return d.ResetAfter
	}
	return led.life
}

// grantOf sets the hits of a grant of size on l's key, and returns how
// many to take: the key and its ledger on a bucket; on a window the key
// alone, and then out[1] is what a ledger with room would answer. A
// window needs no ledger: its leases live until the window of their grant
// ends, so the key's own count bounds them, and a node holds at most b;
// its grants go as fast as demand asks.
func grantOf(l *sluice.Limit, key string, led *ledger, size int64, hits *[2]sluice.Hit, out *[2]sluice.Decision) int {
	hits[0] = sluice.Hit{Key: key, Limit: l, Cost: size}
	if windowed(l.Algorithm) {
		out[1] = sluice.Decision{Allowed: true, Remaining: size}
		return 1
	}
	hits[1] = sluice.Hit{Key: ledgerKey(key), Limit: led.limit, Cost: size}
	return 2
}

// install puts a granted lease of size hits in place, h's cost taken from
// it. sent is when the grant was asked for: the lease's deadline is
// measured from it, so that it falls no later than the store meant.
func (s *Store) install(h *sluice.Hit, k lkey, led *ledger, size int64, sent time.Duration, d *sluice.Decision) held {
	life := lifeOf(h.Limit, led, d)
	sh := s.shardOf(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	l := sh.m[k]
	if l == nil {
		l = &lease{}
		sh.m[k] = l
		s.count.Add(1)
	}
	// What the last grant left (too little for the hit that asked) goes,
	// or stays on a window (keep).
	now := s.clock()
	kept := l.keep(now, windowed(h.Limit.Algorithm), &s.stats)
	l.deadline = sent + life
	l.since = sent
	l.units = kept + size - h.Cost
	l.spent = h.Cost
	l.size = size
	l.limit = d.Limit
	l.left = d.Remaining
	l.resetAt = sent + d.ResetAfter
	return held{l: l, k: k, d: decisionOf(l, now)}
}

// refused makes the next grant of k's lease ask for no more than room (at
// least its hit's cost) and not before until, when the ledger will have
// room for the grant refused.
func (s *Store) refused(k lkey, room int64, until time.Duration) {
	sh := s.shardOf(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if l := sh.m[k]; l != nil {
		// nextSize doubles a live lease's size, or takes what an
		// expired one spent: either way, room at most.
		l.spent, l.size = min(l.spent, room), min(l.size, room/2)
		l.notBefore = until
	}
}

// windowed reports whether k counts in windows (fixed_window,
// sliding_window), whose leases live until the window of their grant ends.
func windowed(k sluice.Algorithm) bool {
	return k == sluice.FixedWindow || k == sluice.SlidingWindow
}
