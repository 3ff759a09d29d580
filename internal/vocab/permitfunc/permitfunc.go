// Package permitfunc lets the decision core make a sluice.Permit of
// permits that another service holds: those a remote sluice serve took
// for a request that sluice proxy (--store remote) passes on, which the
// proxy gives back with a call of its own when the request ends. The
// front doors keep the one handle they keep for every request's permits,
// decide.Outcome.Permit, and know nothing of where the permits are.
//
// It also lets the decision core hand the local failure policy's permits
// to the store when the store answers again (HandOver, Released).
//
// The root package sets the functions when it is initialised (it cannot be
// imported from here: it imports this package), so that nothing is
// exported for it (the API is at its cap). It is internal, as
// internal/vocab/permittrace is. This package imports only the standard
// library.
package permitfunc

import (
	"context"
	"time"
)

// New, set by the root package, returns a *sluice.Permit (as an any: this
// package cannot name it) of n permits held elsewhere, after telling the
// permittrace.Trace of ctx, if any, that n were acquired. Its Release
// calls release, once it has succeeded no more, and tells the Trace of
// the context it is given as a Release does; its Keep renews nothing and
// never cancels; its Renew fails (nothing can renew such permits: they
// expire a TTL after they were taken unless released). n is at least 1.
var New func(ctx context.Context, n int, release func(context.Context) error) any

// HandOver, set by the root package, moves the permits of p, a
// *sluice.Permit acquired in the node's own store by the local failure
// policy, to the store of to, a *sluice.Limiter: each is renewed there as
// a hand-over (held whatever the room: its holder was admitted within the
// nodes' shares), its permit i (in the order in which p holds them: the
// acquiring hits that were allowed) under keys[i] and limits[i] (a
// *sluice.Limit); then released in the node's store; and from then on p
// renews and releases them in to. It reports false, changing nothing,
// when p was released, or is not a Permit of its own store. An error is
// to's store's: p then stays as it was.
var HandOver func(ctx context.Context, p, to any, keys []string, limits []any) (moved bool, err error)

// Released, set by the root package, reports whether p, a
// *sluice.Permit, was released.
var Released func(p any) bool

// Mirror, set by the root package, holds copies of the permits of p, a
// *sluice.Permit its store granted, in node, a *sluice.Limiter (the
// local failure policy's): its permit i under keys[i] and limits[i] (a
// *sluice.Limit), whatever the room there, renewed and released with p's
// from then on, so that the node's share counts the holders the store
// admitted if the store fails while they run. It does nothing when p was
// released or holds copies already.
var Mirror func(ctx context.Context, p, node any, keys []string, limits []any) error

// Rehold, set by the root package, holds the permits of each ps[i], a
// *sluice.Permit of the store of its Limiter (granted there, or handed
// over to it), in that store again, whatever the room, until left[i] from
// now: a store that restarted empty had forgotten them, and one that did
// not keeps them that long. It is for the permits that a front door
// releases by token (sluice serve), which nothing else renews. Permits
// released, or held elsewhere, are passed over. An error is the store's;
// the permits of the calls before it are held.
var Rehold func(ctx context.Context, ps []any, left []time.Duration) error
