package storeerr_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/vocab/storeerr"
)

func TestReason(t *testing.T) {
	timeout := &sluice.StoreError{Reason: sluice.FailTimeout, Err: context.DeadlineExceeded}
	for _, c := range []struct {
		err  error
		want sluice.FailReason
	}{
		{nil, sluice.FailError},
		{errors.New("plain"), sluice.FailError},
		{timeout, sluice.FailTimeout},
		{fmt.Errorf("wrapped: %w", timeout), sluice.FailTimeout},
		{errors.Join(errors.New("other"), fmt.Errorf("x: %w", &sluice.StoreError{Reason: sluice.FailOverload, Err: errors.New("shed")})), sluice.FailOverload},
		{fmt.Errorf("two: %w %w", errors.New("a"), &sluice.StoreError{Reason: sluice.FailUnreachable, Err: errors.New("b")}), sluice.FailUnreachable},
	} {
		if got := storeerr.Reason(c.err); got != c.want {
			t.Errorf("Reason(%v) = %s, want %s", c.err, got, c.want)
		}
	}
	if !errors.Is(fmt.Errorf("w: %w", timeout), context.DeadlineExceeded) {
		t.Error("a StoreError does not unwrap to its error")
	}
	var names []string
	for _, r := range []sluice.FailReason{sluice.FailError, sluice.FailOverload, sluice.FailTimeout, sluice.FailBreakerOpen, sluice.FailUnreachable} {
		names = append(names, r.String())
	}
	if got := fmt.Sprint(names); got != "[error overload timeout breaker_open unreachable]" {
		t.Errorf("reason names %s", got)
	}
}
