package localcache

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice"
)

// settler is the method set of a store that settles reservations
// (sluice.Limiter.Settle).
type settler interface {
	Settle(ctx context.Context, s *sluice.Settlement) (int64, error)
}

// Settle settles a reservation (sluice.Limiter.Settle) in the wrapped
// store, and fails with an error wrapping errors.ErrUnsupported when that
// store has no Settle method. When the settlement refunded hits, or failed
// (a failure may come after the store applied it), the cache drops what it
// holds for the hit's key and limit, so that a denial learnt before the
// refund is not answered after it. A charge keeps the entry: the key can
// only be further over its limit.
func (s *Store) Settle(ctx context.Context, st *sluice.Settlement) (int64, error) {
	next, ok := s.next.(settler)
	if !ok {
		return 0, fmt.Errorf("%w: the store under the cache has no Settle method", errors.ErrUnsupported)
	}
	moved, err := next.Settle(ctx, st)
	if moved < 0 || err != nil {
		s.forget(s.identity(&st.Hit))
	}
	return moved, err
}
