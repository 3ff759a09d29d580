package memstore

import (
	"context"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
	"github.com/sluicehq/sluice/internal/vocab/limits"
)

// Settle settles a reservation (sluice.Limiter.Settle) on its key's state,
// at the store's clock, with algo.Settle's arithmetic. A call that returns
// has applied it, and a store in memory has no reply to lose: s.ID is not
// needed. The limiter has checked s.
func (s *Store) Settle(ctx context.Context, st *sluice.Settlement) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	h := &st.Hit
	p := limits.Params(h.Limit)
	now := s.now()
	at, reset := st.At.UnixNano(), int64(st.ResetAfter)
	settle := func(cur algo.State) (algo.State, int64) {
		if p.Kind == algo.FixedWindow && wordLimit(&p) && uint64(cur.B) >= wMaxCount {
			// A word keeps a count past wMaxCount as wMaxCount: what
			// lies beyond is unknown, so nothing is refunded from it.
			if st.Spent < h.Cost {
				return cur, 0
			}
		}
		return algo.Settle(&p, cur, now, at, reset, h.Cost, st.Spent)
	}
	k := s.keyHash(h.Key, &p)
	sh := &s.shards[s.shardOf(k)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if wordLimit(&p) {
		return s.settleWord(sh, k, &p, now, settle), nil
	}
	var cur algo.State
	i := sh.t.find(k)
	if i >= 0 {
		if cur = sh.t.slots[i].st; cur.A <= now {
			cur = algo.State{}
		}
	}
	next, moved := settle(cur)
	if moved != 0 {
		s.putAt(sh, i, k, next, now)
	}
	return moved, nil
}

// settleWord applies settle to the state of key k of a word-table limit,
// under the mutex of sh (held): through compare-and-swaps, since
// single-hit decisions do not take the mutex.
func (s *Store) settleWord(sh *shard, k uint64, p *algo.Params, now int64, settle func(algo.State) (algo.State, int64)) int64 {
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
			next, moved := settle(algo.State{})
			if moved != 0 && next.A > now {
				s.wInsert(sh, k, stateWord(next, p), now)
			}
			return moved
		}
		w := e.word.Load()
		next, moved := settle(wordState(w, p, now))
		if moved == 0 {
			return 0
		}
		nw := stateWord(next, p)
		if next.A <= now {
			nw = stateWord(algo.State{}, p)
		}
		if e.word.CompareAndSwap(w, nw) {
			return moved
		}
	}
}
