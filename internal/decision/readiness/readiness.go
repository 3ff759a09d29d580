// Package readiness is the readiness rule of every front door.
package readiness

import (
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/fault"
	"github.com/sluicehq/sluice/rules"
)

// Store is the readiness rule of every front door, given its
// store's health (nil: up) and the default failure policy: not ready while
// the store has never been reached since start (a wrong address, a backend
// not started: better seen at once than answered by the policy unnoticed),
// nor while it is down and the policy is fail_closed (every request would
// be denied); ready otherwise, the policy answering during an outage.
func Store(storeErr error, policy rules.FailurePolicy) error {
	switch {
	case storeErr == nil:
		return nil
	case errors.Is(storeErr, fault.ErrNeverConnected):
		return fmt.Errorf("store not reached since start (%v); check that it runs and its address", storeErr)
	case policy == rules.FailClosed:
		return fmt.Errorf("store down (%v) and the default failure policy is %s", storeErr, policy)
	}
	return nil
}
