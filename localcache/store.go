package localcache

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/stores/decorator"
	"github.com/sluicehq/sluice/internal/vocab/limits"
)

// Config configures a Store. The zero value is ready to use: every field's
// zero value means the default written in its comment.
type Config struct {
	// MaxEntries bounds the number of entries. Zero means
	// DefaultMaxEntries. Beyond it entries are evicted, expired ones
	// first, as the package documentation says.
	MaxEntries int

	// Now returns the cache's clock: a monotonic time, in any origin. Nil
	// means the time since the cache was created (one monotonic clock
	// read, which follows a testing/synctest bubble).
	Now func() time.Duration
}

// DefaultMaxEntries is the size bound when Config.MaxEntries is 0.
const DefaultMaxEntries = 100_000

// Store is a sluice.Store that answers requests known to be denied without
// asking the store it wraps. It is safe for concurrent use. Create it with
// New.
//
// Like every store that wraps another, it has the methods Unwrap (the
// wrapped store), Health (the wrapped store's, nil when it has none) and
// Close (which leaves the wrapped store open, and does nothing else).
type Store struct {
	base // the store below: Unwrap, Health, Close

	now   func() time.Duration // nil: time since start
	start time.Time
	seed  uint64

	shards     []shard
	shardShift uint
	shardMask  uint64
	shardCap   int64 // entries per shard
	maxBuckets int   // buckets of a shard's largest table

	hits, misses       stripes
	inserts, evictions atomic.Int64
}

// New returns a cache in front of next, configured by cfg.
func New(next sluice.Store, cfg Config) *Store {
	maxEntries := cfg.MaxEntries
	if maxEntries <= 0 {
		maxEntries = DefaultMaxEntries
	}
	// Writers (learning a denial) are what shards spread; readers take no
	// lock. Keep at least 64 entries per shard so that small caches still
	// hold what they are sized for.
	n := min(4*runtime.GOMAXPROCS(0), 256, max(maxEntries/64, 1))
	shardBits := bits.Len(uint(n)) - 1 // round down to a power of two
	n = 1 << shardBits
	s := &Store{
		base:       decorator.New(next, "the cache"),
		now:        cfg.Now,
		start:      time.Now(),
		shards:     make([]shard, n),
		shardShift: uint(64 - shardBits),
		shardMask:  uint64(n - 1),
		shardCap:   int64(maxEntries / n),
		hits:       newStripes(),
		misses:     newStripes(),
	}
	// A table grows up to at least 5/4 of its shard's entries in slots.
	// With two buckets to choose from, an entry seldom finds both full
	// below a load of 90%, so evictions wait for the shard to be full.
	s.maxBuckets = 1 << bits.Len(uint((s.shardCap*5/4+ways-1)/ways-1))
	var b [8]byte
	crand.Read(b[:])
	s.seed = binary.LittleEndian.Uint64(b[:])
	for i := range s.shards {
		s.shards[i].rng = s.seed + uint64(i)
	}
	return s
}

// base is the forwarding helper every decorator embeds: Unwrap returns
// the wrapped store, Health is its (redisstore has one), and Close does
// nothing: the wrapped store is closed by whoever opened it.
type base = decorator.Base

// clock reads the cache's clock, in nanoseconds.
func (s *Store) clock() int64 {
	if s.now != nil {
		return int64(s.now())
	}
	return int64(time.Since(s.start))
}

// Take implements sluice.Store; see its documentation for the contract, and
// the package documentation for which requests are answered locally.
func (s *Store) Take(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	return s.take(ctx, hits, out, nil)
}

// TakeEach implements sluice.Store's TakeEach when the wrapped store does: hits
// decided one by one, a denied hit with room left overdrawn. Over a store
// without TakeEach it decides each hit with a Take, as
// Limiter.TakeEach's fallback does, and so overdraws nothing: short of
// the TakeEach contract, as the wrapped store is. A request is
// answered locally only from entries that deny every cost of at least 1
// (learned from a denial of cost 1, an overdrawn hit, or a block): a
// denial of a larger cost says nothing of when its limit has room again,
// which is when a hit there would overdraw rather than be denied.
func (s *Store) TakeEach(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	if s.Each != nil {
		return s.take(ctx, hits, out, s.Each.TakeEach)
	}
	return s.take(ctx, hits, out, func(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
		for i := range hits {
			if err := s.Next.Take(ctx, hits[i:i+1], out[i:i+1]); err != nil {
				return err
			}
		}
		return nil
	})
}

// take is Take, or with each set TakeEach, which each passes the request
// to the wrapped store.
func (s *Store) take(ctx context.Context, hits []sluice.Hit, out []sluice.Decision, each func(context.Context, []sluice.Hit, []sluice.Decision) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(out) < len(hits) {
		return fmt.Errorf("localcache: %d decisions for %d hits", len(out), len(hits))
	}
	var now int64
	local := len(hits) > 0
	if local {
		now = s.clock()
	}
	for i := range hits {
		h := &hits[i]
		if !cacheable(h) {
			local = false
			break
		}
		if ok, _ := s.answer(s.identity(h), h, now, &out[i], each != nil); !ok {
			local = false
			break
		}
	}
	if local {
		s.hits.add(uint64(now))
		return nil
	}
	if len(hits) == 0 {
		now = int64(rand.Uint64())
	}
	s.misses.add(uint64(now))
	take := s.Next.Take
	if each != nil {
		take = each
	}
	if err := take(ctx, hits, out); err != nil {
		return err
	}
	if each != nil {
		s.learnEach(hits, out, now)
		return nil
	}
	allowed := true
	for i := range hits {
		h, d := &hits[i], &out[i]
		if learnable(h, d) && !keyBefore(hits, i) {
			s.learn(s.identity(h), h, d, now, false)
		}
		if !d.Allowed && !h.Limit.Shadow {
			allowed = false
		}
	}
	if allowed {
		// The request consumed: what the cache reports of its keys
		// (Remaining, ResetAfter) is out of date.
		for i := range hits {
			if h := &hits[i]; h.Cost > 0 {
				s.forget(s.identity(h))
			}
		}
	}
	return nil
}

// TakeOne is Take for a single hit: the fast path (a TakeOne method) that
// Limiter.Allow uses. A local answer allocates nothing; a request passed
// to the store allocates what the store's TakeOne does.
func (s *Store) TakeOne(ctx context.Context, h sluice.Hit) (sluice.Decision, error) {
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, err
	}
	var d sluice.Decision
	var id ident
	var now int64
	held := false // an entry of id was seen
	if cacheable(&h) {
		now = s.clock()
		id = s.identity(&h)
		var ok bool
		if ok, held = s.answer(id, &h, now, &d, false); ok {
			s.hits.add(uint64(now))
			return d, nil
		}
	}
	if now == 0 {
		// Not read: a peek or a shadow hit.
		s.misses.add(rand.Uint64())
	} else {
		s.misses.add(uint64(now))
	}
	d, err := s.takeOne(ctx, h)
	switch {
	case err != nil:
		return d, err
	case learnable(&h, &d):
		s.learn(id, &h, &d, now, false)
	case held && d.Allowed:
		// The hit consumed: the entry's Remaining and ResetAfter are out
		// of date.
		s.forget(id)
	}
	return d, nil
}

// takeOne passes one hit to the wrapped store.
func (s *Store) takeOne(ctx context.Context, h sluice.Hit) (sluice.Decision, error) {
	if s.One != nil {
		return s.One.TakeOne(ctx, h)
	}
	// The one-element slices would escape to the heap through Take.
	b := onePool.Get().(*oneHit)
	b.hits[0] = h
	err := s.Next.Take(ctx, b.hits[:], b.out[:])
	d := b.out[0]
	*b = oneHit{}
	onePool.Put(b)
	return d, err
}

type oneHit struct {
	hits [1]sluice.Hit
	out  [1]sluice.Decision
}

var onePool = sync.Pool{New: func() any { return new(oneHit) }}

// cacheable reports whether a hit can be answered from, and teach, the
// cache: a peek, a shadow limit or a Concurrency limit never is (a
// permit's denial holds only until a holder releases, which no RetryAfter
// tells).
func cacheable(h *sluice.Hit) bool {
	return h.Cost > 0 && !h.Limit.Shadow && h.Limit.Algorithm != sluice.Concurrency
}

// learnable reports whether the store's decision d of h is a denial to
// remember. A limit with BlockFor is remembered only while its key is
// blocked (see learn).
func learnable(h *sluice.Hit, d *sluice.Decision) bool {
	return cacheable(h) && !d.Allowed && d.RetryAfter > 0 && d.Blocked == (h.Limit.BlockFor > 0)
}

// keyBefore reports whether a hit before hits[i] has the same key. The
// store decides such a hit on the state the earlier one would leave, so its
// decision does not say how hits[i] alone would fare.
func keyBefore(hits []sluice.Hit, i int) bool {
	for j := range i {
		if hits[j].Key == hits[i].Key {
			return true
		}
	}
	return false
}

// identity returns the identity of h's entry: its key, the fields of its
// limit that make up the compiled parameters (the algorithm's parameters: the capacity
// comes from Burst, SoftPercent and ElasticCeiling; Debit) and BlockFor, and for a
// sketch the sketch's name and dimensions. The raw fields are at least as
// fine as the parameters, and cheaper to read.
func (s *Store) identity(h *sluice.Hit) ident {
	l := h.Limit
	x := uint64(l.Algorithm)<<56 ^
		uint64(l.Rate)*0x9e3779b97f4a7c15 ^
		uint64(l.Period)*0xc2b2ae3d27d4eb4f ^
		uint64(l.Burst)*0x165667b19e3779f9 ^
		uint64(l.RefillInterval)*0xd6e8feb86659fd93 ^
		uint64(l.SoftPercent)*0xa0761d6478bd642f ^
		uint64(l.ElasticCeiling)*0xe7037ed1a0b428db ^
		uint64(l.BlockFor)*0x27d4eb2f165667c5
	if l.Debit {
		x ^= 0x94d049bb133111eb
	}
	if l.Algorithm == sluice.Sketch {
		w, d := limits.SketchDims(l)
		x ^= mix(xxh3.HashString(l.Name) ^ uint64(w)<<32 ^ uint64(d))
	}
	u := xxh3.HashString128Seed(h.Key, s.seed^mix(x))
	return ident{hi: u.Hi | 1, lo: u.Lo}
}

// learnEach learns what a request decided one by one teaches: the denials
// (an overdrawn hit's denies every cost of at least 1 until its
// RetryAfter), and forgets the entries of the hits that consumed.
func (s *Store) learnEach(hits []sluice.Hit, out []sluice.Decision, now int64) {
	for i := range hits {
		h, d := &hits[i], &out[i]
		switch {
		case keyBefore(hits, i) || h.Cost == 0:
		case learnable(h, d):
			s.learn(s.identity(h), h, d, now, true)
		case d.Allowed:
			s.forget(s.identity(h))
		}
	}
}

// answer writes to d the cached denial of h, whose identity is id, and
// reports whether there was one (ok), and whether the cache held an entry
// of id, live or not (held). each: only an entry that denies every cost
// of at least 1 answers (see TakeEach).
func (s *Store) answer(id ident, h *sluice.Hit, now int64, d *sluice.Decision, each bool) (ok, held bool) {
	var e entry
	held = s.lookup(id, &e)
	switch {
	case !held:
		return false, false
	case now >= e.until:
		s.expire(id, now)
		return false, true
	case h.Cost < e.minCost, each && e.minCost > 1:
		return false, true
	}
	*d = sluice.Decision{Limit: e.limit, Remaining: max(e.remaining, 0), Blocked: e.remaining < 0}
	switch {
	case e.until == never, h.Limit.Rate == 0 && !d.Blocked:
		// A zero limit never admits a hit, whenever its entry ends.
		d.RetryAfter = sluice.Never
	case h.Cost > e.minCost && !d.Blocked && h.Cost > limits.Params(h.Limit).Capacity:
		// Above the capacity, as the store would say.
		d.RetryAfter = sluice.Never
	default:
		d.RetryAfter = time.Duration(e.until - now)
	}
	switch {
	case e.reset == never:
		d.ResetAfter = sluice.Never
	case e.reset > now:
		d.ResetAfter = time.Duration(e.reset - now)
	case isWindow(h.Limit.Algorithm):
		// The deadline was the end of a window, which the store has
		// since moved on by whole periods. (A sliding window's
		// RetryAfter can reach into the next window: its ResetAfter can
		// be below its RetryAfter.)
		p := int64(h.Limit.Period)
		d.ResetAfter = time.Duration(p - (now-e.reset)%p)
	}
	return true, true
}

func isWindow(k sluice.Algorithm) bool {
	return k == sluice.FixedWindow || k == sluice.SlidingWindow || k == sluice.Sketch
}

// learn remembers the denial d of h, whose identity is id; t0 is the
// cache's clock read before the store was asked; each: decided one by one.
func (s *Store) learn(id ident, h *sluice.Hit, d *sluice.Decision, t0 int64, each bool) {
	e := entry{
		until:     afterSat(t0, d.RetryAfter),
		reset:     s.windowEnd(h.Limit, t0, d.ResetAfter),
		minCost:   h.Cost,
		limit:     d.Limit,
		remaining: d.Remaining,
	}
	if d.Overdrawn {
		// In debt until RetryAfter, when a hit of cost 1 fits again: every
		// cost is denied until then.
		e.minCost = 1
	}
	if each && h.Limit.Algorithm == sluice.FixedWindow {
		// No longer than its window: a zero window denies forever, but
		// decided one by one the store counts the first denied hit of
		// each window (algo.Overdraw), which must reach it.
		e.until = min(e.until, e.reset)
	}
	if d.Blocked {
		// The key is blocked until t0 + BlockFor at least (the store
		// started the block at t0 or later, or reported the time left of
		// an earlier one as RetryAfter). Beyond the block's end, a denial
		// would start a new block: leave that to the store.
		e.until = min(e.until, afterSat(t0, h.Limit.BlockFor))
		e.minCost = 1
		e.remaining = -1
		// While a block lasts the store reports its end as ResetAfter.
		e.reset = e.until
	}
	s.store(id, &e, t0)
}

// windowEnd returns when the window the store reported to end
// ResetAfter past its answer ends, on the cache's clock. The store read
// its clock between t0 and now, so the end lies between lo = t0 +
// ResetAfter and lo + (now - t0); a fixed window ends on a multiple of
// its Period past its WindowOffset. When such an instant of this
// machine's wall clock lies in that interval, it is the end: the cache's
// answers then count down to the window's end as the store's would
// (Envoy's duration_until_reset, in whole seconds, is what the store
// would have said, however slow the store was to answer: seen in a
// loaded run, 7 s where the store's answer gave 8). Otherwise (a
// store clock far from this machine's, an answer slower than a period,
// an injected clock, another algorithm) lo, early by the store's delay.
func (s *Store) windowEnd(l *sluice.Limit, t0 int64, resetAfter time.Duration) int64 {
	lo := afterSat(t0, resetAfter)
	p := int64(l.Period)
	if l.Algorithm != sluice.FixedWindow || s.now != nil || lo == never || p <= 0 || lo > never/2 {
		return lo
	}
	hi := lo + (s.clock() - t0)
	if hi-lo >= p {
		return lo
	}
	origin := s.start.UnixNano() // the wall time of the cache's clock 0
	off := int64(l.WindowOffset)
	w := origin + lo - off // lo in wall time, from the windows' origin
	end := (w + p - 1) / p * p
	if w < 0 {
		return lo
	}
	if at := end + off - origin; at <= hi {
		return at
	}
	return lo
}

// afterSat returns t + d on the cache's clock: never for sluice.Never,
// saturated at never.
func afterSat(t int64, d time.Duration) int64 {
	if d == sluice.Never || t > never-int64(d) {
		return never
	}
	return t + int64(d)
}
