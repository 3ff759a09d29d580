// Package storeerr reads why a store failed from an error: the reason of
// the first sluice.StoreError in its chain. It imports the root package
// only.
package storeerr

import "github.com/sluicehq/sluice"

// Reason returns the reason of the first StoreError in err's chain (as
// errors.As finds it, without allocating), or FailError when there is none.
func Reason(err error) sluice.FailReason {
	if r, ok := reasonOf(err); ok {
		return r
	}
	return sluice.FailError
}

func reasonOf(err error) (sluice.FailReason, bool) {
	for err != nil {
		switch e := err.(type) {
		case *sluice.StoreError:
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
