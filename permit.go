package sluice

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Permit is a slot of a Concurrency limit, held in the store under a
// random ID until it is released or expires (Limiter.Acquire). Its methods
// are safe for concurrent use.
type Permit struct {
	l        *Limiter
	hits     [1]Hit // the permit's hit: its Key, Limit and ID
	mu       sync.Mutex
	released atomic.Bool
}

// Acquire takes a permit of limit, a Concurrency limit, for key: it is
// held until Release, or until it expires a Period after it was acquired
// or last renewed (Renew), so that a holder that dies leaks nothing
// longer. A denial returns a nil Permit and the Decision that says why
// (RetryAfter: until the earliest permit held expires, a bound, since a
// holder may release sooner). An error means the store failed; a permit
// the store may have taken before failing expires on its own.
//
// The permit's ID is 128 random bits, made here and never shown: only
// this Permit releases or renews it. The store must be able to release
// and renew permits (memstore, redisstore and the stores that wrap them
// can); for another, Acquire fails with an error wrapping
// errors.ErrUnsupported. Most callers want Hold, which releases and
// renews for them.
func (l *Limiter) Acquire(ctx context.Context, key string, limit *Limit) (*Permit, Decision, error) {
	if limit != nil && limit.Algorithm != Concurrency {
		return nil, Decision{}, fmt.Errorf("%w: Acquire needs a concurrency limit, not %s", ErrInvalid, limit.Algorithm)
	}
	if l.permits == nil {
		return nil, Decision{}, errNoPermits
	}
	p := &Permit{l: l}
	p.hits[0] = Hit{Key: key, Limit: limit, Cost: 1, Permit: rand.Text()}
	d, err := l.allow(ctx, p.hits[0])
	if err != nil || !d.Allowed {
		return nil, d, err
	}
	return p, d, nil
}

// errNoPermits is Acquire's error for a store that cannot release
// permits.
var errNoPermits = fmt.Errorf("%w: the store cannot release or renew permits", errors.ErrUnsupported)

// Release gives the permit back, so that another may take its slot. It
// is idempotent: once it has succeeded, Release does nothing and returns
// nil, whichever goroutine calls it; after a failure (the store is down)
// it may be called again, and the permit expires on its own meanwhile.
// ctx bounds the call as it bounds a Take.
func (p *Permit) Release(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.released.Load() {
		return nil
	}
	if err := p.l.release(ctx, p.hits[:]); err != nil {
		return err
	}
	p.released.Store(true)
	return nil
}

// Renew extends the permit to a Period from the store's now. It reports
// false when the permit is held no more: it expired (its holder ran a
// Period without renewing) or was released; a lost permit is not taken
// again, for its slot may be another's now. A holder whose work outlives
// a Period renews more often than that (Hold renews every third of it).
func (p *Permit) Renew(ctx context.Context) (bool, error) {
	if p.released.Load() {
		return false, nil
	}
	var out [1]Decision
	if err := p.l.renew(ctx, p.hits[:], out[:]); err != nil {
		return false, err
	}
	return out[0].Allowed, nil
}

// Hold runs fn while it holds a permit of limit, a Concurrency limit, for
// key (Acquire). When the permit is denied, fn does not run, and Hold
// returns the denial with a nil error: check Decision.Allowed. Otherwise
// it renews the permit every third of the limit's Period while fn runs,
// and releases it when fn returns, or panics (the panic goes on after the
// release), whatever ctx says then. It returns fn's error, joined with
// the release's if that failed (the permit then expires a Period after
// its last renewal).
//
// If a renewal finds the permit lost (fn outlived its Period while the
// store could not be reached, or the store lost it), fn's context is
// cancelled, with a cause (context.Cause) that says so: another may hold
// the slot by then, and fn, if it heeds its context, stops rather than
// run beyond the limit. A renewal that fails (the store is down) cancels
// nothing: the permit may still be held, and the next renewal tries
// again. A Shadow limit's permit is renewed too, but its loss cancels
// nothing.
func (l *Limiter) Hold(ctx context.Context, key string, limit *Limit, fn func(context.Context) error) (d Decision, err error) {
	p, d, err := l.Acquire(ctx, key, limit)
	if err != nil || p == nil {
		return d, err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	stop, done := make(chan struct{}), make(chan struct{})
	go p.keep(context.WithoutCancel(ctx), cancel, renewEvery(limit.Period), !limit.Shadow, stop, done)
	defer func() {
		close(stop)
		<-done
		cancel(nil)
		if rerr := p.Release(context.WithoutCancel(ctx)); rerr != nil {
			err = errors.Join(err, fmt.Errorf("sluice: releasing the permit: %w", rerr))
		}
	}()
	return d, fn(fctx)
}

// errPermitLost is the cause with which Hold cancels fn's context when
// its permit is lost.
var errPermitLost = errors.New("sluice: the permit was lost (it expired, or the store lost it): another may hold its slot")

// renewEvery is how often Hold renews a permit of period: a third of it,
// and at least a millisecond.
func renewEvery(period time.Duration) time.Duration {
	return max(period/3, time.Millisecond)
}

// keep renews p every interval until stop is closed, then closes done. A
// renewal that finds the permit lost cancels with errPermitLost when
// enforce is set, and ends the renewals.
func (p *Permit) keep(ctx context.Context, cancel context.CancelCauseFunc, every time.Duration, enforce bool, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			held, err := p.Renew(ctx)
			if err == nil && !held {
				if enforce {
					cancel(errPermitLost)
				}
				return
			}
		}
	}
}

// release validates the permits of hits and has the store release them.
func (l *Limiter) release(ctx context.Context, hits []Hit) error {
	if err := validatePermits(hits); err != nil {
		return err
	}
	if l.permits == nil {
		return errNoPermits
	}
	return l.permits.Permits(ctx, hits, nil)
}

// renew validates the permits of hits and has the store renew them,
// writing their decisions to out.
func (l *Limiter) renew(ctx context.Context, hits []Hit, out []Decision) error {
	if err := validatePermits(hits); err != nil {
		return err
	}
	if len(out) < len(hits) || out == nil {
		return fmt.Errorf("sluice: %d decisions for %d hits", len(out), len(hits))
	}
	if l.permits == nil {
		return errNoPermits
	}
	return l.permits.Permits(ctx, hits, out)
}

// validatePermits checks hits to release or renew: Concurrency hits, with
// a permit ID.
func validatePermits(hits []Hit) error {
	if len(hits) > MaxHits {
		return fmt.Errorf("%w: %d permits in one call (at most %d)", ErrInvalid, len(hits), MaxHits)
	}
	for i := range hits {
		h := hits[i]
		if h.Limit != nil && h.Limit.Algorithm != Concurrency {
			return fmt.Errorf("%w: hit %d: a permit of a %s limit: only concurrency limits hold permits", ErrInvalid, i, h.Limit.Algorithm)
		}
		h.Cost = 0
		if err := validateHit(i, &h); err != nil {
			return err
		}
		if err := validatePermit(&h, -1); err != nil {
			return err
		}
	}
	return nil
}
