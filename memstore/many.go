package memstore

import (
	"math/bits"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
	"github.com/sluicehq/sluice/internal/vocab/limits"
)

// Where the state of a hit lives.
const (
	inTable = iota
	inWord
	inLog
	inSketch
	inPermits
)

// op is the working state of one hit in takeMany.
type op struct {
	p       algo.Params
	k       uint64 // key hash
	bk      uint64 // key of the block_for penalty, 0 without BlockFor
	until   int64  // end of an active block_for penalty, 0 if none
	where   uint8
	sk      *sketchSlot
	prev    int            // the previous hit on the same state, or -1
	base    algo.State     // inTable: the state the hit saw
	next    algo.State     // inTable: the state if committed
	log     algo.Log       // inLog: the log the hit saw
	expired int            // inLog: expired prefix of log
	logDone bool           // inLog, on the first hit of a key: a hit on it committed
	pend    int64          // inSketch: cost of earlier hits on the same key
	we      *wentry        // inWord, on the first hit of a key: its claimed slot, nil if absent
	w0      uint64         // inWord, first hit: the word claimed, put back unless a hit commits
	wNext   uint64         // inWord, first hit: the word the committed hits leave
	wDone   bool           // inWord, first hit: a hit on the key committed
	perms   *permitSet     // inPermits: the stored set (nil: none), expired permits dropped
	pset    algo.PermitSet // inPermits: the set the hit found
	pexp    int64          // inPermits: the expiry of the permit it holds if it commits, or 0
	r       algo.Result
}

// commits reports whether a hit consumes if its request is allowed (an
// overdrawn hit of TakeEach consumes, denied).
func (o *op) commits(cost int64) bool {
	return (o.r.Allowed || o.r.Overdrawn) && cost > 0 && o.until == 0
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
		case sluice.SlidingLog:
			o.where = inLog
		case sluice.Sketch:
			o.where = inSketch
			o.sk = s.sketches.get(h.Limit, &o.p)
		case sluice.Concurrency:
			o.where = inPermits
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

// apply decides every hit and, if every enforced one allows, commits them
// (each: commits every hit that allows or overdraws); denials start their
// block_for penalties. The locks of lockAll are held.
func (s *Store) apply(hits []sluice.Hit, ops []op, now int64, each bool) {
	s.claimWords(ops, now)
	defer s.releaseWords(ops, now)
	allowed := s.evaluateAll(hits, ops, now, each)
	s.commitAll(hits, ops, now, allowed || each)
	s.dropExpired(ops, now)
	if !allowed && !each {
		s.peekAllowed(hits, ops, now)
	}
}

// evaluateAll decides every hit (evaluate) and reports whether every
// enforced one allows.
func (s *Store) evaluateAll(hits []sluice.Hit, ops []op, now int64, each bool) bool {
	allowed := true
	for i := range ops {
		s.evaluate(hits, ops, i, now, each)
		if !ops[i].r.Allowed && !hits[i].Limit.Shadow {
			allowed = false
		}
	}
	return allowed
}

// commitAll commits the hits that consume (if consume is set: the request
// is allowed, or decided one by one), and starts the block_for penalty of
// each denied hit.
func (s *Store) commitAll(hits []sluice.Hit, ops []op, now int64, consume bool) {
	for i := range ops {
		o, h := &ops[i], &hits[i]
		if consume && o.commits(h.Cost) {
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
}

// dropExpired drops the expired entries of the sliding logs on which
// nothing was logged, so that the next request need not read them again
// (see algo.Log.Commit).
func (s *Store) dropExpired(ops []op, now int64) {
	for i := range ops {
		if o := &ops[i]; o.where == inLog && o.prev < 0 && !o.logDone && o.expired > 0 {
			s.commitLog(o, now, 0)
		}
	}
}

// peekAllowed is for a request denied all-or-nothing, which consumed
// nothing: a hit that would have allowed reports the state as it stands,
// as a peek.
func (s *Store) peekAllowed(hits []sluice.Hit, ops []op, now int64) {
	for i := range ops {
		if o := &ops[i]; o.r.Allowed && o.until == 0 && hits[i].Cost > 0 {
			if o.where == inPermits {
				o.r = peekPermit(hits, ops, i, now)
				continue
			}
			s.peekStored(ops, i, now)
		}
	}
}

// evaluate decides hit i on the state it would see: the stored state, or
// the pending state of the previous hit on the same key. A hit whose key
// is blocked (block_for) is not decided; its until says until when.
func (s *Store) evaluate(hits []sluice.Hit, ops []op, i int, now int64, each bool) {
	o := &ops[i]
	if o.bk != 0 {
		s.readBlock(o, now)
	}
	switch o.where {
	case inTable, inWord:
		s.evaluateState(hits, ops, i, now, each)
	case inLog:
		s.evaluateLog(hits, ops, i, now, each)
	case inSketch:
		evaluateSketch(hits, ops, i, now, each)
	case inPermits:
		// A Concurrency hit is decided by itself, in TakeEach too: no
		// debt, and its limit has no block_for.
		s.evaluatePermit(hits, ops, i, now)
	}
}

// readBlock sets o.until to the end of the block_for penalty of o's key
// if one is active at now, and drops it if it has ended.
func (s *Store) readBlock(o *op, now int64) {
	sh := &s.shards[s.shardOf(o.bk)]
	if j := sh.t.find(o.bk); j >= 0 {
		if until := sh.t.slots[j].st.A; until > now {
			o.until = until
		} else {
			sh.t.remove(j)
		}
	}
}

// previous returns the previous hit of the request on the same state as
// hit i and its cost, or nil if hit i is the first.
func previous(hits []sluice.Hit, ops []op, i int) (*op, int64) {
	if j := ops[i].prev; j >= 0 {
		return &ops[j], hits[j].Cost
	}
	return nil, 0
}

// evaluateState is evaluate for a one-state algorithm (inTable, inWord).
func (s *Store) evaluateState(hits []sluice.Hit, ops []op, i int, now int64, each bool) {
	o, h := &ops[i], &hits[i]
	switch q, qCost := previous(hits, ops, i); {
	case q != nil && q.commits(qCost):
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
}

// evaluateLog is evaluate for a sliding log.
func (s *Store) evaluateLog(hits []sluice.Hit, ops []op, i int, now int64, each bool) {
	o, h := &ops[i], &hits[i]
	switch q, qCost := previous(hits, ops, i); {
	case q != nil && q.commits(qCost):
		// The log as the previous hit would leave it, its live
		// entries copied so that the stored log stays untouched until
		// commit (a request that names one key twice pays for it).
		o.log = q.log
		o.log.Entries = append(make([]algo.LogEntry, 0, len(q.log.Entries)+1), q.log.Entries...)
		o.log.Commit(q.expired, now, qCost)
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
}

// evaluateSketch is evaluate for a sketch: the hit adds its cost to those
// of the earlier hits of the request on the same key that commit.
func evaluateSketch(hits []sluice.Hit, ops []op, i int, now int64, each bool) {
	o, h := &ops[i], &hits[i]
	if q, qCost := previous(hits, ops, i); q != nil {
		o.pend = q.pend
		if q.commits(qCost) {
			o.pend += qCost
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
	case inPermits:
		s.commitPermit(o, h)
	}
}

// overdrawn is the result of an overdrawn hit, from after, a hit of cost
// 1 on the state it left.
func overdrawn(after algo.Result) algo.Result {
	return algo.Result{ResetAfter: after.ResetAfter, RetryAfter: after.RetryAfter, Overdrawn: true}
}

// chainHead returns the first hit on the same state as hit i.
func chainHead(ops []op, i int) *op {
	o := &ops[i]
	for o.prev >= 0 {
		o = &ops[o.prev]
	}
	return o
}
