package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/vocab/limits"
)

// Permits releases the permits of hits (release true) or renews them,
// and writes their decisions to out, which may be nil for a release (the
// permits of Concurrency limits: see sluice.Store). One script call per
// Cluster slot. Errors are *fault.StoreError.
func (s *Store) Permits(ctx context.Context, hits []sluice.Hit, out []sluice.Decision, release bool) error {
	if release {
		return s.release(ctx, hits, out)
	}
	return s.renew(ctx, hits, out)
}

// release removes the permit of each hit (its Key, Limit and Permit),
// held or not, and writes to out (if not nil) whether it was held, what
// ZREM counted (Permits), in one script call ("x") per Cluster slot (one
// on a standalone or Sentinel server), through the store's gate and
// breaker as a Take. ctx bounds only the wait for a slot among the calls
// in flight (see Take). Errors are *fault.StoreError.
func (s *Store) release(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	return s.permits(ctx, hits, out, "x")
}

// renew extends the permit of each hit, if still held, to a Period from
// Redis's now, and writes its decision to out (Permits): a permit no
// longer held is held again if its key has room (algo.permit_renew),
// else lost and denied; a hit of Cost 1 is handed over, held whatever
// the room. One script call ("n", or "h" for the hand-overs) per Cluster
// slot, as release; the hand-overs first when a call mixes both.
func (s *Store) renew(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	if len(out) < len(hits) {
		return fmt.Errorf("redisstore: %d decisions for %d hits", len(out), len(hits))
	}
	hand := 0
	for i := range hits {
		if hits[i].Cost == 1 {
			hand++
		}
	}
	switch hand {
	case 0:
		return s.permits(ctx, hits, out, "n")
	case len(hits):
		return s.permits(ctx, hits, out, "h")
	}
	// Mixed (no caller of this package's makes such a call): each kind
	// in its own call, the decisions put back in the hits' order.
	var sets [2][]int
	for i := range hits {
		k := 0
		if hits[i].Cost == 1 {
			k = 1
		}
		sets[k] = append(sets[k], i)
	}
	for k, mode := range [2]string{"h", "n"} {
		idx := sets[1-k]
		sub, subOut := make([]sluice.Hit, len(idx)), make([]sluice.Decision, len(idx))
		for j, i := range idx {
			sub[j] = hits[i]
		}
		if err := s.permits(ctx, sub, subOut, mode); err != nil {
			return err
		}
		for j, i := range idx {
			out[i] = subOut[j]
		}
	}
	return nil
}

// permits releases (mode "x"), renews (mode "n") or hands over (mode
// "h") the permits of hits, writing their decisions to out (for a
// release, if not nil).
func (s *Store) permits(ctx context.Context, hits []sluice.Hit, out []sluice.Decision, mode string) error {
	if err := ctx.Err(); err != nil && mode != "x" {
		return err
	}
	if len(hits) == 0 {
		return nil
	}
	return s.guarded(ctx, func(c *conn) error {
		ops := make([]op, len(hits))
		var kb [128]byte
		k := keyer{prefix: s.cfg.Prefix, tag: s.tag, buf: kb[:0]}
		for i := range hits {
			o := &ops[i]
			o.p = limits.Params(hits[i].Limit)
			o.state = k.stateKey(&hits[i], &o.p)
			if c.cluster {
				o.slot = slotOf(o.state)
			}
		}
		groups := groupBySlot(c, ops)
		head := mode + " "
		now := ""
		if s.now != nil {
			now = " " + strconv.FormatInt(s.now().UnixNano(), 10)
		}
		for _, g := range groups {
			g.keys = g.keys[:0]
			g.args = append(g.args[:0], head+strconv.Itoa(len(g.idx))+now)
			for _, i := range g.idx {
				g.keys = append(g.keys, ops[i].state)
				g.args = append(g.args, specOf(hits[i].Limit, &ops[i].p), hits[i].Permit)
			}
		}
		s.runPermits(c, groups)
		for _, g := range groups {
			if g.err != nil {
				return g.err
			}
			if out == nil {
				continue
			}
			if mode == "x" {
				// "held [dropped]": held is what ZREM removed, 1 or 0.
				for j, i := range g.idx {
					out[i] = limits.Released(hits[i].Limit, &ops[i].p, g.res[j].v[0] == 1)
				}
				continue
			}
			for j, i := range g.idx {
				out[i] = decision(&hits[i], &ops[i].p, g.res[j])
			}
		}
		return nil
	})
}

// runPermits makes the calls of groups, in parallel when there are
// several; each gets its answer, one a hit (a renewal's as a take's; a
// release's is "held [dropped]": held in v[0], and dropped), or its
// error.
func (s *Store) runPermits(c *conn, groups []*group) {
	exec := func(g *group) {
		s.metrics.fcalls.Add(1)
		arr, err := s.fcall(s.ctx, c, fnName, g.keys, g.args).AsStrSlice()
		if err == nil && len(arr) != len(g.idx) {
			err = fmt.Errorf("script returned %d values for %d permits", len(arr), len(g.idx))
		}
		res := make([]answer, len(arr))
		for i := 0; err == nil && i < len(arr); i++ {
			if g.args[0][0] != 'x' {
				res[i], err = parseAnswer(arr[i])
				continue
			}
			// "held [dropped]": held (1 or 0) is kept in v[0].
			h, d, _ := strings.Cut(arr[i], " ")
			if h == "1" {
				res[i].v[0] = 1
			}
			if d != "" {
				res[i].dropped, err = strconv.ParseInt(d, 10, 64)
			}
		}
		if err == nil {
			s.metrics.countExpired(res)
		} else {
			res = nil
		}
		g.res, g.err = res, err
	}
	if len(groups) == 1 {
		exec(groups[0])
		return
	}
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() { exec(g) })
	}
	wg.Wait()
}
