package sluice

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/base/algo"
)

// Settlement settles a reservation: a hit taken before its real cost was
// known (the tokens of an LLM's answer), with its cost an estimate, and
// settled once the real cost is known (Limiter.Settle).
type Settlement struct {
	// Hit is the reservation as it was taken: its Key, its Limit and, as
	// Cost, the hits reserved.
	Hit Hit

	// Spent is the real cost, 0 <= Spent <= MaxCost.
	Spent int64

	// ResetAfter is the ResetAfter the store reported for the hit when it
	// took it.
	ResetAfter time.Duration

	// At is a time at or before the store took the reservation, on the
	// store's clock (memstore: its Now; Redis: its TIME), and less than
	// one Period of the limit before it. A later At refunds more than the
	// reservation still holds; an earlier one, less.
	At time.Time

	// ID identifies the settlement, nonzero: a store that may receive it
	// twice (a retry after a lost reply) applies it once.
	ID uint64
}

// Settle settles s, a reservation the store admitted, exactly once: it
// charges what was spent beyond the reservation (Spent − Cost), past the
// limit if need be, as a debt later hits see; or it refunds what was
// reserved and not spent, but only what of the reservation the limit still
// holds, so that the key never counts less than it spent. It returns the
// hits charged (> 0) or refunded (< 0). A store settles with a method
//
//	Settle(ctx context.Context, s *Settlement) (int64, error)
//
// applying algo.Settle's arithmetic to the key's state at the store's own
// clock, once per ID. A limit that cannot be settled (sliding_log, sketch,
// a sliding window of calendar periods), or a store without the method,
// gives an error wrapping errors.ErrUnsupported. The stores
// differ in what they refund after a failure or across leases: see each
// store's documentation.
func (l *Limiter) Settle(ctx context.Context, s *Settlement) (int64, error) {
	if err := validateHit(0, &s.Hit); err != nil {
		return 0, err
	}
	switch {
	case s.Spent < 0 || s.Spent > MaxCost:
		return 0, fmt.Errorf("%w: spent %d out of range (0 to %d)", ErrInvalid, s.Spent, int64(MaxCost))
	case s.ID == 0:
		return 0, fmt.Errorf("%w: a settlement needs a nonzero ID", ErrInvalid)
	}
	if s.Spent == s.Hit.Cost {
		return 0, nil
	}
	p := s.Hit.Limit.params()
	st, ok := l.store.(settler)
	switch {
	case !algo.Settles(&p):
		return 0, fmt.Errorf("%w: %s limits cannot be settled", errors.ErrUnsupported, s.Hit.Limit.Algorithm)
	case !ok:
		return 0, fmt.Errorf("%w: the store has no Settle method", errors.ErrUnsupported)
	}
	return st.Settle(ctx, s)
}

// settler is the method set of a Store that settles (Limiter.Settle).
type settler interface {
	Settle(ctx context.Context, s *Settlement) (int64, error)
}
