package regions

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
)

// Take implements sluice.Store: the global hits' windows are readied, then
// the region's store decides.
func (s *Store) Take(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	return s.take(ctx, hits, out, s.Next.Take)
}

// TakeEach decides one by one, as the region's store does.
func (s *Store) TakeEach(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	if s.Each == nil {
		return errors.New("regions: the region's store does not decide one by one")
	}
	return s.take(ctx, hits, out, s.Each.TakeEach)
}

func (s *Store) take(ctx context.Context, hits []sluice.Hit, out []sluice.Decision, take func(context.Context, []sluice.Hit, []sluice.Decision) error) error {
	global := false
	for i := range hits {
		if h := &hits[i]; h.Limit.Global {
			global = true
			if err := s.ready(ctx, h); err != nil {
				return err
			}
		}
	}
	if !global {
		return take(ctx, hits, out)
	}
	// What this node knows each global key's region has left as the
	// store is asked: an answer above it (and this node's grants since)
	// may come from counters the store lost.
	var buf [sluice.MaxHits]known
	before := buf[:0]
	s.mu.Lock()
	for i := range hits {
		var b known
		if h := &hits[i]; h.Limit.Global {
			if g := s.keys[keyOf(h)]; g != nil {
				b = known{g: g, left: s.ceiling(g), granted: g.granted}
			}
		}
		before = append(before, b)
	}
	s.mu.Unlock()
	if err := take(ctx, hits, out); err != nil {
		if ctx.Err() == nil {
			s.failed()
		}
		return err
	}
	for {
		i, g, lost := s.learn(hits, out, before)
		if g == nil {
			return nil
		}
		if !lost {
			// Above what the region can have left: its counters may
			// be lost, which the marker tells. Another node's grant
			// raises them too.
			var err error
			if lost, err = s.check(ctx, keyOf(&hits[i]), hits[i].Key, g); err != nil {
				return err
			}
		}
		if lost {
			return fmt.Errorf("%w (limit %q)", errLost, hits[i].Limit.Name)
		}
		before[i].verified = true
	}
}

// known is what a node knew of a key's region before a decision: its
// state, what it had left (Store.known), and this node's grants; verified
// once the key's marker showed an answer above it true.
type known struct {
	g             *gstate
	left, granted int64
	verified      bool
}

// learn records the decisions out of the global hits, which the store
// took while this node knew before of them: the demand, and what the
// region has left. It stops at a hit whose Remaining is above what the
// region had left and was granted since, or whose counters were found
// lost meanwhile (lost: it may have been decided on what was left of
// them), and returns it unrecorded, with its state (nil when all are
// recorded).
func (s *Store) learn(hits []sluice.Hit, out []sluice.Decision, before []known) (i int, g *gstate, lost bool) {
	now := s.cfg.Now().UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range hits {
		h, b := &hits[i], &before[i]
		g := b.g
		if !h.Limit.Global || g == nil {
			continue
		}
		rem := out[i].Remaining
		switch {
		case g.lost:
			return i, g, true
		case s.keys[keyOf(h)] != g || later(g, &out[i], now):
			continue // a new window since
		case rem > b.left+g.granted-b.granted && !b.verified:
			return i, g, false
		}
		b.g = nil
		// The least of the answers (answers to concurrent decisions come
		// in any order), but for one the marker showed true. A grant adds
		// to it (grant).
		if g.remaining < 0 || rem < g.remaining || b.verified {
			g.remaining = rem
		}
		if h.Limit.Debit {
			continue // a write-back of what the failure policy admitted
		}
		g.asked += h.Cost
		if out[i].Allowed {
			s.stats.Admitted.Add(h.Cost)
		} else {
			s.stats.Denied.Add(h.Cost)
		}
	}
	return 0, nil, false
}

func keyOf(h *sluice.Hit) gkey {
	return gkey{key: h.Key, rate: h.Limit.Rate, period: int64(h.Limit.Period)}
}

// windowOf returns the start of the window of l that holds t (Unix ns).
func windowOf(l *sluice.Limit, t int64) int64 {
	p := int64(l.Period)
	return t - t%p
}

// ready makes sure the window of h's key in which the store decides now
// holds the charge of the region's safe share: the first decision of a key
// in a window, on each node, charges it (once for the region) and waits.
// Within the clock's error of a window's end, it waits for the window to
// begin, so that the charge lands in the window it is for.
func (s *Store) ready(ctx context.Context, h *sluice.Hit) error {
	now := s.cfg.Now()
	p := int64(h.Limit.Period)
	t := now.UnixNano()
	ws := windowOf(h.Limit, t)
	margin := int64(s.cfg.Error()) + int64(5*time.Millisecond)
	if t-ws < margin {
		// Redis may still be in the window before.
		if err := s.cfg.Sleep(ctx, time.Duration(ws+margin-t)); err != nil {
			return err
		}
	} else if ws+p-t < margin {
		// Redis may be in the next window already: wait for it.
		if err := s.cfg.Sleep(ctx, time.Duration(ws+p+margin-t)); err != nil {
			return err
		}
		ws += p
	}
	k := keyOf(h)
	s.mu.Lock()
	g := s.keys[k]
	if g == nil || g.window < ws || g.window == ws && chargeFailed(g) {
		// A state per window: a charge still running for an earlier one
		// closes its own. The demand carries over from the window before:
		// a rate measured from nothing would give back, on the first
		// round, what the window will need.
		prev := g
		g = &gstate{limit: h.Limit, marker: markerOf(h.Limit), window: ws, init: make(chan struct{}), remaining: -1, born: now}
		spent := h.Limit.Rate - s.shares(h.Limit.Rate)[s.region]
		switch {
		case prev != nil && prev.window == ws:
			// The charge failed: charged again, for what the region
			// had left as far as this node knew (its safe share, or
			// after lost counters what it last learnt).
			g.carry(prev)
			spent = h.Limit.Rate - s.known(prev)
		case prev != nil && prev.window == ws-p:
			g.rate, g.memo = prev.rate, prev.memo
		}
		if prev == nil || prev.window != ws {
			g.fresh, g.blind = true, ws < s.since
		}
		s.keys[k] = g
		go s.charge(k, h.Key, g, spent)
	}
	init := g.init
	s.mu.Unlock()
	select {
	case <-init:
	case <-ctx.Done():
		return ctx.Err()
	}
	s.mu.Lock()
	err := g.initErr
	s.mu.Unlock()
	if err != nil {
		s.failed()
		return fmt.Errorf("regions: charging the region's share of %q: %w", h.Limit.Name, err)
	}
	return nil
}

// sleep waits d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
