package memstore

import (
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/base/algo"
)

// The word table: the state of the algorithms whose state fits one 64-bit
// word, decided without a lock.
//
// # Which limits
//
// A limit's state lives here when its parameters make it one word
// (wordLimit): GCRA, the smooth token bucket and the leaky bucket (one
// arithmetic) when the emission interval Period/Rate is a whole number of
// nanoseconds, so that the state's fractional part algo.State.B is always 0
// and the word is the idle-at time A; and the fixed window with a Period of
// at least 2^24 ns (16.8 ms) and a capacity under 2^24 − 4, packed as
// below. The choice depends only on the parameters that the key hash
// mixes in, so a key's state is always in the same table. Every other
// limit keeps the shard's locked table of two-word entries.
//
// # The word
//
// A word with its top bit clear is a GCRA-family state: its idle-at time.
// A word with its top bit set is a fixed window: bits 24–62 hold
// ⌈end/2^24⌉, where end is the end of the window it counts, and bits 0–23
// the count. Since end is a multiple of Period ≥ 2^24, it is the one
// multiple of Period in ((tag−1)·2^24, tag·2^24], so the state decodes
// exactly (wordState), and tag·2^24 is its idle-at time rounded up by less
// than 16.8 ms (wordIdleAt: the entry is kept that much longer, never
// less). A count above wMaxCount (a debt of TakeEach, the only way past the
// capacity) is kept as wMaxCount: a window over its capacity denies until
// it ends whatever the excess, so nothing a decision reports changes.
// Three values no state encodes to mark a slot: wDead (deleted), wFrozen
// (being moved to a new table) and wBusy (claimed by a locked decision of
// several hits).
//
// # Without a lock
//
// A slot's key never changes once written: keys are inserted only into
// empty slots, a deleted key's slot becomes wDead and is never reused, and
// tombstones leave only when the whole table is rebuilt into a new one
// (whose old copy the garbage collector frees once no reader holds it). So
// a compare-and-swap on a slot's word can only ever change the state of
// the key that slot was found for: no ABA across keys.
//
// A single-hit decision (takeWord) finds the key with atomic loads, reads
// the word, computes the next state with algo.Step and swaps it in with a
// compare-and-swap; a failed swap (another decision, or a sweep, came
// first) reads again. Every other change happens under the shard's mutex,
// itself through atomic operations on the words:
//
//   - inserting a new key (the slow path of a decision);
//   - a sweep or an eviction, which swaps an idle word for wDead with a
//     compare-and-swap, so that a concurrent decision's update is never
//     lost: the one that loses re-reads;
//   - a rebuild (growth, purging tombstones, shrinking, restoring), which
//     swaps every word of the old table for wFrozen and publishes the new
//     table: a decision that read a word before sees its swap fail, one
//     that reads wFrozen takes the mutex, and both then use the new table;
//   - a decision of several hits (all-or-nothing, TakeEach, block_for),
//     which swaps the words of its keys for wBusy, decides, and stores the
//     results (or the words it took) back before it unlocks, so that no
//     single-hit decision interleaves with it: one that reads wBusy takes
//     the mutex and waits.
//
// The fixed window's state is read and written whole, so "the window
// changed" and "the count changed" are one swap. TestWordsStress checks all
// of it under the race detector against a mutex reference.
type wtable struct {
	slots []wentry
	live  int // slots holding a key (idle or not), under the shard's mutex
	dead  int // tombstones, under the shard's mutex
}

// wentry is one slot: a key hash (0: empty) and its word.
type wentry struct {
	key  atomic.Uint64
	word atomic.Uint64
}

const (
	wentryBytes = 16

	wFixedBit  = uint64(1) << 63
	wTagShift  = 24
	wCountMask = uint64(1)<<wTagShift - 1
	wTagMask   = uint64(1)<<39 - 1
	wMaxCount  = wCountMask - 3

	wBusy   = ^uint64(0) - 2
	wFrozen = ^uint64(0) - 1
	wDead   = ^uint64(0)

	// wMaxLoad is the largest fraction of a word table's slots taken (by
	// keys or tombstones): linear probing without moving entries needs
	// more room than the two-word table's Robin Hood probing, and its
	// 16-byte entries afford it. A rebuild leaves the load at
	// wMaxLoad/wGrowth, so a word table holds 22.9 to 28.6 bytes a key.
	wMaxLoad = 0.7
	wGrowth  = 1.25

	// wTries is how many compare-and-swaps a single-hit decision tries
	// before it takes the mutex.
	wTries = 4

	// wKeepIdle: a rebuild keeps the entries that went idle less than
	// this long ago. A key asked more often than its limit refills (a
	// per-second limit on a client that calls every few milliseconds) is
	// idle most of the time; dropping it at every rebuild would make its
	// next decision a locked insert. Older idle entries go at the
	// rebuild, and every idle one at the sweep.
	wKeepIdle = int64(time.Second)
)

// wordLimit reports whether the state of limits with parameters p lives
// in the word table.
func wordLimit(p *algo.Params) bool {
	if p.Rate <= 0 || p.Period <= 0 || p.Interval != 0 {
		return false
	}
	switch p.Kind {
	case algo.GCRA, algo.TokenBucket, algo.LeakyBucket:
		return p.Period%p.Rate == 0
	case algo.FixedWindow:
		// The word keeps the window's end to 2^24 ns and finds it again
		// by the epoch's alignment: not an offset's.
		return p.Offset == 0 && p.Period >= 1<<wTagShift && p.Capacity >= 0 && uint64(p.Capacity) < wMaxCount
	}
	return false
}

// wordIdleAt is when the state of word w is equivalent to a fresh key's
// (for a fixed window, up to 2^24 ns later).
func wordIdleAt(w uint64) int64 {
	if w&wFixedBit == 0 {
		return int64(w)
	}
	return int64((w >> wTagShift & wTagMask) << wTagShift)
}

// wordState decodes the word w of a limit with parameters p, as read at
// now: an idle word reads as the fresh state.
func wordState(w uint64, p *algo.Params, now int64) algo.State {
	if wordIdleAt(w) <= now {
		return algo.State{}
	}
	if w&wFixedBit == 0 {
		return algo.State{A: int64(w)}
	}
	top := int64((w >> wTagShift & wTagMask) << wTagShift)
	return algo.State{A: top - top%p.Period, B: int64(w & wCountMask)}
}

// stateWord encodes st, a state algo.Step or algo.Overdraw returned for a
// limit with parameters p (wordLimit).
func stateWord(st algo.State, p *algo.Params) uint64 {
	if p.Kind != algo.FixedWindow {
		return uint64(max(st.A, 0))
	}
	a := uint64(max(st.A, 0))
	tag := min((a+wCountMask)>>wTagShift, wTagMask) // ⌈A/2^24⌉; windows ending in 2262 are cut at the last tag
	return wFixedBit | tag<<wTagShift | min(uint64(max(st.B, 0)), wMaxCount)
}

func wLimitFor(c int) int { return min(int(float64(c)*wMaxLoad), c-1) }

func wCapFor(n int) int { return max(int(float64(n)*wGrowth/wMaxLoad)+1, minCap) }

func (t *wtable) home(k uint64) int {
	hi, _ := bits.Mul64(k, uint64(len(t.slots)))
	return int(hi)
}

// find returns the slot of key k (not deleted), or nil. Safe without the
// mutex.
func (t *wtable) find(k uint64) *wentry {
	c := len(t.slots)
	for i := t.home(k); ; {
		e := &t.slots[i]
		switch e.key.Load() {
		case 0:
			return nil
		case k:
			if e.word.Load() != wDead {
				return e
			}
		}
		if i++; i == c {
			i = 0
		}
	}
}

// insert adds key k, absent, with word w, in the first empty slot of its
// probe; under the mutex, with room (live+dead < wLimitFor). The word is
// written before the key, so that a reader that finds the key reads it.
func (t *wtable) insert(k, w uint64) *wentry {
	c := len(t.slots)
	for i := t.home(k); ; {
		e := &t.slots[i]
		if e.key.Load() == 0 {
			e.word.Store(w)
			e.key.Store(k)
			t.live++
			return e
		}
		if i++; i == c {
			i = 0
		}
	}
}

func (t *wtable) full(extra int) bool { return t.live+t.dead+extra > wLimitFor(len(t.slots)) }

// len is the keys t holds (idle ones not yet swept included).
func (t *wtable) len() int {
	if t == nil {
		return 0
	}
	return t.live
}

func (t *wtable) bytes() int64 {
	if t == nil {
		return 0
	}
	return int64(len(t.slots)) * wentryBytes
}

// wordsOf returns the word table of sh (nil before its first key).
func (sh *shard) wordsOf() *wtable { return sh.w.Load() }

// bytes is the estimate of what sh holds, for the memory cap.
func (sh *shard) bytes() int64 {
	return sh.t.bytes() + sh.wordsOf().bytes() + sh.logBytes + sh.permBytes
}

// takeWord decides a single hit of a word-table limit without the mutex.
// It reports false when the mutex is needed: the key is absent (it must be
// inserted), its word is a marker, or wTries swaps failed.
func (s *Store) takeWord(sh *shard, k uint64, p *algo.Params, cost, now int64) (algo.Result, bool) {
	for range wTries {
		t := sh.wordsOf()
		if t == nil {
			return algo.Result{}, false
		}
		e := t.find(k)
		if e == nil {
			return algo.Result{}, false
		}
		w := e.word.Load()
		if w >= wBusy {
			return algo.Result{}, false
		}
		next, r := algo.Step(p, wordState(w, p, now), now, cost)
		if !r.Allowed || cost <= 0 {
			if wordIdleAt(w) <= now {
				// An idle entry the hit does not overwrite is removed,
				// under the mutex (it counts the table's tombstones).
				return algo.Result{}, false
			}
			return r, true
		}
		if e.word.CompareAndSwap(w, stateWord(next, p)) {
			return r, true
		}
	}
	return algo.Result{}, false
}

// takeWordLocked decides a single hit of a word-table limit under the
// mutex of sh (held): inserting the key if it is absent, through
// compare-and-swaps if not, since single-hit decisions do not take the
// mutex. each: as TakeEach.
func (s *Store) takeWordLocked(sh *shard, k uint64, p *algo.Params, cost, now int64, each bool) algo.Result {
	for {
		var e *wentry
		if t := sh.wordsOf(); t != nil {
			e = t.find(k)
		}
		if e == nil {
			if st := s.legacyState(sh, k, now); st.A > now {
				s.wInsert(sh, k, stateWord(st, p), now)
				continue
			}
			next, r := step(each, p, algo.State{}, now, cost)
			if (r.Allowed || r.Overdrawn) && cost > 0 {
				s.wInsert(sh, k, stateWord(next, p), now)
			}
			return r
		}
		w := e.word.Load()
		next, r := step(each, p, wordState(w, p, now), now, cost)
		if !(r.Allowed || r.Overdrawn) || cost <= 0 {
			if wordIdleAt(w) <= now && e.word.CompareAndSwap(w, wDead) {
				// Met idle and not overwritten: dropped, as the two-word
				// table drops the idle entries its lookups meet.
				t := sh.wordsOf()
				t.live--
				t.dead++
			}
			return r
		}
		if e.word.CompareAndSwap(w, stateWord(next, p)) {
			return r
		}
	}
}

// legacyState is the state of key k in sh's two-word table, removed from
// it: a snapshot written before word tables held such keys there.
func (s *Store) legacyState(sh *shard, k uint64, now int64) algo.State {
	i := sh.t.find(k)
	if i < 0 {
		return algo.State{}
	}
	st := sh.t.slots[i].st
	sh.t.remove(i)
	if st.A <= now {
		return algo.State{}
	}
	return st
}

// wInsert adds key k, absent from sh's word table, with word w, making
// room first; under the mutex.
func (s *Store) wInsert(sh *shard, k, w uint64, now int64) *wentry {
	if t := sh.wordsOf(); t == nil || t.full(1) {
		s.wMakeRoom(sh, 1, now, s.budget())
	}
	return sh.wordsOf().insert(k, w)
}

// wMakeRoom rebuilds sh's word table so that extra more keys fit: its
// live entries (idle ones dropped) in a table sized for them and growth,
// within the shard's share b of the memory cap (0: none). Over the cap,
// it keeps the entries that go idle last and evicts the others, down to
// seven eighths of what the capped table holds, so that evictions come in
// batches and a rebuild is not paid per insert.
func (s *Store) wMakeRoom(sh *shard, extra int, now int64, b int64) {
	old := sh.wordsOf()
	var keep []wrec
	if old != nil {
		keep = old.freeze(now)
	}
	c := wCapFor(len(keep) + extra)
	if b > 0 {
		maxC := max(int((b-sh.t.bytes()-sh.logBytes-sh.permBytes)/wentryBytes), minCap)
		if c > maxC {
			c = maxC
			if room := wLimitFor(c) * 7 / 8; len(keep)+extra > room {
				keep = sh.evictWords(keep, max(room-extra, 0), now, &s.evicted)
			}
		}
	}
	sh.w.Store(buildWords(c, keep))
}

// evictWords drops entries of keep until n are left, each time, as evict
// does, the one among evictSample drawn at random that goes idle first,
// counting those not idle at now in evicted.
func (sh *shard) evictWords(keep []wrec, n int, now int64, evicted *atomic.Int64) []wrec {
	for len(keep) > n {
		best := -1
		for range evictSample {
			hi, _ := bits.Mul64(sh.rand(), uint64(len(keep)))
			if i := int(hi); best < 0 || wordIdleAt(keep[i].w) < wordIdleAt(keep[best].w) {
				best = i
			}
		}
		if wordIdleAt(keep[best].w) > now {
			evicted.Add(1)
		}
		keep[best] = keep[len(keep)-1]
		keep = keep[:len(keep)-1]
	}
	return keep
}

// wrec is a key and its word, moved between tables.
type wrec struct{ k, w uint64 }

// freeze swaps every word of t for wFrozen, so that no decision changes
// it any more, and returns the keys whose state is not idle at now or
// went idle less than wKeepIdle before it.
func (t *wtable) freeze(now int64) []wrec {
	keep := make([]wrec, 0, t.live)
	for i := range t.slots {
		e := &t.slots[i]
		k := e.key.Load()
		if k == 0 {
			continue
		}
		if w := e.word.Swap(wFrozen); w < wBusy && wordIdleAt(w) > now-wKeepIdle {
			keep = append(keep, wrec{k, w})
		}
	}
	return keep
}

// buildWords returns a new table of capacity c holding recs, which must
// fit (len(recs) ≤ wLimitFor(c)).
func buildWords(c int, recs []wrec) *wtable {
	c = max(c, minCap)
	t := &wtable{slots: make([]wentry, c)}
	for _, r := range recs {
		t.insert(r.k, r.w)
	}
	return t
}

// wSweep deletes the idle entries of sh's word table among slots
// [from, to) and returns how many it deleted; under the mutex. A decision
// that revives an entry first wins: the swap to wDead then fails.
func (t *wtable) sweep(from, to int, now int64) int {
	removed := 0
	for i := from; i < to && i < len(t.slots); i++ {
		e := &t.slots[i]
		if e.key.Load() == 0 {
			continue
		}
		w := e.word.Load()
		if sweepHook != nil {
			sweepHook()
		}
		if w < wBusy && wordIdleAt(w) <= now && e.word.CompareAndSwap(w, wDead) {
			t.live--
			t.dead++
			removed++
		}
	}
	return removed
}

// sweepHook, set by a test, runs in a sweep between reading a word and
// deleting it: where a decision may revive the entry.
var sweepHook func()

// wCompact rebuilds sh's word table when tombstones or empty room have
// piled up (after a sweep); under the mutex.
func (s *Store) wCompact(sh *shard, now int64) {
	t := sh.wordsOf()
	if t == nil {
		return
	}
	if t.dead > t.live || float64(len(t.slots)) > float64(wCapFor(t.live))*wGrowth*wGrowth {
		s.wMakeRoom(sh, 0, now, s.budget())
	}
}

// claimWords, for a decision of several hits (the shards' mutexes held),
// swaps the word of each key it names for wBusy, keeping the word and its
// state in the key's first op; single-hit decisions that meet wBusy wait
// on the mutex. Keys still in the two-word table (from a version-1
// snapshot) move to the word table first, before any claim: a move may
// rebuild the table, and a rebuild freezes every word, claimed or not.
// Keys absent are inserted by releaseWords, after the claims are released.
func (s *Store) claimWords(ops []op, now int64) {
	for i := range ops {
		o := &ops[i]
		if o.where != inWord || o.prev >= 0 {
			continue
		}
		sh := &s.shards[s.shardOf(o.k)]
		if t := sh.wordsOf(); t != nil && t.find(o.k) != nil {
			continue
		}
		if st := s.legacyState(sh, o.k, now); st.A > now {
			s.wInsert(sh, o.k, stateWord(st, &o.p), now)
		}
	}
	for i := range ops {
		o := &ops[i]
		if o.where != inWord || o.prev >= 0 {
			continue
		}
		if t := s.shards[s.shardOf(o.k)].wordsOf(); t != nil {
			o.we = t.find(o.k)
		}
		if o.we != nil {
			o.w0 = o.we.word.Swap(wBusy)
			o.base = wordState(o.w0, &o.p, now)
		}
	}
}

// releaseWords stores, for each key claimWords claimed, the word its
// committed hits left or the word it took, and inserts the keys that were
// absent and committed.
func (s *Store) releaseWords(ops []op, now int64) {
	// Every claim is released before any insert, which may rebuild a
	// table (freezing its words).
	for i := range ops {
		o := &ops[i]
		switch {
		case o.where != inWord || o.prev >= 0 || o.we == nil:
		case o.wDone:
			o.we.word.Store(o.wNext)
		default:
			o.we.word.Store(o.w0)
		}
	}
	for i := range ops {
		if o := &ops[i]; o.where == inWord && o.prev < 0 && o.we == nil && o.wDone {
			s.wInsert(&s.shards[s.shardOf(o.k)], o.k, o.wNext, now)
		}
	}
}
