package fault_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/sluicehq/sluice/fault"
)

func TestReason(t *testing.T) {
	timeout := &fault.StoreError{Reason: fault.Timeout, Err: context.DeadlineExceeded}
	for _, c := range []struct {
		err  error
		want fault.Reason
	}{
		{nil, fault.Error},
		{errors.New("plain"), fault.Error},
		{timeout, fault.Timeout},
		{fmt.Errorf("wrapped: %w", timeout), fault.Timeout},
		{errors.Join(errors.New("other"), fmt.Errorf("x: %w", &fault.StoreError{Reason: fault.Overload, Err: errors.New("shed")})), fault.Overload},
		{fmt.Errorf("two: %w %w", errors.New("a"), &fault.StoreError{Reason: fault.Unreachable, Err: errors.New("b")}), fault.Unreachable},
	} {
		if got := fault.ReasonOf(c.err); got != c.want {
			t.Errorf("Reason(%v) = %s, want %s", c.err, got, c.want)
		}
	}
	if !errors.Is(fmt.Errorf("w: %w", timeout), context.DeadlineExceeded) {
		t.Error("a StoreError does not unwrap to its error")
	}
	var names []string
	for _, r := range []fault.Reason{fault.Error, fault.Overload, fault.Timeout, fault.BreakerOpen, fault.Unreachable} {
		names = append(names, r.String())
	}
	if got := fmt.Sprint(names); got != "[error overload timeout breaker_open unreachable]" {
		t.Errorf("reason names %s", got)
	}
}
