package main

import (
	"context"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
)

// regionStore is a region's store: a memstore on the virtual clock, which
// its nodes' regions.Store wrap, and which the simulation reads to know
// what the region holds. Like Redis's settlements (and unlike a memstore,
// which has no reply to lose), it applies a settlement ID once, so that
// the region's nodes charge a window once between them.
type regionStore struct {
	*memstore.Store
	sim    *sim
	limit  *sluice.Limit
	region int

	w       int64 // the window id of what follows
	spent   int64 // hits spent on the counter in w: admitted, and given back
	charged bool  // the counter was charged in w
	applied map[uint64]bool

	// nospend: a give-back is not spent first (broken, for the tests).
	nospend bool
}

func (r *regionStore) window() {
	if w := r.sim.windowOf(r.sim.now); w != r.w {
		r.w, r.spent, r.charged = w, 0, false
	}
}

// Take implements sluice.Store, counting what is spent on the counter.
func (r *regionStore) Take(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	r.window()
	if r.nospend && len(hits) == 1 && hits[0].Cost > 1 && hits[0].Limit.Rate == r.limit.Rate {
		// A give-back's take, answered as if spent, but not spent.
		h := hits[0]
		h.Cost = 0
		if err := r.Store.Take(ctx, []sluice.Hit{h}, out); err != nil {
			return err
		}
		out[0].Allowed = out[0].Remaining >= hits[0].Cost
		if out[0].Allowed {
			out[0].Remaining -= hits[0].Cost
		}
		return nil
	}
	if err := r.Store.Take(ctx, hits, out); err != nil {
		return err
	}
	for i := range hits {
		if hits[i].Limit.Rate == r.limit.Rate && out[i].Allowed {
			r.spent += hits[i].Cost
		}
	}
	return nil
}

// Settle implements the settlements the real code charges and refunds
// with, each ID once.
func (r *regionStore) Settle(ctx context.Context, st *sluice.Settlement) (int64, error) {
	r.window()
	if st.ID != 0 && r.applied[st.ID] {
		return 0, nil
	}
	moved, err := r.Store.Settle(ctx, st)
	if err != nil {
		return moved, err
	}
	if st.ID != 0 {
		r.applied[st.ID] = true
	}
	if st.Spent > 0 && r.sim.windowID(st.At.UnixNano()) == r.w {
		r.charged = true
	}
	return moved, nil
}

// held is what the region holds of its allocation in the current window,
// spent to give back excluded (a_r less what it spent): its safe share
// until the counter is charged, then what the counter has left and what
// the region admitted.
func (r *regionStore) held(admitted, safe int64) int64 {
	r.window()
	if !r.charged {
		return safe
	}
	var out [1]sluice.Decision
	if err := r.Store.Take(context.Background(), []sluice.Hit{{Key: key, Limit: r.limit}}, out[:]); err != nil {
		return safe
	}
	return out[0].Remaining + admitted
}
