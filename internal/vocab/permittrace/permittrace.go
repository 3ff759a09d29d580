// Package permittrace lets a front door be told what becomes of the
// permits of the requests it serves, in the manner of net/http/httptrace:
// a Trace put in a request's context (With) is called by the root
// package's Limiter.Acquire, Permit.Release and Permit.Renew (so also by
// Permit.Keep and Limiter.Hold) made with that context or one derived
// from it. sluice proxy counts each route's permits this way, without the
// middleware in between (httplimit) knowing of it, and tells a request
// cancelled for a lost permit (ErrLost) from one its client gave up.
//
// It is internal: a program that embeds the library counts its own calls.
// This package imports only the standard library.
package permittrace

import (
	"context"
	"errors"
)

// ErrLost is the cause (context.Cause) with which Permit.Keep, and so
// Hold, cancel the context they return when a renewal finds a permit
// lost: the store held it no more and others held every slot of its
// key.
var ErrLost = errors.New("sluice: the permit was lost: the store held it no more (it expired, or the store lost it) and others hold every slot")

// Trace is told of permits. Each function is optional and must be fast
// and safe for concurrent use; n is a number of permits (one a Concurrency
// hit), never 0 when called.
type Trace struct {
	// Acquired: an admitted Acquire took n permits.
	Acquired func(n int)
	// Denied: an Acquire was denied, n of its permits for want of a slot
	// (Shadow limits not included). A request denied by a rate alone
	// calls nothing.
	Denied func(n int)
	// Renewed: a renewal extended n permits still held, or held again
	// those the store held no more while their keys had room.
	Renewed func(n int)
	// Lost: a renewal found n permits held no more (expired, or lost by
	// the store) and their keys full; each permit is reported lost once.
	Lost func(n int)
	// Released: a Release gave back n permits, those not reported lost,
	// err its failure (nil: released). A Release that failed and is
	// called again reports again.
	Released func(n int, err error)
}

type key struct{}

// With returns ctx carrying t.
func With(ctx context.Context, t *Trace) context.Context {
	return context.WithValue(ctx, key{}, t)
}

// From returns the Trace ctx carries, or nil.
func From(ctx context.Context) *Trace {
	t, _ := ctx.Value(key{}).(*Trace)
	return t
}
