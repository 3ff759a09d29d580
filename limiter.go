package sluice

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Limiter decides requests against a Store. It validates its input, so
// that a store never sees a negative cost or an oversized key. It is safe for
// concurrent use.
type Limiter struct {
	store   Store
	one     oneTaker    // the store, if it takes single hits directly
	each    eachTaker   // the store, if it decides hits one by one
	permits permitStore // the store, if it releases and renews permits
}

// NewLimiter returns a Limiter over store.
func NewLimiter(store Store) *Limiter {
	one, _ := store.(oneTaker)
	each, _ := store.(eachTaker)
	permits, _ := store.(permitStore)
	for s := store; permits != nil; {
		// A store that wraps another (Unwrap) passes permits down: the
		// store at the bottom must keep them.
		u, ok := s.(interface{ Unwrap() Store })
		if !ok {
			break
		}
		s = u.Unwrap()
		if _, ok := s.(permitStore); !ok {
			permits = nil
		}
	}
	return &Limiter{store: store, one: one, each: each, permits: permits}
}

// Allow is shorthand for AllowN(ctx, key, limit, 1). Most callers want it.
func (l *Limiter) Allow(ctx context.Context, key string, limit *Limit) (Decision, error) {
	return l.AllowN(ctx, key, limit, 1)
}

// AllowN applies cost n of limit to key and returns the decision. n = 0
// peeks without consuming.
func (l *Limiter) AllowN(ctx context.Context, key string, limit *Limit, n int64) (Decision, error) {
	return l.allow(ctx, Hit{Key: key, Limit: limit, Cost: n})
}

// allow decides the one hit h.
func (l *Limiter) allow(ctx context.Context, h Hit) (Decision, error) {
	limit := h.Limit
	if err := validateHit(0, &h); err != nil {
		return Decision{}, err
	}
	if l.one != nil {
		d, err := l.one.TakeOne(ctx, h)
		if err != nil {
			return Decision{}, err
		}
		return overallOne(limit, d), nil
	}
	// The one-element slices escape through the Store interface; pooling
	// them keeps Allow free of allocations.
	b := oneHitPool.Get().(*oneHit)
	b.hits[0] = h
	err := l.store.Take(ctx, b.hits[:], b.out[:])
	d := b.out[0]
	b.hits[0] = Hit{}
	oneHitPool.Put(b)
	if err != nil {
		return Decision{}, err
	}
	return overallOne(limit, d), nil
}

// overallOne is Overall for a single hit.
func overallOne(limit *Limit, d Decision) Decision {
	d.Index = 0
	if !d.Allowed && limit.Shadow {
		d.Allowed, d.RetryAfter, d.Shadow = true, 0, true
	}
	return d
}

type oneHit struct {
	hits [1]Hit
	out  [1]Decision
}

var oneHitPool = sync.Pool{New: func() any { return new(oneHit) }}

// Take applies all hits together, all-or-nothing, writes the decision of
// each hit into out (which must have at least len(hits) elements), and
// returns the overall decision (Overall). It does not allocate. Most
// callers with one limit want Allow.
func (l *Limiter) Take(ctx context.Context, hits []Hit, out []Decision) (Decision, error) {
	return l.decide(ctx, hits, out, l.store.Take)
}

// decide validates hits and out, has take decide them, and combines the
// decisions.
func (l *Limiter) decide(ctx context.Context, hits []Hit, out []Decision, take func(context.Context, []Hit, []Decision) error) (Decision, error) {
	if err := validateHits(hits); err != nil {
		return Decision{}, err
	}
	if len(out) < len(hits) {
		return Decision{}, fmt.Errorf("sluice: %d decisions for %d hits", len(out), len(hits))
	}
	if len(hits) == 0 {
		return Decision{Allowed: true, Index: -1}, nil
	}
	out = out[:len(hits)]
	if err := take(ctx, hits, out); err != nil {
		return Decision{}, err
	}
	return Overall(hits, out), nil
}

// TakeEach is Take with each hit decided on its own, as
// envoyproxy/ratelimit counts a request's descriptors: a hit that allows
// is consumed even when another denies the request, and a denied hit that
// finds its limit not exhausted is consumed past the limit, a debt (see
// Store). The overall decision is Overall's, as for Take. A store
// without TakeEach decides each hit with a Take of its own, in order: the
// same, except that nothing is overdrawn.
func (l *Limiter) TakeEach(ctx context.Context, hits []Hit, out []Decision) (Decision, error) {
	if l.each != nil {
		return l.decide(ctx, hits, out, l.each.TakeEach)
	}
	return l.decide(ctx, hits, out, l.takeEach)
}

// takeEach is TakeEach for a store without it: a Take a hit, in order.
func (l *Limiter) takeEach(ctx context.Context, hits []Hit, out []Decision) error {
	for i := range hits {
		if err := l.store.Take(ctx, hits[i:i+1], out[i:i+1]); err != nil {
			return err
		}
	}
	return nil
}

// ErrInvalid wraps every input error of the Limiter, so that transports can
// tell bad requests (errors.Is(err, ErrInvalid)) from store failures.
var ErrInvalid = errors.New("invalid request")

// validateHits reports the first problem with hits, wrapping ErrInvalid.
func validateHits(hits []Hit) error {
	if len(hits) > MaxHits {
		return fmt.Errorf("%w: %d limits in one request (at most %d)", ErrInvalid, len(hits), MaxHits)
	}
	for i := range hits {
		if err := validateHit(i, &hits[i]); err != nil {
			return err
		}
	}
	return nil
}

func validateHit(i int, h *Hit) error {
	switch {
	case h.Limit == nil:
		return fmt.Errorf("%w: hit %d has no limit", ErrInvalid, i)
	case len(h.Key) > MaxKeyLen:
		return fmt.Errorf("%w: key of %d bytes (at most %d)", ErrInvalid, len(h.Key), MaxKeyLen)
	case h.Cost < 0:
		return fmt.Errorf("%w: negative cost %d", ErrInvalid, h.Cost)
	case h.Cost > MaxCost:
		return fmt.Errorf("%w: cost %d is too large (at most %d)", ErrInvalid, h.Cost, int64(MaxCost))
	}
	if h.Limit.Algorithm == Concurrency {
		if err := validatePermit(h, h.Cost); err != nil {
			return err
		}
	}
	if h.Limit.plain() {
		return nil
	}
	if err := h.Limit.Validate(); err != nil {
		return fmt.Errorf("%w: limit %q: %v", ErrInvalid, h.Limit.Name, err)
	}
	return nil
}

// maxPermitLen bounds the bytes of a permit's ID (Hit.Permit).
const maxPermitLen = 64

// validatePermit checks the cost and the permit of h, a Concurrency hit:
// a cost of 0, or 1 with a permit ID (cost -1: a release or a renewal,
// which needs the ID).
func validatePermit(h *Hit, cost int64) error {
	switch {
	case cost > 1:
		return fmt.Errorf("%w: a concurrency hit costs 0 (a peek) or 1 (a permit), not %d", ErrInvalid, cost)
	case cost != 0 && h.Permit == "":
		return fmt.Errorf("%w: a concurrency hit of cost 1 needs a permit ID (Hit.Permit)", ErrInvalid)
	case len(h.Permit) > maxPermitLen:
		return fmt.Errorf("%w: a permit ID of %d bytes (at most %d)", ErrInvalid, len(h.Permit), maxPermitLen)
	}
	return nil
}

// Overall combines per-hit decisions into the decision of the request: the
// denying (non-shadow) hit with the longest RetryAfter, or when every hit
// allows, the hit with the least Remaining. Shadow is set when any shadow
// hit would have denied. When every hit is a shadow hit that would deny, the
// request is allowed and reported against the first hit.
func Overall(hits []Hit, out []Decision) Decision {
	best := -1
	allowed := true
	shadow := false
	for i := range out[:len(hits)] {
		d := &out[i]
		d.Index = i
		if !d.Allowed && hits[i].Limit.Shadow {
			shadow = true
			d.Shadow = true
			continue
		}
		switch {
		case !d.Allowed:
			if allowed || d.RetryAfter > out[best].RetryAfter {
				best = i
			}
			allowed = false
		case allowed && (best < 0 || d.Remaining < out[best].Remaining):
			best = i
		}
	}
	if len(hits) == 0 {
		return Decision{Allowed: true, Index: -1}
	}
	if best < 0 {
		// Only shadow hits, all of which would deny: the request passes,
		// reported against the first of them.
		d := out[0]
		d.Allowed, d.RetryAfter = true, 0
		return d
	}
	d := out[best]
	d.Shadow = shadow
	return d
}
