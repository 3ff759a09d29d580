package sluice

import "errors"

// ErrNeverConnected is wrapped by a store's health error while the store
// has not reached its backend once since it was created: a wrong address,
// or a backend not started yet. Servers report themselves not ready then,
// rather than answer every request by the failure policy unnoticed; an
// outage after the first connection leaves them ready, with the policy
// answering.
var ErrNeverConnected = errors.New("never connected since start")

// FailReason says why a store could not decide. A failure policy's answers
// are counted by it, so that an operator can tell an overloaded node from a
// dead backend.
type FailReason uint8

// The reasons.
const (
	// FailError: the backend answered with an error (Redis refused the
	// call: an error reply), or the store failed in a way it cannot
	// classify.
	FailError FailReason = iota
	// FailOverload: the node shed the call without asking the backend:
	// its calls in flight were at their bound and its queue full.
	FailOverload
	// FailTimeout: the backend stayed silent past the store's deadline
	// (it answered nothing at all, not merely slowly).
	FailTimeout
	// FailBreakerOpen: the circuit breaker is open after failures; the
	// backend was not asked.
	FailBreakerOpen
	// FailUnreachable: not connected, or the connection failed (refused,
	// reset, closed).
	FailUnreachable
	numFailReasons
)

var failReasonNames = [numFailReasons]string{
	FailError:       "error",
	FailOverload:    "overload",
	FailTimeout:     "timeout",
	FailBreakerOpen: "breaker_open",
	FailUnreachable: "unreachable",
}

// String returns the reason's name as metrics label it: "error",
// "overload", "timeout", "breaker_open" or "unreachable".
func (r FailReason) String() string {
	if r < numFailReasons {
		return failReasonNames[r]
	}
	return "error"
}

// StoreError is a store's failure with its reason. Stores that know why
// they failed return one (or wrap one); errors.As finds it in a chain.
type StoreError struct {
	Reason FailReason
	Err    error
}

func (e *StoreError) Error() string { return e.Err.Error() }
func (e *StoreError) Unwrap() error { return e.Err }
