// Package sluice holds the vocabulary of the sluice rate limiter: what to
// enforce (Limit), the answer (Decision), the one storage seam (Store) and the
// Limiter that decides all limits of a request together.
//
// A request may match several limits. They are decided together and
// all-or-nothing: if any limit denies, none of them is consumed, so a request
// rejected by a per-second limit does not burn its per-day quota.
//
// Most callers want [Limiter.Allow] for one limit, or [Limiter.Decide] for
// several limits at once, over the embedded store:
//
//	lim := sluice.NewLimiter(memstore.New(memstore.Config{}))
//	d, err := lim.Allow(ctx, "login:"+user, &sluice.Limit{
//		Algorithm: sluice.TokenBucket, Rate: 1, Period: time.Hour, Burst: 10,
//	})
//
// A denial is a Decision with Allowed false, never an error; an error means
// the store failed.
//
// # Using the limiter
//
// Callers need [Limit], [Limiter] ([NewLimiter], [Limiter.Allow],
// [Limiter.AllowN], [Limiter.Decide] with [Hit]s), [Decision] and a store
// from a package of its own (memstore, redisstore). [ReasonOf] tells why a
// store failed.
//
// # Implementing a Store
//
// A store implements [Store] (and may implement [OneTaker] as a fast path
// for a single hit): it applies [Hit]s atomically under the rules listed
// on Store, owns the clock, and turns each algorithm's result into a
// Decision with [Limit.Params] (the parameters the algo package takes) and
// [Limit.DecisionOf] (the decision against the configured limit); a key
// serving a block_for penalty answers [Decision.BlockedFor]. It validates
// its input with [ValidateHits], returns [StoreError] with a [FailReason]
// when it cannot decide (and wraps [ErrNeverConnected] in its health while
// it has never reached its backend), and proves itself with the storetest
// package's suite, which every store passes.
//
// This package imports only the algo package and the standard library; the
// stores, the rules and the transports import it, never the other way round.
package sluice
