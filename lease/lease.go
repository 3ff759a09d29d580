// Package lease decides limits from local leases, to spare the shared
// store (Redis) most of its calls: a node takes a share of a key's quota
// from the store in one call (a grant), decides locally from it while it
// lasts, and asks again when it runs low (in the background, so that hits
// find the next lease ready) or when it runs out or expires. Shares follow
// demand: a grant is sized by what the node spent of its last one.
//
// A limit opts in with sluice.Limit.LeaseOvershoot, U hits: the bound on
// what leases may cost in exactness (docs/leases.md has the proof):
//
//   - Every grant is taken from the key's own state in the store, as if its
//     hits were admitted then, and is at most b = ⌈U/4⌉ hits. On a bucket
//     it is taken in the same atomic call from a ledger: a GCRA of burst b
//     that grants U − b hits per lease life D (at most MaxLife, and short
//     enough that the ledger grants at least the limit's own rate), on a
//     key of its own. A bucket's lease expires D after its grant. So at
//     any moment the hits granted on a bucket but not spent are at most
//     what the ledger grants in a span of D: b + (U − b) = U.
//   - On a bucket (token_bucket, leaky_bucket, gcra), a hit spent later
//     than its grant is the only difference from deciding every hit in the
//     store: any interval admits at most the limit's own bound plus the
//     hits outstanding when it began, U.
//   - On a window (fixed_window, sliding_window), a lease lives until the
//     window of its grant ends: nothing is admitted beyond the limit. A
//     node holds one lease per key, of at most b hits, so what leases
//     hold unspent, which other nodes may be denied early and which is
//     lost if unspent when the window ends, is at most b per node. A
//     window needs no ledger, so its grants keep up with any demand.
//
// A node that crashes takes its leases with it: they are spent nowhere,
// and the ledger forgets them after D. sliding_log and sketch do not
// lease (sluice.Limit.Validate refuses it): a log's point is each hit's
// own time, and a sketch's is to keep no state per key.
//
// Hits that a lease cannot serve (a limit without LeaseOvershoot, a shadow
// limit or one with block_for, a peek, a key its lease cannot cover and
// the ledger or the key cannot grant) are
// decided by the store, as without leases, together with the others of the
// request: all-or-nothing stays all-or-nothing (Take), one by one stays
// one by one (TakeEach, with its debts).
//
// When the store is down (a sluice.StoreError of any reason but
// sluice.FailError: silent, unreachable, its breaker open, or shedding
// calls), a hit waits for one call to it at most: the grant it asked for,
// or the grant or renewal of its key that it found in flight, whose error
// it returns, for the caller's failure policy; it does not ask the store
// again. While the store's Health reports it down, a hit does not wait for
// a grant in flight (the breaker's probe): the store answers it at once.
// So a hit of a leasing limit fails no later than a hit that does not
// lease; what the leases hold is still admitted meanwhile.
package lease

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/sluicehq/sluice"
)

// Config configures a Store. Its zero value is ready to use.
type Config struct {
	// Now is the store's clock, monotonic, in any origin. Nil means the
	// time since New (a monotonic clock read).
	Now func() time.Duration

	// MaxLeases bounds the leases held; beyond it, hits of keys without
	// one are decided by the store. Zero means DefaultMaxLeases.
	MaxLeases int

	// Go runs a renewal in the background: the grant a lease asks for
	// when it runs low, so that hits find the next lease ready. Nil
	// means a new goroutine; tests run it at once, for a deterministic
	// order.
	Go func(func())
}

// DefaultMaxLeases is the bound on leases when Config.MaxLeases is 0.
const DefaultMaxLeases = 100_000

// Store is a sluice.Store that decides the hits of leasing limits from
// local leases, and every other hit through the store it wraps. It is safe
// for concurrent use.
type Store struct {
	next  sluice.Store
	each  sluice.EachTaker // next's, or nil
	now   func() time.Duration
	start time.Time
	max   int64

	shards [numShards]shard
	count  atomic.Int64 // leases held

	ledgers sync.Map // *sluice.Limit -> *ledger

	goFn func(func())

	stats Stats
}

// Stats counts what a Store did. Read them with Store.Stats.
type Stats struct {
	Local    atomic.Int64 // hits admitted from a lease
	Grants   atomic.Int64 // grant calls made (a retry counts again)
	Refused  atomic.Int64 // grant calls the key or the ledger refused
	Granted  atomic.Int64 // hits granted
	Renewals atomic.Int64 // grant calls made ahead, for a lease running low
	Expired  atomic.Int64 // hits granted, never spent: their lease expired
	Fallback atomic.Int64 // hits of leasing limits decided by the store
}

const numShards = 64

type shard struct {
	mu sync.Mutex
	m  map[lkey]*lease
}

type lkey struct {
	key   string
	limit *sluice.Limit
}

// lease is a node's share of one key's quota.
type lease struct {
	pending   *flight       // the grant in flight; nil: none
	notBefore time.Duration // no grant before: the ledger refused one
	units     int64         // granted, not spent
	deadline  time.Duration // spent before it, or never
	spent     int64         // spent of the last grant
	size      int64         // the last grant's size
	limit     int64         // the decision's Limit
	left      int64         // the key's Remaining after the last grant
	resetAt   time.Duration // the key's ResetAfter after the last grant, on our clock
	since     time.Duration // when the lease's grant was sent

	// The renewal: a grant made ahead while the lease ran low, waiting
	// for it to run out or expire.
	spare         int64 // its size: a renewal is never spent from
	spareDeadline time.Duration
	spareSince    time.Duration
}

// flight is a grant in flight. Its err is set before done is closed: the
// store's failure when it could not be asked or did not answer (down),
// for the hits that waited for the grant to answer with, nil otherwise.
type flight struct {
	done chan struct{}
	err  error
}

func newFlight() *flight { return &flight{done: make(chan struct{})} }

// down reports whether err says that the store could not be asked or did
// not answer: it was silent past its deadline, unreachable, its breaker
// open, or it shed the call (sluice.StoreError's reasons other than
// FailError). A hit whose grant failed so does not ask the store again:
// the call would wait as long again, for the same silence. Any other
// error (an error reply, the caller's own context) leaves the hit to the
// store, as ever.
func down(err error) bool {
	return err != nil && sluice.ReasonOf(err) != sluice.FailError
}

// ledger is the ledger limit of a leasing limit, and the lifetime of its
// leases.
type ledger struct {
	limit *sluice.Limit
	life  time.Duration // D
}

// New returns a lease store in front of next.
func New(next sluice.Store, cfg Config) *Store {
	s := &Store{next: next, now: cfg.Now, start: time.Now(), max: int64(cfg.MaxLeases), goFn: cfg.Go}
	if s.goFn == nil {
		s.goFn = func(f func()) { go f() }
	}
	if s.max <= 0 {
		s.max = DefaultMaxLeases
	}
	s.each, _ = next.(sluice.EachTaker)
	for i := range s.shards {
		s.shards[i].m = map[lkey]*lease{}
	}
	return s
}

// Stats returns the store's counters.
func (s *Store) Stats() *Stats { return &s.stats }

// Unwrap returns the store the lease store wraps.
func (s *Store) Unwrap() sluice.Store { return s.next }

// Close closes the wrapped store if it has a Close method, and returns its
// error; otherwise it does nothing. Leases held are dropped with the store.
func (s *Store) Close() error {
	if c, ok := s.next.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// Health returns the wrapped store's Health() if it has that method, and
// nil otherwise.
func (s *Store) Health() error {
	if h, ok := s.next.(interface{ Health() error }); ok {
		return h.Health()
	}
	return nil
}

func (s *Store) clock() time.Duration {
	if s.now != nil {
		return s.now()
	}
	return time.Since(s.start)
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

func (s *Store) shardOf(k lkey) *shard {
	return &s.shards[xxh3.HashString(k.key)%numShards]
}

// leasable reports whether hit h may be served from a lease: not a peek,
// nor a shadow limit (whose denials consume nothing) or one with block_for
// (whose denials start a block: a grant too large would), nor the
// algorithms that do not lease.
func leasable(h *sluice.Hit) bool {
	l := h.Limit
	return h.Cost > 0 && l.LeaseOvershoot >= 2 && !l.Shadow && l.BlockFor == 0 &&
		l.Algorithm != sluice.SlidingLog && l.Algorithm != sluice.Sketch
}

// Take decides hits together (the sluice.Store contract): the hits its
// leases cover are reserved, the others decided by the store; if the
// store denies, the reservations go back.
func (s *Store) Take(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	return s.take(ctx, hits, out, false)
}

// TakeEach decides hits one by one (sluice.EachTaker): the hits its leases
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

func (s *Store) take(ctx context.Context, hits []sluice.Hit, out []sluice.Decision, each bool) error {
	var stack [8]held
	res := stack[:0]
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
			return err
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
			return nil
		}
	}
	if fallback > 0 {
		s.stats.Fallback.Add(fallback)
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
	// The rest through the store, in one call, in their order.
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
		return s.next.Take(ctx, hits, out)
	}
	if s.each != nil {
		return s.each.TakeEach(ctx, hits, out)
	}
	for i := range hits {
		if err := s.next.Take(ctx, hits[i:i+1], out[i:i+1]); err != nil {
			return err
		}
	}
	return nil
}

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
			l.promote(now, &s.stats)
		}
		if l != nil && now < l.deadline && l.units >= h.Cost {
			l.units -= h.Cost
			l.spent += h.Cost
			d := decisionOf(l, now)
			size, renew := l.renewal(now, led)
			var f *flight
			if renew {
				f = newFlight()
				l.pending = f
			}
			sh.mu.Unlock()
			if renew {
				// The renewal outlives the call: it keeps nothing of
				// the caller's (h is in a slice the caller reuses).
				s.stats.Renewals.Add(1)
				lim, bg := h.Limit, context.WithoutCancel(ctx)
				s.goFn(func() { s.renew(bg, lim, k, led, size, l, f) })
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
			// what a grant drops of the last one is less than the
			// hit that asked.) If it found the store down, so would
			// a call of this hit's own, after as long again: the
			// hit fails with it.
			f := l.pending
			sh.mu.Unlock()
			if s.Health() != nil {
				// The store says it is down (its breaker open, or
				// never connected): the grant is its probe, or
				// fails at once. The store answers the hit now, as
				// it answers a hit that does not lease, rather than
				// hold it behind the probe.
				return held{}, false, nil, nil
			}
			select {
			case <-f.done:
				if f.err != nil {
					return held{}, false, nil, f.err
				}
				continue
			case <-ctx.Done():
				return held{}, false, nil, nil
			}
		}
		if l == nil {
			if s.count.Load() >= s.max {
				sh.mu.Unlock()
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
// what the lease had left goes (every unit dies within its own grant's
// life); a renewal that expired waiting goes too.
func (l *lease) promote(now time.Duration, st *Stats) {
	if now >= l.spareDeadline {
		st.Expired.Add(l.spare)
		l.spare = 0
		return
	}
	st.Expired.Add(l.units)
	l.units, l.deadline, l.since = l.spare, l.spareDeadline, l.spareSince
	l.size, l.spent = l.spare, 0
	l.spare = 0
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
	if size == h.Cost && !out[0].Allowed {
		d := out[0]
		return held{}, false, &d, nil
	}
	s.refusedGrant(k, led, sent, &out)
	return held{}, false, nil, nil
}

// takeGrant asks the store for a grant of size hits of key (grantOf),
// counted, and returns when it was asked and the store's answer in out.
func (s *Store) takeGrant(ctx context.Context, lim *sluice.Limit, key string, led *ledger, size int64, out *[2]sluice.Decision) (time.Duration, error) {
	var hits [2]sluice.Hit
	sent := s.clock()
	n := grantOf(lim, key, led, size, &hits, out)
	s.stats.Grants.Add(1)
	return sent, s.next.Take(ctx, hits[:n], out[:n])
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
	// What the last grant left (too little for the hit that asked) goes:
	// every unit must die within its own grant's life, and the lease has
	// one deadline.
	s.stats.Expired.Add(l.units)
	l.deadline = sent + life
	l.since = sent
	l.units = size - h.Cost
	l.spent = h.Cost
	l.size = size
	l.limit = d.Limit
	l.left = d.Remaining
	l.resetAt = sent + d.ResetAfter
	return held{l: l, k: k, d: decisionOf(l, s.clock())}
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

// sweep drops the leases that expired (their unspent units with them).
func (s *Store) sweep(now time.Duration) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, l := range sh.m {
			if now >= l.deadline && l.pending == nil && (l.spare == 0 || now >= l.spareDeadline) {
				s.stats.Expired.Add(l.units + l.spare)
				delete(sh.m, k)
				s.count.Add(-1)
			}
		}
		sh.mu.Unlock()
	}
}

// decisionOf is the decision of a hit served from lease l: allowed, with
// what this node may still admit (its lease, and the key's room at the
// grant, which other nodes may have taken since). Call it under the
// shard's lock.
func decisionOf(l *lease, now time.Duration) sluice.Decision {
	return sluice.Decision{
		Allowed:    true,
		Limit:      l.limit,
		Remaining:  l.units + l.spare + l.left,
		ResetAfter: max(l.resetAt-now, 0),
	}
}

func windowed(k sluice.Algorithm) bool {
	return k == sluice.FixedWindow || k == sluice.SlidingWindow
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
