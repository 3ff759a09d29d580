// Package lease decides limits from local leases, to spare the shared
// store (Redis) most of its calls: a node takes a share of a key's quota
// from the store in one call (a grant), decides locally from it while it
// lasts, and asks again when it runs low (in the background, so that hits
// find the next lease ready) or when it runs out or expires. Shares follow
// demand: a grant is sized by what the node spent of its last one.
//
// A limit opts in with sluice.Limit.LeaseOvershoot, U hits: the bound on
// what leases may cost in exactness (docs/internals/leases-proof.md has the proof):
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
// own time, and a sketch's is to keep no state per key. Nor do the
// permits of a Concurrency limit (Validate refuses a lease overshoot on
// one, and a hit of one is never served from a lease): each
// permit is an ID held in the store, and a share of them held by a node
// would be slots no other node could take, for as long as the share
// lives; the store decides their hits exactly, together with the
// request's others, and its Permits releases and renews the
// permits there.
//
// Hits that a lease cannot serve (a limit without LeaseOvershoot, a shadow
// limit or one with block_for, a peek, a key its lease cannot cover and
// the ledger or the key cannot grant) are
// decided by the store, as without leases, together with the others of the
// request: all-or-nothing stays all-or-nothing (Take), one by one stays
// one by one (TakeEach, with its debts).
//
// Close leaves the wrapped store open: a store that wraps another never
// closes it; close it yourself when done.
//
// Settle settles a reservation in the wrapped store: a leasing window's
// charge and refund, but only a leasing bucket's charge, never its refund
// (see Store.Settle).
//
// When the store is down (a fault.StoreError of any reason but
// fault.Error: silent, unreachable, its breaker open, or shedding
// calls), a hit waits for one call to it at most: the grant it asked for,
// or the grant or renewal of its key that it found in flight, whose error
// it returns, for the caller's failure policy; it does not ask the store
// again. While the store's Health reports it down, a hit does not wait for
// a grant in flight (the breaker's probe): the store answers it at once.
// So a hit of a leasing limit fails no later than a hit that does not
// lease; what the leases hold is still admitted meanwhile.
package lease

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/fault"
	"github.com/sluicehq/sluice/internal/stores/decorator"
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

// sweepEvery is the least time between two sweeps of a full Store: a
// sweep reads every lease (1.8 ms for 100,000, BenchmarkSweepFull), so a
// flood of new keys costs one a second, not one a hit; leases expired
// meanwhile wait for the next.
const sweepEvery = time.Second

// sweepDue reports whether a sweep may begin at now, and if so claims it.
func (s *Store) sweepDue(now time.Duration) bool {
	last := s.swept.Load()
	if last != 0 && now-time.Duration(last-1) < sweepEvery {
		return false
	}
	return s.swept.CompareAndSwap(last, int64(now)+1)
}

// Store is a sluice.Store that decides the hits of leasing limits from
// local leases, and every other hit through the store it wraps. It is safe
// for concurrent use.
//
// Like every store that wraps another, it has the methods Unwrap (the
// wrapped store), Health (the wrapped store's, nil when it has none) and
// Close (which leaves the wrapped store open, and does nothing else).
type Store struct {
	base // the store below: Unwrap, Health, Close

	now   func() time.Duration
	start time.Time
	max   int64

	shards [numShards]shard
	count  atomic.Int64 // leases held
	swept  atomic.Int64 // when the last sweep began (clock), +1; 0: never
	sweeps atomic.Int64 // sweeps made

	ledgers sync.Map // *sluice.Limit -> *ledger

	goFn func(func())

	stats counters
}

// Stats counts what a Store did since New: a snapshot, from Store.Stats.
type Stats struct {
	Local    int64 // hits admitted from a lease
	Grants   int64 // grant calls made (a retry counts again)
	Refused  int64 // grant calls the key or the ledger refused
	Granted  int64 // hits granted
	Renewals int64 // grant calls made ahead, for a lease running low
	Expired  int64 // hits granted, never spent: their lease expired
	Fallback int64 // hits of leasing limits decided by the store
}

// counters are the live counts behind Stats.
type counters struct {
	Local, Grants, Refused, Granted, Renewals, Expired, Fallback atomic.Int64
}

// Stats returns a snapshot of the store's counters.
func (s *Store) Stats() Stats {
	c := &s.stats
	return Stats{
		Local: c.Local.Load(), Grants: c.Grants.Load(), Refused: c.Refused.Load(), Granted: c.Granted.Load(),
		Renewals: c.Renewals.Load(), Expired: c.Expired.Load(), Fallback: c.Fallback.Load(),
	}
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
// open, or it shed the call (fault.StoreError's reasons other than
// fault.Error). A hit whose grant failed so does not ask the store again:
// the call would wait as long again, for the same silence. Any other
// error (an error reply, the caller's own context) leaves the hit to the
// store, as ever.
func down(err error) bool {
	return err != nil && fault.ReasonOf(err) != fault.Error
}

// New returns a lease store in front of next.
func New(next sluice.Store, cfg Config) *Store {
	s := &Store{base: decorator.New(next, "the leases"), now: cfg.Now, start: time.Now(), max: int64(cfg.MaxLeases), goFn: cfg.Go}
	if s.goFn == nil {
		s.goFn = func(f func()) { go f() }
	}
	if s.max <= 0 {
		s.max = DefaultMaxLeases
	}
	for i := range s.shards {
		s.shards[i].m = map[lkey]*lease{}
	}
	return s
}

// base is the forwarding helper every decorator embeds: Unwrap returns
// the wrapped store, Health is its, and Close does nothing (leases held are
// dropped with the Store; the wrapped store is closed by whoever opened
// it).
type base = decorator.Base

func (s *Store) clock() time.Duration {
	if s.now != nil {
		return s.now()
	}
	return time.Since(s.start)
}

func (s *Store) shardOf(k lkey) *shard {
	return &s.shards[xxh3.HashString(k.key)%numShards]
}

// sweep drops the leases that expired (their unspent units with them).
func (s *Store) sweep(now time.Duration) {
	s.sweeps.Add(1)
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
