// Package fault says why a store could not decide: a store's failure is a
// [StoreError] carrying a [Reason], and [ReasonOf] reads that reason back
// from any error chain. Failure policies count their answers by reason, so
// that an operator can tell an overloaded node from a dead backend; the
// servers report themselves not ready while a store's health wraps
// [ErrNeverConnected].
//
// Callers of the limiter rarely need this package: a denial is a Decision,
// never an error, and any error means the store failed. Stores and the
// decorators over them use it to classify their failures.
//
// It imports only the standard library.
package fault

import "errors"

// ErrNeverConnected is wrapped by a store's health error while the store
// has not reached its backend once since it was created: a wrong address,
// or a backend not started yet. Servers report themselves not ready then,
// rather than answer every request by the failure policy unnoticed; an
// outage after the first connection leaves them ready, with the policy
// answering.
var ErrNeverConnected = errors.New("never connected since start")

// Reason says why a store could not decide.
type Reason uint8

// The reasons.
const (
	// Error: the backend answered with an error (Redis refused the call:
	// an error reply), or the store failed in a way it cannot classify.
	Error Reason = iota
	// Overload: the node shed the call without asking the backend: its
	// calls in flight were at their bound and its queue full.
	Overload
	// Timeout: the backend stayed silent past the store's deadline (it
	// answered nothing at all, not merely slowly).
	Timeout
	// BreakerOpen: the circuit breaker is open after failures; the backend
	// was not asked.
	BreakerOpen
	// Unreachable: not connected, or the connection failed (refused,
	// reset, closed).
	Unreachable
	numReasons
)

var reasonNames = [numReasons]string{
	Error:       "error",
	Overload:    "overload",
	Timeout:     "timeout",
	BreakerOpen: "breaker_open",
	Unreachable: "unreachable",
}

// String returns the reason's name as metrics label it: "error",
// "overload", "timeout", "breaker_open" or "unreachable".
func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return "error"
}

// StoreError is a store's failure with its reason. Stores that know why
// they failed return one (or wrap one); errors.As finds it in a chain, and
// ReasonOf reads its reason.
type StoreError struct {
	Reason Reason
	Err    error
}

func (e *StoreError) Error() string { return e.Err.Error() }
func (e *StoreError) Unwrap() error { return e.Err }

// ReasonOf returns the reason of the first StoreError in err's chain (as
// errors.As finds it, without allocating), or Error when there is none.
func ReasonOf(err error) Reason {
	if r, ok := reasonOf(err); ok {
		return r
	}
	return Error
}

func reasonOf(err error) (Reason, bool) {
	for err != nil {
		switch e := err.(type) {
		case *StoreError:
			return e.Reason, true
		case interface{ Unwrap() error }:
			err = e.Unwrap()
		case interface{ Unwrap() []error }:
			for _, x := range e.Unwrap() {
				if r, ok := reasonOf(x); ok {
					return r, true
				}
			}
			return 0, false
		default:
			return 0, false
		}
	}
	return 0, false
}
