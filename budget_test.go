package sluice_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
)

// TestBudgetWait checks the blocking side of the third-party budget recipe
// (docs/recipes.md): callers past the burst wait their turn, 500ms apart,
// and a caller whose deadline comes first fails at once.
func TestBudgetWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New(memstore.Config{}) // time.Now: the bubble's clock
		defer store.Close()
		b, err := newBudget(sluice.NewLimiter(store), rulestest.Config(t, budgetRules), "geocoder")
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		start := time.Now()
		for i := range 40 {
			if err := b.wait(ctx); err != nil {
				t.Fatalf("call %d: %v", i+1, err)
			}
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("the burst of 40 waited %v", d)
		}

		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		if err := b.wait(short); !errors.Is(err, errOverBudget) {
			t.Fatalf("wait with 100ms left = %v, want errOverBudget", err)
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("failing fast took %v", d)
		}

		// Three workers at once: admitted 500ms apart, never faster.
		done := make(chan time.Duration, 3)
		for range 3 {
			go func() {
				if err := b.wait(ctx); err != nil {
					t.Error(err)
				}
				done <- time.Since(start)
			}()
		}
		for i := range 3 {
			if got, want := <-done, time.Duration(i+1)*500*time.Millisecond; got != want {
				t.Errorf("worker %d admitted after %v, want %v", i+1, got, want)
			}
		}
	})
}
