package httplimit

import (
	"context"
	"fmt"
	"net/http"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
)

// NewLimit returns the middleware for the common case in one line: every
// request limited by limit, under the key that key takes from it (the
// client's address, a header, an API key, or any KeyFunc), decided by lim,
// with the rate limit headers and a problem+json 429. A request whose key
// is absent (an empty KeyFunc value, a missing header) is not limited.
//
//	limit, err := httplimit.NewLimit(lim, &sluice.Limit{Rate: 100, Period: time.Minute}, httplimit.RemoteAddress())
//	http.ListenAndServe(":8080", limit(mux))
//
// It is New deciding that one limit itself, with no rules. For rules,
// several limits, trusted proxies, shaping or failure-only limits, use New.
// The limiter's keys are the values key takes, as they are: give each
// NewLimit of a shared store its own limit name or key prefix (a KeyFunc)
// where two must not share counters.
func NewLimit(lim *sluice.Limiter, limit *sluice.Limit, key Source) (func(http.Handler) http.Handler, error) {
	if lim == nil {
		return nil, fmt.Errorf("%w: NewLimit without a Limiter", ErrConfig)
	}
	if limit == nil {
		return nil, fmt.Errorf("%w: NewLimit without a Limit", ErrConfig)
	}
	if err := limit.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if limit.Algorithm == sluice.Concurrency {
		// Its hits would need permits, released when the response ends.
		return nil, fmt.Errorf("%w: NewLimit takes a rate, not a concurrency limit", ErrConfig)
	}
	m, err := newMiddleware(Config{
		Domain:      "httplimit",
		Descriptors: []Descriptor{{{Source: key}}},
	}, (&oneLimit{lim: lim, limit: limit}).take, nil)
	if err != nil {
		return nil, err
	}
	return m.wrap, nil
}

// oneLimit decides one limit for the one descriptor NewLimit builds, under
// the descriptor's one value.
type oneLimit struct {
	lim   *sluice.Limiter
	limit *sluice.Limit
}

// take decides r's one descriptor, under its one value.
func (d *oneLimit) take(ctx context.Context, r *decide.Request, o *decide.Outcome) error {
	o.Reset()
	descs := r.Descriptors
	if len(descs) == 0 || len(descs[0].Entries) == 0 {
		// The key is absent: nothing to limit.
		o.Overall = sluice.Decision{Allowed: true, Index: -1}
		return nil
	}
	desc := &descs[0]
	hits := [1]sluice.Hit{{Key: desc.Entries[0].Value, Limit: d.limit, Cost: desc.Cost}}
	var out [1]sluice.Decision
	overall, err := d.lim.Take(ctx, hits[:], out[:])
	if err != nil {
		return err
	}
	o.Overall = overall
	o.Limits = append(o.Limits, decide.LimitOutcome{Limit: d.limit, Decision: out[0], Cost: desc.Cost, Descriptor: 0})
	o.Descriptors = append(o.Descriptors, decide.DescriptorOutcome{
		Status: rules.Limited, StatKey: d.limit.Name, Cost: desc.Cost, Limited: true,
		Over: !overall.Allowed || overall.Shadow, ShadowOver: overall.Allowed && overall.Shadow,
		Decision: overall, Limit: d.limit,
	})
	return nil
}
