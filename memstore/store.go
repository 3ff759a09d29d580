package memstore

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/algo"
	"github.com/sluicehq/sluice/internal/limits"
)

// Config configures a Store. The zero value is ready to use: every field's
// zero value means the default written in its comment.
type Config struct {
	// Now returns the current time. The store owns the clock: each Take
	// reads it once and decides every hit at that time. Nil means the wall
	// clock as read when the store was created plus the monotonic time
	// elapsed since: one clock read per decision instead of time.Now's two,
	// and immune to steps of the wall clock (a stepped wall clock is picked
	// up when the store is created again).
	Now func() time.Time

	// Shards is the number of independently locked parts of the store,
	// rounded up to a power of two, at most 1024. Zero means 16 per
	// GOMAXPROCS.
	Shards int

	// MaxBytes caps the memory estimate of the store (Bytes). When a new
	// key would exceed it, the store evicts as the package documentation
	// says, handing the evicted client a fresh quota. Zero means no cap.
	MaxBytes int64

	// SweepInterval is how often a background goroutine drops idle keys.
	// Zero means one minute; negative means no background sweep (call
	// Sweep yourself, or rely on resizing and lookups to reclaim them).
	SweepInterval time.Duration

	// Seed seeds the hash of the keys. Zero means a random seed, which is
	// what you want: a known seed lets clients choose keys that collide.
	// Restoring a snapshot replaces the seed with the snapshot's.
	Seed uint64
}

// Defaults of Config.
const (
	DefaultSweepInterval = time.Minute
	MaxShards            = 1024
)

// Store is the in-memory sluice.Store. It is safe for concurrent use. Create
// it with New and stop its background sweep with Close.
type Store struct {
	now      func() int64 // Unix nanoseconds
	seed     atomic.Uint64
	shards   []shard
	mask     uint64
	maxBytes int64
	sketches sketchSet
	evicted  atomic.Int64

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// shard is one independently locked part of the store: a table of the
// one-state algorithms (and block_for penalties) and the sliding logs whose
// key hashes fall in it. It is padded to two cache lines so that the
// mutexes of neighbouring shards never share one.
type shard struct {
	mu       sync.Mutex
	t        table
	w        atomic.Pointer[wtable] // the word table (words.go)
	logs     map[uint64]logList
	logBytes int64  // estimate of the memory held by logs
	rng      uint64 // state of the eviction sampler
	_        [64]byte
}

// logList is the sliding log of one key.
type logList struct {
	idle int64 // the list is empty at and after idle
	l    algo.Log
}

// Estimates of the memory held by a sliding log: per key (map slot, list
// header, bookkeeping) and per entry.
const (
	logKeyBytes   = 96
	logEntryBytes = 16
	shardBytes    = 128
)

// monotonicClock returns the default clock, in Unix nanoseconds: the wall
// clock at the call, advanced by the monotonic clock. time.Since on a time
// with a monotonic reading reads only the monotonic clock, and no
// time.Time is built per reading.
func monotonicClock() func() int64 {
	base := time.Now()
	at := base.UnixNano()
	return func() int64 { return at + int64(time.Since(base)) }
}

// New returns a Store configured by cfg and starts its background sweep.
func New(cfg Config) *Store {
	n := cfg.Shards
	if n <= 0 {
		n = 16 * runtime.GOMAXPROCS(0)
	}
	n = min(n, MaxShards)
	n = 1 << bits.Len(uint(n-1))
	s := &Store{
		shards:   make([]shard, n),
		mask:     uint64(n - 1),
		maxBytes: max(cfg.MaxBytes, 0),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	if now := cfg.Now; now != nil {
		s.now = func() int64 { return now().UnixNano() }
	} else {
		s.now = monotonicClock()
	}
	seed := cfg.Seed
	for seed == 0 {
		var b [8]byte
		rand.Read(b[:])
		seed = binary.LittleEndian.Uint64(b[:])
	}
	s.seed.Store(seed)
	for i := range s.shards {
		sh := &s.shards[i]
		sh.logs = make(map[uint64]logList)
		sh.rng = mix64(seed + uint64(i))
	}
	s.sketches.m = make(map[sketchID]*sketchSlot)
	every := cfg.SweepInterval
	if every == 0 {
		every = DefaultSweepInterval
	}
	if every > 0 {
		go s.sweepLoop(every)
	} else {
		close(s.done)
	}
	return s
}

// Close stops the background sweep. The store remains usable. Close is
// idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() { close(s.stop) })
	<-s.done
	return nil
}

func (s *Store) sweepLoop(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Sweep()
		}
	}
}

// mix64 is a bijective 64-bit finalizer (the one of MurmurHash3).
func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// paramsMix folds a limit's parameters into the key seed, so that two
// limits given the same key string keep separate state.
func paramsMix(p *algo.Params) uint64 {
	x := uint64(p.Kind)<<56 ^
		uint64(p.Rate)*0x9e3779b97f4a7c15 ^
		uint64(p.Period)*0xc2b2ae3d27d4eb4f ^
		uint64(p.Capacity)*0x165667b19e3779f9 ^
		uint64(p.Interval)*0xd6e8feb86659fd93
	return mix64(x)
}

// keyHash returns the 64-bit identity of key under limit parameters p,
// never 0 (the empty slot).
func (s *Store) keyHash(key string, p *algo.Params) uint64 {
	h := xxh3.HashStringSeed(key, s.seed.Load()^paramsMix(p))
	if h == 0 {
		h = 1
	}
	return h
}

// blockKey derives the key of the block_for penalty of key k.
func blockKey(k uint64) uint64 {
	b := mix64(k ^ 0x5bd1e9955bd1e995)
	if b == 0 {
		b = 1
	}
	return b
}

func (s *Store) shardOf(k uint64) int { return int(k & s.mask) }

// addSat returns a+b for b >= 0, saturated at math.MaxInt64.
func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// Take implements sluice.Store; see its documentation for the contract.
func (s *Store) Take(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	return s.take(ctx, hits, out, false)
}

// TakeEach decides hits one by one (sluice.EachTaker): each hit that
// allows is consumed whatever the others decide, and a denied hit that
// finds its limit not exhausted is consumed past it, a debt
// (algo.Overdraw). The shards of every hit are locked together, as for
// Take, so that the hits are decided in order with nothing in between.
func (s *Store) TakeEach(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	return s.take(ctx, hits, out, true)
}

// take is Take, or TakeEach when each is set.
func (s *Store) take(ctx context.Context, hits []sluice.Hit, out []sluice.Decision, each bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(out) < len(hits) {
		return fmt.Errorf("memstore: %d decisions for %d hits", len(out), len(hits))
	}
	if len(hits) == 0 {
		return nil
	}
	now := s.now()
	if len(hits) == 1 {
		s.takeSingle(hits, out, now, each)
		return nil
	}
	s.takeMany(hits, out, now, each)
	return nil
}

// TakeOne is Take for a single hit: the fast path (a TakeOne method) that
// Limiter.Allow uses.
func (s *Store) TakeOne(ctx context.Context, h sluice.Hit) (sluice.Decision, error) {
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, err
	}
	hits := [1]sluice.Hit{h}
	var out [1]sluice.Decision
	s.takeSingle(hits[:], out[:], s.now(), false)
	return out[0], nil
}

// takeSingle decides a request of one hit: takeOne for a one-state
// algorithm without block_for, takeMany for the rest. each: as TakeEach.
func (s *Store) takeSingle(hits []sluice.Hit, out []sluice.Decision, now int64, each bool) {
	if h := &hits[0]; h.Limit.Algorithm.HasState() && h.Limit.BlockFor == 0 {
		s.takeOne(h, &out[0], now, each)
		return
	}
	s.takeMany(hits, out, now, each)
}

// takeOne is Take (each: TakeEach) for the common request: one hit of a
// one-state algorithm without block_for.
func (s *Store) takeOne(h *sluice.Hit, out *sluice.Decision, now int64, each bool) {
	p := limits.Params(h.Limit)
	k := s.keyHash(h.Key, &p)
	sh := &s.shards[s.shardOf(k)]
	if wordLimit(&p) {
		r, ok := algo.Result{}, false
		if !each {
			r, ok = s.takeWord(sh, k, &p, h.Cost, now)
		}
		if !ok {
			sh.mu.Lock()
			r = s.takeWordLocked(sh, k, &p, h.Cost, now, each)
			sh.mu.Unlock()
		}
		*out = limits.Decision(h.Limit, r, &p)
		return
	}
	sh.mu.Lock()
	var st algo.State
	idle := false
	i := sh.t.find(k)
	if i >= 0 {
		// An idle entry is a fresh key: read it as the zero State.
		if st = sh.t.slots[i].st; st.A <= now {
			st, idle = algo.State{}, true
		}
	}
	next, r := step(each, &p, st, now, h.Cost)
	switch {
	case (r.Allowed || r.Overdrawn) && h.Cost > 0:
		// An idle slot is overwritten in place, not removed and
		// inserted again.
		s.putAt(sh, i, k, next, now)
	case idle:
		sh.t.remove(i)
	}
	sh.mu.Unlock()
	*out = limits.Decision(h.Limit, r, &p)
}

// Where the state of a hit lives.
const (
	inTable = iota
	inWord
	inLog
	inSketch
)

// op is the working state of one hit in takeMany.
type op struct {
	p       algo.Params
	k       uint64 // key hash
	bk      uint64 // key of the block_for penalty, 0 without BlockFor
	until   int64  // end of an active block_for penalty, 0 if none
	where   uint8
	sk      *sketchSlot
	prev    int        // the previous hit on the same state, or -1
	base    algo.State // inTable: the state the hit saw
	next    algo.State // inTable: the state if committed
	log     algo.Log   // inLog: the log the hit saw
	expired int        // inLog: expired prefix of log
	logDone bool       // inLog, on the first hit of a key: a hit on it committed
	pend    int64      // inSketch: cost of earlier hits on the same key
	we      *wentry    // inWord, on the first hit of a key: its claimed slot, nil if absent
	w0      uint64     // inWord, first hit: the word claimed, put back unless a hit commits
	wNext   uint64     // inWord, first hit: the word the committed hits leave
	wDone   bool       // inWord, first hit: a hit on the key committed
	r       algo.Result
}

// commits reports whether a hit consumes if its request is allowed (an
// overdrawn hit of TakeEach consumes, denied).
func (o *op) commits(cost int64) bool {
	return (o.r.Allowed || o.r.Overdrawn) && cost > 0 && o.until == 0
}

// step is algo.Step, or algo.Overdraw for TakeEach.
func step(each bool, p *algo.Params, st algo.State, now, n int64) (algo.State, algo.Result) {
	if each {
		return algo.Overdraw(p, st, now, n)
	}
	return algo.Step(p, st, now, n)
}

const smallOps = 4

var opPool = sync.Pool{New: func() any { return new([sluice.MaxHits]op) }}

// takeMany decides several hits all-or-nothing (each: one by one, as
// TakeEach): it finds where each hit's state lives, locks every shard (and
// sketch) involved at once, decides each hit on the state it would see
// (earlier hits of the request on the same key included), commits only if
// every enforced hit allows (each: every hit that allows or overdraws),
// and reports.
func (s *Store) takeMany(hits []sluice.Hit, out []sluice.Decision, now int64, each bool) {
	var small [smallOps]op
	var ops []op
	switch {
	case len(hits) <= smallOps:
		ops = small[:len(hits)]
	case len(hits) <= sluice.MaxHits:
		big := opPool.Get().(*[sluice.MaxHits]op)
		defer opPool.Put(big)
		ops = big[:len(hits)]
	default:
		ops = make([]op, len(hits))
	}
	s.prepare(hits, ops)
	var locked [MaxShards / 64]uint64
	s.lockAll(hits, ops, &locked)
	s.apply(hits, ops, now, each)
	unlockSketches(ops)
	s.unlockShards(&locked)

	for i := range ops {
		o, l := &ops[i], hits[i].Limit
		if o.until == 0 {
			out[i] = limits.Decision(l, o.r, &o.p)
			continue
		}
		out[i] = limits.Blocked(limits.Decision(l, o.r, &o.p), time.Duration(o.until-now))
	}
}

// prepare fills ops from hits: each hit's parameters, key hash, where its
// state lives, and the earlier hit of the request on the same state.
func (s *Store) prepare(hits []sluice.Hit, ops []op) {
	for i := range hits {
		h := &hits[i]
		o := &ops[i]
		*o = op{p: limits.Params(h.Limit), prev: -1}
		o.k = s.keyHash(h.Key, &o.p)
		if h.Limit.BlockFor > 0 {
			o.bk = blockKey(o.k)
		}
		switch h.Limit.Algorithm {
		case algo.SlidingLog:
			o.where = inLog
		case algo.Sketch:
			o.where = inSketch
			o.sk = s.sketches.get(h.Limit, &o.p)
		default:
			o.where = inTable
			if wordLimit(&o.p) {
				o.where = inWord
			}
		}
		for j := i - 1; j >= 0; j-- {
			if q := &ops[j]; q.k == o.k && q.where == o.where && q.sk == o.sk {
				o.prev = j
				break
			}
		}
	}
}

// lockAll locks every shard that holds a state or a block_for penalty of
// the hits, recording them in locked, and the sketches of the hits.
func (s *Store) lockAll(hits []sluice.Hit, ops []op, locked *[MaxShards / 64]uint64) {
	for i := range ops {
		o := &ops[i]
		if o.where != inSketch {
			sh := s.shardOf(o.k)
			locked[sh/64] |= 1 << (sh % 64)
		}
		if o.bk != 0 {
			sh := s.shardOf(o.bk)
			locked[sh/64] |= 1 << (sh % 64)
		}
	}
	for {
		s.lockShards(locked)
		if lockSketches(ops) {
			return
		}
		// A sketch was dropped by a sweep or a restore between lookup and
		// lock: look it up again.
		unlockSketches(ops)
		s.unlockShards(locked)
		for i := range ops {
			if o := &ops[i]; o.where == inSketch {
				o.sk = s.sketches.get(hits[i].Limit, &o.p)
			}
		}
	}
}

// apply decides every hit and, if every enforced one allows, commits them
// (each: commits every hit that allows or overdraws); denials start their
// block_for penalties. The locks of lockAll are held.
func (s *Store) apply(hits []sluice.Hit, ops []op, now int64, each bool) {
	s.claimWords(ops, now)
	defer s.releaseWords(ops, now)
	allowed := true
	for i := range ops {
		s.evaluate(hits, ops, i, now, each)
		if !ops[i].r.Allowed && !hits[i].Limit.Shadow {
			allowed = false
		}
	}
	for i := range ops {
		o, h := &ops[i], &hits[i]
		if (allowed || each) && o.commits(h.Cost) {
			s.commit(ops, i, h, now)
			if o.where == inLog {
				chainHead(ops, i).logDone = true
			}
		}
		if !o.r.Allowed && o.until == 0 && o.bk != 0 && h.Cost > 0 {
			// A denial (by an enforced limit, or by a shadow limit that
			// reports what enforcing it would do) starts a block_for penalty.
			o.until = addSat(now, int64(h.Limit.BlockFor))
			s.put(&s.shards[s.shardOf(o.bk)], o.bk, algo.State{A: o.until}, now)
		}
	}
	for i := range ops {
		// A sliding log on which nothing was logged still drops its
		// expired entries, so that the next request need not read them
		// again (see algo.Log.Commit).
		if o := &ops[i]; o.where == inLog && o.prev < 0 && !o.logDone && o.expired > 0 {
			s.commitLog(o, now, 0)
		}
	}
	if !allowed && !each {
		// Nothing was consumed: a hit that would have allowed reports the
		// state as it stands, as a peek.
		for i := range ops {
			if o := &ops[i]; o.r.Allowed && o.until == 0 && hits[i].Cost > 0 {
				s.peekStored(ops, i, now)
			}
		}
	}
}

// evaluate decides hit i on the state it would see: the stored state, or
// the pending state of the previous hit on the same key.
func (s *Store) evaluate(hits []sluice.Hit, ops []op, i int, now int64, each bool) {
	o, h := &ops[i], &hits[i]
	if o.bk != 0 {
		sh := &s.shards[s.shardOf(o.bk)]
		if j := sh.t.find(o.bk); j >= 0 {
			if until := sh.t.slots[j].st.A; until > now {
				o.until = until
			} else {
				sh.t.remove(j)
			}
		}
	}
	var q *op
	if o.prev >= 0 {
		q = &ops[o.prev]
	}
	switch o.where {
	case inTable, inWord:
		switch {
		case q != nil && q.commits(hits[o.prev].Cost):
			o.base = q.next
		case q != nil:
			o.base = q.base
		case o.where == inWord:
			// claimWords read the word (or the legacy entry).
		default:
			sh := &s.shards[s.shardOf(o.k)]
			if j := sh.t.find(o.k); j >= 0 {
				// An idle entry reads as a fresh key; a commit
				// overwrites it in place.
				if st := sh.t.slots[j].st; st.A > now {
					o.base = st
				}
			}
		}
		if o.until == 0 {
			o.next, o.r = step(each, &o.p, o.base, now, h.Cost)
		}
	case inLog:
		switch {
		case q != nil && q.commits(hits[o.prev].Cost):
			// The log as the previous hit would leave it, its live
			// entries copied so that the stored log stays untouched until
			// commit (a request that names one key twice pays for it).
			o.log = q.log
			o.log.Entries = append(make([]algo.LogEntry, 0, len(q.log.Entries)+1), q.log.Entries...)
			o.log.Commit(q.expired, now, hits[o.prev].Cost)
		case q != nil:
			o.log = q.log
		default:
			o.log = s.shards[s.shardOf(o.k)].logs[o.k].l
		}
		if o.until == 0 {
			if each {
				o.expired, o.r = algo.LogStepEach(&o.p, &o.log, now, h.Cost)
				o.r.Overdrawn = algo.Overdraws(o.r, h.Cost) ||
					algo.OverdrawsExhausted(&o.p, o.r, h.Cost, func() bool { return !peekLog(&o.p, &o.log, now) })
			} else {
				o.expired, o.r = algo.LogStep(&o.p, &o.log, now, h.Cost)
			}
		}
	case inSketch:
		if q != nil {
			o.pend = q.pend
			if q.commits(hits[o.prev].Cost) {
				o.pend += hits[o.prev].Cost
			}
		}
		if o.until == 0 {
			if each {
				o.r = o.sk.s.CheckEach(&o.p, o.k, now, h.Cost+o.pend)
				o.r.Overdrawn = algo.Overdraws(o.r, h.Cost) ||
					algo.OverdrawsExhausted(&o.p, o.r, h.Cost, func() bool { return !o.sk.s.CheckEach(&o.p, o.k, now, o.pend).Allowed })
			} else {
				o.r = o.sk.s.Check(&o.p, o.k, now, h.Cost+o.pend)
			}
		}
	}
}

// peekLog reports whether a peek at log l is allowed: the log is not in
// debt.
func peekLog(p *algo.Params, l *algo.Log, now int64) bool {
	_, r := algo.LogStepEach(p, l, now, 0)
	return r.Allowed
}

// peekStored replaces the result of hit i with a peek at the stored state:
// that of the first hit on the same key, since none was committed.
func (s *Store) peekStored(ops []op, i int, now int64) {
	o, first := &ops[i], &ops[i]
	for first.prev >= 0 {
		first = &ops[first.prev]
	}
	switch o.where {
	case inTable, inWord:
		_, o.r = algo.Step(&o.p, first.base, now, 0)
	case inLog:
		_, o.r = algo.LogStep(&o.p, &first.log, now, 0)
	case inSketch:
		o.r = o.sk.s.Check(&o.p, o.k, now, 0)
	}
}

// commit consumes an allowed (or overdrawn) hit.
func (s *Store) commit(ops []op, i int, h *sluice.Hit, now int64) {
	o := &ops[i]
	switch o.where {
	case inTable:
		s.put(&s.shards[s.shardOf(o.k)], o.k, o.next, now)
	case inWord:
		// Kept claimed until releaseWords: a later hit of the request on
		// the same key may commit over it.
		head := chainHead(ops, i)
		head.wNext, head.wDone = stateWord(o.next, &o.p), true
	case inLog:
		s.commitLog(o, now, h.Cost)
		if o.r.Overdrawn {
			// Report the debt as algo.Overdraw does: when a hit of cost
			// 1 fits again.
			l := s.shards[s.shardOf(o.k)].logs[o.k].l
			_, after := algo.LogStep(&o.p, &l, now, 1)
			o.r = overdrawn(after)
		}
	case inSketch:
		o.sk.s.Add(o.k, now, h.Cost)
		o.sk.idle = max(o.sk.idle, addSat(now, addSat(o.p.Period, o.p.Period)))
		if o.r.Overdrawn {
			o.r = overdrawn(o.sk.s.Check(&o.p, o.k, now, 1))
		}
	}
}

// overdrawn is the result of an overdrawn hit, from after, a hit of cost
// 1 on the state it left.
func overdrawn(after algo.Result) algo.Result {
	return algo.Result{ResetAfter: after.ResetAfter, RetryAfter: after.RetryAfter, Overdrawn: true}
}

// commitLog drops the expired entries of hit o's log and appends n hits
// (n = 0: drops only).
func (s *Store) commitLog(o *op, now, n int64) {
	sh := &s.shards[s.shardOf(o.k)]
	ll, ok := sh.logs[o.k]
	if !ok {
		if n <= 0 {
			return
		}
		sh.logBytes += logKeyBytes
	}
	c := cap(ll.l.Entries)
	ll.l.Commit(o.expired, now, n)
	if len(ll.l.Entries) == 0 {
		dropLog(sh, o.k)
		return
	}
	ll.idle = max(ll.idle, addSat(ll.l.Newest(), o.p.Period))
	sh.logs[o.k] = ll
	sh.logBytes += int64(cap(ll.l.Entries)-c) * logEntryBytes
	s.trimLogs(sh, o.k)
}

// chainHead returns the first hit on the same state as hit i.
func chainHead(ops []op, i int) *op {
	o := &ops[i]
	for o.prev >= 0 {
		o = &ops[o.prev]
	}
	return o
}

// put stores st under k in sh, or deletes k if st is idle at now.
func (s *Store) put(sh *shard, k uint64, st algo.State, now int64) {
	s.putAt(sh, sh.t.find(k), k, st, now)
}

// putAt is put with i the slot of k in sh's table, or -1 if absent.
func (s *Store) putAt(sh *shard, i int, k uint64, st algo.State, now int64) {
	switch {
	case i >= 0 && st.A > now:
		sh.t.slots[i].st = st
	case i >= 0:
		sh.t.remove(i)
	case st.A > now:
		s.insert(sh, k, st, now)
	}
}

func (s *Store) lockShards(set *[MaxShards / 64]uint64) {
	for w, bitsSet := range set {
		for b := bitsSet; b != 0; b &= b - 1 {
			s.shards[w*64+bits.TrailingZeros64(b)].mu.Lock()
		}
	}
}

func (s *Store) unlockShards(set *[MaxShards / 64]uint64) {
	for w, bitsSet := range set {
		for b := bitsSet; b != 0; b &= b - 1 {
			s.shards[w*64+bits.TrailingZeros64(b)].mu.Unlock()
		}
	}
}

// insert adds k, absent from sh, making room first if the table is full.
func (s *Store) insert(sh *shard, k uint64, st algo.State, now int64) {
	if sh.t.n >= limitFor(len(sh.t.slots)) {
		s.makeRoom(sh, now, s.budget())
	}
	sh.t.insert(k, st)
}

// budget returns the bytes each shard may hold, or 0 for no cap.
func (s *Store) budget() int64 {
	if s.maxBytes == 0 {
		return 0
	}
	return max((s.maxBytes-s.sketches.bytes.Load())/int64(len(s.shards))-shardBytes, 1)
}

// makeRoom makes room for one more entry in the full table of sh, whose
// budget is b bytes (0: no cap). A table at its budget evicts one entry.
// Otherwise idle entries are dropped in place; if that frees less than an
// eighth of the table, it grows (up to its budget). Tables shrink only in
// Sweep, so that keys touched less often than their period do not make a
// table shrink and grow again.
func (s *Store) makeRoom(sh *shard, now int64, b int64) {
	t := &sh.t
	c := len(t.slots)
	if c == 0 {
		t.rebuild(minCap, now)
		return
	}
	maxC := math.MaxInt
	if b > 0 {
		maxC = max(int((b-sh.logBytes-sh.wordsOf().bytes())/entryBytes), minCap)
	}
	if c >= maxC {
		s.evict(sh, now)
		return
	}
	lim := limitFor(c)
	if t.sweep(0, c, now) > 0 && t.n < lim-lim/8 {
		return
	}
	t.rebuild(min(capFor(t.n+1), maxC), now)
	if t.n >= limitFor(len(t.slots)) {
		s.evict(sh, now)
	}
}

// evictSample is how many entries (or logs) eviction compares.
const evictSample = 8

func (sh *shard) rand() uint64 {
	sh.rng += 0x9e3779b97f4a7c15
	return mix64(sh.rng)
}

// evict removes, among evictSample entries from a random slot of sh's
// table, the one with the earliest idle-at time.
func (s *Store) evict(sh *shard, now int64) {
	t := &sh.t
	c := len(t.slots)
	hi, _ := bits.Mul64(sh.rand(), uint64(c))
	i := int(hi)
	best, bestA := -1, int64(0)
	for seen, probes := 0, 0; seen < evictSample && probes < c; probes++ {
		if e := &t.slots[i]; e.key != 0 {
			if best < 0 || e.st.A < bestA {
				best, bestA = i, e.st.A
			}
			seen++
		}
		if i++; i == c {
			i = 0
		}
	}
	if best >= 0 {
		if bestA > now {
			s.evicted.Add(1)
		}
		t.remove(best)
	}
}

// trimLogs evicts sliding logs of sh other than keep while sh is over its
// share of the memory cap.
func (s *Store) trimLogs(sh *shard, keep uint64) {
	if b := s.budget(); b > 0 {
		trimLogsBudget(sh, keep, b, &s.evicted)
	}
}

// trimLogsBudget evicts sliding logs of sh other than keep while sh holds
// more than b bytes: each time, among evictSample logs, the one that goes
// idle first.
func trimLogsBudget(sh *shard, keep uint64, b int64, evicted *atomic.Int64) {
	for sh.bytes() > b {
		var victim uint64
		var victimIdle int64
		seen := 0
		for k, ll := range sh.logs {
			if k == keep {
				continue
			}
			if seen == 0 || ll.idle < victimIdle {
				victim, victimIdle = k, ll.idle
			}
			if seen++; seen == evictSample {
				break
			}
		}
		if seen == 0 {
			return
		}
		dropLog(sh, victim)
		evicted.Add(1)
	}
}

func dropLog(sh *shard, k uint64) {
	sh.logBytes -= logKeyBytes + int64(cap(sh.logs[k].l.Entries))*logEntryBytes
	delete(sh.logs, k)
}

// sweepChunk is how many table slots Sweep examines per lock.
const sweepChunk = 4096

// Sweep drops every idle key, log, sketch and expired penalty, shrinks
// tables that have emptied, and returns how many entries it dropped. The
// background sweep calls it every Config.SweepInterval; it holds each
// shard's lock only briefly.
func (s *Store) Sweep() int {
	removed := 0
	for i := range s.shards {
		sh := &s.shards[i]
		for from := 0; ; from += sweepChunk {
			now := s.now()
			sh.mu.Lock()
			if from >= len(sh.t.slots) {
				sh.mu.Unlock()
				break
			}
			removed += sh.t.sweep(from, from+sweepChunk, now)
			sh.mu.Unlock()
		}
		for from := 0; ; from += sweepChunk {
			now := s.now()
			sh.mu.Lock()
			t := sh.wordsOf()
			if t == nil || from >= len(t.slots) {
				sh.mu.Unlock()
				break
			}
			removed += t.sweep(from, from+sweepChunk, now)
			sh.mu.Unlock()
		}
		now := s.now()
		sh.mu.Lock()
		for k, ll := range sh.logs {
			if ll.idle <= now {
				dropLog(sh, k)
				removed++
			}
		}
		if c := capFor(sh.t.n); float64(len(sh.t.slots)) > float64(c)*growth*growth {
			sh.t.rebuild(c, now)
		}
		s.wCompact(sh, now)
		sh.mu.Unlock()
	}
	removed += s.sketches.sweep(s.now())
	return removed
}

// Len returns the number of keys the store holds state for: one-state keys,
// sliding logs and active block_for penalties. Keys of sketch limits have no
// state of their own and are not counted.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.t.n + sh.wordsOf().len() + len(sh.logs)
		sh.mu.Unlock()
	}
	return n
}

// Bytes returns an estimate of the memory the store holds: its tables,
// sliding logs and sketches. Config.MaxBytes caps it.
func (s *Store) Bytes() int64 {
	n := s.sketches.bytes.Load()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += shardBytes + sh.bytes()
		sh.mu.Unlock()
	}
	return n
}

// Evictions returns how many live keys the memory cap has evicted since the
// store was created.
func (s *Store) Evictions() int64 { return s.evicted.Load() }

// Stats is what the store holds and has done, as Len, Bytes and Evictions
// report it. Package memstoremetrics exports it to Prometheus.
type Stats struct {
	Keys      int   // keys held (Len)
	Bytes     int64 // estimated memory (Bytes), which Config.MaxBytes caps
	Evictions int64 // live keys evicted by the memory cap since creation
}

// Stats returns the store's figures, from one pass over its shards.
func (s *Store) Stats() Stats {
	st := Stats{Bytes: s.sketches.bytes.Load(), Evictions: s.evicted.Load()}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		st.Keys += sh.t.n + sh.wordsOf().len() + len(sh.logs)
		st.Bytes += shardBytes + sh.bytes()
		sh.mu.Unlock()
	}
	return st
}
