package sluice_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
)

// One report export at a time per customer: a Concurrency limit of 1.
// Over redisstore, the same holds across every node.
func ExampleLimiter_Hold() {
	lim := sluice.NewLimiter(memstore.New(memstore.Config{SweepInterval: -1}))
	exports := &sluice.Limit{Algorithm: sluice.Concurrency, Rate: 1, Period: time.Minute}
	ctx := context.Background()
	d, err := lim.Hold(ctx, "customer-42", exports, func(ctx context.Context) error {
		// While this export runs, another for the same customer is denied.
		_, d, _ := lim.Acquire(ctx, []sluice.Hit{{Key: "customer-42", Limit: exports, Cost: 1}}, nil)
		fmt.Println("a second export:", d.Allowed)
		return nil
	})
	fmt.Println("the export ran:", d.Allowed, err)

	p, _, _ := lim.Acquire(ctx, []sluice.Hit{{Key: "customer-42", Limit: exports, Cost: 1}}, nil)
	fmt.Println("after it, a permit:", p != nil)
	fmt.Println(p.Release(ctx), p.Release(ctx))
	// Output:
	// a second export: false
	// the export ran: true <nil>
	// after it, a permit: true
	// <nil> <nil>
}
