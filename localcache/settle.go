package localcache

import (
	"context"

	"github.com/sluicehq/sluice"
)

// Settle settles a reservation (sluice.Limiter.Settle) in the wrapped
// store, and fails with an error wrapping errors.ErrUnsupported when that
// store has no Settle method. When the settlement refunded hits, or failed
// (a failure may come after the store applied it), the cache drops what it
// holds for the hit's key and limit, so that a denial learnt before the
// refund is not answered after it. A charge keeps the entry: the key can
// only be further over its limit.
func (s *Store) Settle(ctx context.Context, st *sluice.Settlement) (int64, error) {
	if s.Settler == nil {
		return s.SettleBelow(ctx, st)
	}
	moved, err := s.Settler.Settle(ctx, st)
	if moved < 0 || err != nil {
		s.forget(s.identity(&st.Hit))
	}
	return moved, err
}
