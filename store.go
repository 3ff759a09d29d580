package sluice

import "context"

// Store applies hits to their keys atomically. It is the one seam between
// the limiter and where state lives (memstore, redisstore).
//
// Take decides hits together and writes the decision of hits[i] to out[i]
// (len(out) >= len(hits)). The contract, which storetest checks for every
// store:
//
//   - The request is allowed when every hit whose limit is not in shadow
//     mode allows it.
//   - If the request is allowed, every hit that allows is consumed (a
//     shadow hit that would deny is not); if it is denied, no hit is
//     consumed, except that a denying limit with BlockFor starts its block.
//   - Each decision describes the state after the request: in a denied
//     request, a hit that would have allowed reports its Remaining as it
//     stands, since nothing was consumed.
//   - Hits of cost 0 consume nothing.
//   - Different limits given the same key string keep separate state,
//     but for Concurrency limits: the permits of a key are one set
//     whatever the limit's Rate and Period (each permit carries its own
//     expiry), so that the permits held stay counted when they change.
//   - Hits on the same key are applied in order, each seeing the previous.
//   - The store owns the clock: memstore reads its Now field, redisstore
//     asks Redis.
//   - A Concurrency hit (algo.PermitStep) first drops its key's expired
//     permits (expiry at or before the store's now), then allows when its
//     Permit is already held or fewer than Rate permits are held. If the
//     request is allowed, the permit is held with an expiry of now +
//     Period (rounded up to a whole millisecond; a permit already held
//     is refreshed, never shortened, and counts once); if any hit
//     denies, it is not added, exactly as the other hits are not
//     consumed, and a denied permit leaves the rates unconsumed.
//     A shadow Concurrency hit that would deny adds nothing. Its
//     decision: Limit = Rate, Remaining = Rate less the permits held
//     after the request, ResetAfter = the time until the earliest expiry
//     among the permits it found and its own (0 when none is held),
//     RetryAfter on a denial = the time until the earliest held permit
//     expires (an upper bound, since a holder may release sooner; never
//     0). A peek (cost 0) changes nothing.
//
// An error means the store failed and says nothing of the limits; out is
// then undefined. Callers validate hits first (Limiter does); a store may
// assume valid input.
type Store interface {
	Take(ctx context.Context, hits []Hit, out []Decision) error
}

// eachTaker is an optional method set of a Store, TakeEach: hits decided
// one by one, as envoyproxy/ratelimit counts a request's descriptors,
// instead of all or nothing. Limiter.TakeEach uses it. The contract, which
// storetest checks for every store that has it:
//
//   - Hits are decided in order, each on the state the previous ones left.
//   - A hit that allows is consumed, whatever the others decide.
//   - A hit that denies is consumed all the same when it finds its limit
//     not exhausted (a hit of cost 1 would be allowed): past the limit, as
//     a debt that later hits see, peeks included, until time repays it
//     (algo.Overdraw; for sliding logs and sketches algo.Overdraws). Its
//     decision is a denial with Overdrawn set. So is a hit that finds its
//     limit exhausted but not in debt, where the limit charges an
//     exhausted one (algo.Params.ChargesExhausted: a fixed window, or a
//     Limit with Debit; algo.OverdrawsExhausted). A hit that finds its
//     limit in debt consumes nothing: a denied client never digs itself a
//     deeper hole.
//   - A denial starts its limit's BlockFor; a hit in a block consumes
//     nothing.
//   - A shadow limit is decided and consumed the same way; only the
//     request's overall answer ignores it.
//   - A Concurrency hit is decided by itself, as in Take, and holds its
//     permit when it allows: no debt, no overdraw.
//
// The other clauses of Take (cost 0, separate state per limit, the clock)
// hold as well.
type eachTaker interface {
	TakeEach(ctx context.Context, hits []Hit, out []Decision) error
}

// oneTaker is an optional method set of a Store: TakeOne, Take for a
// single hit. Limiter.Allow and AllowN use it when the store has it, which
// spares them the one-element slices that would escape to the heap through
// Take. It must behave exactly as Take with one hit.
type oneTaker interface {
	TakeOne(ctx context.Context, hit Hit) (Decision, error)
}

// permitStore is an optional method set of a Store, Permits(ctx, hits,
// out, release): it releases the permits of hits (release true) or renews
// them, for the permits of Concurrency hits (Limiter.Acquire, Permit). A store
// without it cannot give permits back, and Limiter.Acquire refuses to
// take them from it. The contract, which storetest checks for every store
// that has it:
//
//   - Release removes each hit's permit, named by its Key, its Limit and
//     its Permit ID, whatever its Cost. It is idempotent: releasing a
//     permit twice, an expired one or one never acquired is harmless,
//     not an error. When out is not nil (len(out) >= len(hits)), out[i]
//     says whether it removed one: allowed when the key held the permit
//     at the store's now, denied (RetryAfter Never) when it held none by
//     that ID; Remaining and ResetAfter are not reported (0).
//   - Renew (out not nil) extends each hit's permit, if its key still holds it at the
//     store's now, to an expiry of now + Period (never shortening it),
//     and writes a Decision to out[i] (len(out) >= len(hits)) as a
//     Concurrency hit's, allowed. A permit no longer held (expired,
//     released, or lost by the store) is acquired again, in the same
//     atomic step as an acquisition checks the capacity, when fewer than
//     Rate permits are held: it is held with a fresh expiry and its
//     decision is allowed, so a store that lost its permits counts their
//     holders again. Without room it is lost, and NOT added (its holder
//     may have run past its expiry while another took the slot): its
//     decision is denied, with RetryAfter Never. A hit of Cost 1 is a
//     hand-over (the local failure policy's permit given to the store
//     when it answers again: its holder was admitted within the nodes'
//     shares): held, renewed or added, whatever the room; only a zero
//     Period loses it.
//   - Both drop the expired permits of the keys they touch first, as
//     Take does (a permit released after its expiry was not held); the store owns the clock, as for Take. The hits need
//     not share a key and are applied in order, each on its own (not
//     all or nothing).
//
// An error means the store failed: some of the hits may have been applied.
// Callers validate hits first (Limiter does): Concurrency limits, with a
// non-empty Permit.
type permitStore interface {
	Permits(ctx context.Context, hits []Hit, out []Decision, release bool) error
}

// A Store may say whether it is currently able to decide, for readiness
// and metrics, with a method Health() error: nil when it is, else why not
// (the Redis store: its circuit breaker is open, its last calls failed).
// Health must be cheap and do no I/O: it reports the store's last known
// state. A store without it is taken to be always able; a store that wraps
// another (lease, localcache) reports the other's.
