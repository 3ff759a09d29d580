// Package decorator holds what the stores that wrap a store (lease,
// localcache, the region tier) share: the one declaration of the optional
// methods a sluice.Store may have beside Take, and Base, the forwarding
// helper each decorator embeds.
//
// The convention of a decorator, which Base gives it:
//
//   - Unwrap returns the store below.
//   - Health is the store below's (nil when it has none).
//   - Close releases what the decorator itself holds, and does NOT close
//     the store below: whoever opened a store closes it (internal/stores/stack
//     closes every part of the stack, top first). Base's Close does nothing;
//     a decorator with work of its own to stop (the region tier's rounds)
//     declares its own.
//   - Its counters are read with a method, Stats, that returns a snapshot
//     by value.
//
// The root package sluice keeps its own unexported copies of TakeEach's,
// TakeOne's and Permits' interfaces: they are where the contract is written, and this
// package imports the root, so the root cannot import it.
//
// It imports the root package and nothing else of the module.
package decorator

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice"
)

// EachTaker is a store's TakeEach: hits decided one by one (see
// sluice.Store, and Limiter.TakeEach).
type EachTaker interface {
	TakeEach(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error
}

// OneTaker is a store's TakeOne: Take for a single hit.
type OneTaker interface {
	TakeOne(ctx context.Context, hit sluice.Hit) (sluice.Decision, error)
}

// Settler is a store that settles reservations (sluice.Limiter.Settle).
type Settler interface {
	Settle(ctx context.Context, st *sluice.Settlement) (int64, error)
}

// Permitter is a store that releases and renews the permits of
// Concurrency limits (see sluice.Store's Permits).
type Permitter interface {
	Permits(ctx context.Context, hits []sluice.Hit, out []sluice.Decision, release bool) error
}

// Healther is a store that says whether it can decide now (see sluice.Store).
type Healther interface {
	Health() error
}

// Unwrapper is a decorator: a store in front of another.
type Unwrapper interface {
	Unwrap() sluice.Store
}

// Base is the store below a decorator and its optional methods, found once
// at New. A decorator embeds it (by an unexported alias, so that the field
// stays unexported) and gets Unwrap, Health, Close and Permits from
// it: a decorator passes the permits of Concurrency limits to the store
// below untouched, as it passes their hits (none leases, caches or
// allocates them).
type Base struct {
	Next      sluice.Store
	Each      EachTaker // Next's, or nil
	One       OneTaker  // Next's, or nil
	Settler   Settler   // Next's, or nil
	Permitter Permitter // Next's, or nil
	health    Healther
	what      string
}

// New returns the Base over next; what names the decorator in errors
// ("the leases", "the cache").
func New(next sluice.Store, what string) Base {
	b := Base{Next: next, what: what}
	b.Each, _ = next.(EachTaker)
	b.One, _ = next.(OneTaker)
	b.Settler, _ = next.(Settler)
	b.Permitter, _ = next.(Permitter)
	b.health, _ = next.(Healther)
	return b
}

// Unwrap returns the store below.
func (b *Base) Unwrap() sluice.Store { return b.Next }

// Health returns the store below's Health() if it has that method, and
// nil otherwise.
func (b *Base) Health() error {
	if b.health != nil {
		return b.health.Health()
	}
	return nil
}

// Close does nothing: a decorator does not close the store below.
func (b *Base) Close() error { return nil }

// SettleBelow settles st in the store below, and fails with an error
// wrapping errors.ErrUnsupported when it has no Settle method.
func (b *Base) SettleBelow(ctx context.Context, st *sluice.Settlement) (int64, error) {
	if b.Settler == nil {
		return 0, fmt.Errorf("%w: the store under %s has no Settle method", errors.ErrUnsupported, b.what)
	}
	return b.Settler.Settle(ctx, st)
}

// Permits releases or renews the permits of hits in the store below
// (sluice.Store's Permits), and fails with an error wrapping
// errors.ErrUnsupported when it has no such method.
func (b *Base) Permits(ctx context.Context, hits []sluice.Hit, out []sluice.Decision, release bool) error {
	if b.Permitter == nil {
		return fmt.Errorf("%w: the store under %s cannot release or renew permits", errors.ErrUnsupported, b.what)
	}
	return b.Permitter.Permits(ctx, hits, out, release)
}
