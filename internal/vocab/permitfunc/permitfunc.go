// Package permitfunc lets the decision core make a sluice.Permit of
// permits that another service holds: those a remote sluice serve took
// for a request that sluice proxy (--store remote) passes on, which the
// proxy gives back with a call of its own when the request ends. The
// front doors keep the one handle they keep for every request's permits,
// decide.Outcome.Permit, and know nothing of where the permits are.
//
// The root package sets New when it is initialised (it cannot be
// imported from here: it imports this package), so that nothing is
// exported for it (the API is at its cap). It is internal, as
// internal/vocab/permittrace is. This package imports only the standard
// library.
package permitfunc

import "context"

// New, set by the root package, returns a *sluice.Permit (as an any: this
// package cannot name it) of n permits held elsewhere, after telling the
// permittrace.Trace of ctx, if any, that n were acquired. Its Release
// calls release, once it has succeeded no more, and tells the Trace of
// the context it is given as a Release does; its Keep renews nothing and
// never cancels; its Renew fails (nothing can renew such permits: they
// expire a TTL after they were taken unless released). n is at least 1.
var New func(ctx context.Context, n int, release func(context.Context) error) any
