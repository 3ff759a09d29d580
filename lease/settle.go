package lease

import (
	"context"

	"github.com/sluicehq/sluice"
)

// Settle settles a reservation (sluice.Limiter.Settle) through the wrapped
// store's Settle, and fails with an error wrapping errors.ErrUnsupported
// when that store has none.
//
// A limit that does not lease (every decision asks the wrapped store) is
// settled there as it is. So is a leasing window (fixed_window,
// sliding_window): the key's count in the store holds the grant of the
// lease that served the reservation, in the same window, so a refund in
// the reservation's window takes back nothing the count does not hold.
//
// A leasing bucket (token_bucket, leaky_bucket, gcra) is charged in the
// store, but refunds nothing: its lease was taken from the store's bucket
// at the grant, earlier than the reservation's At, so the bucket may have
// refilled more of it than algo.Settle's bound (the reservation less what
// has refilled since At) assumes, and a refund could give back capacity
// the bucket no longer holds. What a reservation on a leasing bucket did
// not spend is lost, as a lease's unspent units are.
func (s *Store) Settle(ctx context.Context, st *sluice.Settlement) (int64, error) {
	if s.Settler != nil && st.Spent < st.Hit.Cost && leasable(&st.Hit) && !windowed(st.Hit.Limit.Algorithm) {
		return 0, nil
	}
	return s.SettleBelow(ctx, st)
}
