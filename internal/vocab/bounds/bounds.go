// Package bounds holds the bounds on one request that every front door
// checks before its descriptors are matched (decide.Decider.Decide checks
// them again), so that no request makes the server do more than a bounded
// amount of work.
package bounds

import (
	"errors"
	"fmt"

	"github.com/sluicehq/sluice"
)

// ErrInvalid is sluice.ErrInvalid, wrapped by every error of CheckCounts.
var ErrInvalid = sluice.ErrInvalid

// ErrTooLarge is wrapped, beside ErrInvalid, by the error of a request over
// one of the bounds below: it is refused before any matching.
var ErrTooLarge = errors.New("request too large")

// Bounds on one request, checked before its descriptors are matched, so
// that no request makes the server do more than a bounded amount of work:
// Envoy sends a handful of descriptors of a few entries each. The
// transports check them again on the wire, before decoding (see
// server.MaxRequestBytes).
const (
	// MaxDescriptors is the most descriptors in one request.
	MaxDescriptors = 256
	// MaxEntries is the most entries in one descriptor (rules nest at
	// most 64 deep, so no rule needs more).
	MaxEntries = 64
	// MaxTotalEntries is the most entries in all the descriptors of one
	// request together.
	MaxTotalEntries = 1024
)

// CheckCounts returns an error wrapping ErrInvalid and ErrTooLarge when a
// request with these counts is over a bound: descriptors, the entries of
// the largest descriptor, and the entries of all together.
func CheckCounts(descriptors, most, total int) error {
	switch {
	case descriptors > MaxDescriptors:
		return fmt.Errorf("%w: %w: more than %d descriptors", ErrInvalid, ErrTooLarge, MaxDescriptors)
	case most > MaxEntries:
		return fmt.Errorf("%w: %w: a descriptor of more than %d entries", ErrInvalid, ErrTooLarge, MaxEntries)
	case total > MaxTotalEntries:
		return fmt.Errorf("%w: %w: more than %d descriptor entries in all", ErrInvalid, ErrTooLarge, MaxTotalEntries)
	}
	return nil
}
