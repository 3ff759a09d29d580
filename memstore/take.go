package memstore

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
	"github.com/sluicehq/sluice/internal/vocab/limits"
)

// Take implements sluice.Store; see its documentation for the contract.
func (s *Store) Take(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	return s.take(ctx, hits, out, false)
}

// TakeEach decides hits one by one (sluice.Store's TakeEach): each hit that
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
	if h := &hits[0]; algo.Kind(h.Limit.Algorithm).HasState() && h.Limit.BlockFor == 0 {
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

// step is algo.Step, or algo.Overdraw for TakeEach.
func step(each bool, p *algo.Params, st algo.State, now, n int64) (algo.State, algo.Result) {
	if each {
		return algo.Overdraw(p, st, now, n)
	}
	return algo.Step(p, st, now, n)
}
