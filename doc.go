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
// This package imports only the algo package and the standard library; the
// stores, the rules and the transports import it, never the other way round.
package sluice
