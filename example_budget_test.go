package sluice_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

// budgetRules are the limits of the calls we make to a vendor's API: its
// own limit and the daily budget we pay for (docs/recipes.md).
const budgetRules = `domain: outgoing
descriptors:
  - key: vendor
    value: geocoder
    rate_limits:
      # The vendor's limit: a bucket of 40 calls that refills 2 a second.
      - {algorithm: token_bucket, unit: second, requests_per_unit: 2, burst: 40}
      # The plan we pay for: 10,000 calls a day, from 00:00 UTC.
      - {unit: day, requests_per_unit: 10000}
`

// errOverBudget is the error of a call the vendor's limits do not admit.
var errOverBudget = errors.New("over the vendor's quota")

// budget admits calls to a vendor's API within its limits. Every process
// whose Limiter shares the store (memstore in one process, redisstore
// across many) shares the budget.
type budget struct {
	lim  *sluice.Limiter
	hits []sluice.Hit
}

// newBudget plans the vendor's limits once: the descriptor never changes.
func newBudget(lim *sluice.Limiter, cfg *rules.Config, vendor string) (*budget, error) {
	var p rules.Plan
	desc := rules.Descriptor{Entries: []rules.Entry{{Key: "vendor", Value: vendor}}, Cost: 1}
	if err := cfg.Plan("outgoing", []rules.Descriptor{desc}, &p); err != nil {
		return nil, err
	}
	if len(p.Hits) == 0 {
		return nil, fmt.Errorf("no limits for vendor %q", vendor)
	}
	return &budget{lim: lim, hits: slices.Clone(p.Hits)}, nil
}

// try takes one call from the budget, or fails fast with how long until
// the call would be admitted (sluice.Never if it never will).
func (b *budget) try(ctx context.Context) (retryAfter time.Duration, err error) {
	out := make([]sluice.Decision, len(b.hits))
	d, err := b.lim.Take(ctx, b.hits, out)
	if err != nil {
		return 0, err // the store failed
	}
	if !d.Allowed {
		return d.RetryAfter, errOverBudget
	}
	return 0, nil
}

// wait blocks until the budget admits one call, and fails fast when ctx
// would end first.
func (b *budget) wait(ctx context.Context) error {
	for {
		retry, err := b.try(ctx)
		if !errors.Is(err, errOverBudget) {
			return err
		}
		if dl, ok := ctx.Deadline(); retry == sluice.Never || ok && time.Until(dl) < retry {
			return fmt.Errorf("%w: retry in %v", errOverBudget, retry)
		}
		t := time.NewTimer(retry)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// ExampleLimiter_budget spends a day's budget of calls to a vendor as
// fast as its limits allow, on a clock that jumps to each Retry-After.
func ExampleLimiter_budget() {
	d, err := rules.Parse("outgoing.yaml", []byte(budgetRules))
	if err != nil {
		panic(err)
	}
	cfg, err := rules.NewConfig(d)
	if err != nil {
		panic(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	store := memstore.New(memstore.Config{Now: func() time.Time { return now }})
	defer store.Close()
	b, err := newBudget(sluice.NewLimiter(store), cfg, "geocoder")
	if err != nil {
		panic(err)
	}

	ctx := context.Background()
	calls := 0
	for {
		retry, err := b.try(ctx)
		if err == nil {
			calls++
			continue
		}
		if calls == 40 {
			fmt.Printf("40 calls at once, the 41st: retry in %v\n", retry)
		}
		if retry > time.Hour {
			fmt.Printf("%d calls by %s, the next: retry in %v\n", calls, now.Format("15:04:05"), retry)
			break
		}
		now = now.Add(retry)
	}
	// Output:
	// 40 calls at once, the 41st: retry in 500ms
	// 10000 calls by 01:23:00, the next: retry in 22h37m0s
}
