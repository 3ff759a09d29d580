// Package sluice holds the vocabulary of the sluice rate limiter: what to
// enforce (Limit), the answer (Decision), the one storage seam (Store) and the
// Limiter that decides all limits of a request together.
//
// A request may match several limits. They are decided together and
// all-or-nothing: if any limit denies, none of them is consumed, so a request
// rejected by a per-second limit does not burn its per-day quota.
//
// Most callers want [Limiter.Allow] for one limit, or [Limiter.Take] for
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
// [Limiter.AllowN], [Limiter.Take] with [Hit]s), [Decision] and a store
// from a package of its own (memstore, redisstore). package fault tells why a
// store failed.
//
// A [Concurrency] limit caps what is in flight rather than a rate: at most
// Rate permits held per key at once, across every node that shares the
// store. [Limiter.Hold] runs a function while it holds a permit;
// [Limiter.Acquire] gives a [Permit] to release (and renew) yourself.
//
// # Implementing a Store
//
// A store implements [Store] (and, optionally, TakeEach to decide hits one
// by one as envoyproxy/ratelimit counts, Settle to settle
// reservations, and Permits to release and renew permits: see Store and
// Limiter.Settle): it applies [Hit]s atomically under the
// rules listed on Store and owns the clock; it returns a fault.StoreError with a
// fault.Reason when it cannot decide (and wraps fault.ErrNeverConnected in its
// health, a Health method, while it has never reached its backend). The
// stores of this module share the algorithms' arithmetic; a store of
// another module may wrap one of them, as packages localcache and lease
// do, and proves itself with the storetest package's suite, which every
// store passes.
//
// This package imports only internal/base/algo (the arithmetic),
// internal/vocab/permittrace (how a front door of this module is told of
// permits), internal/vocab/permitfunc (how the decision core makes a
// Permit of permits a remote service holds) and the standard library; the
// stores, the rules and the transports import it, never the other way
// round.
package sluice
