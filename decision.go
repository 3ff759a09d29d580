package sluice

import "time"

// Decision is the answer for one limit, or for a whole request.
type Decision struct {
	// Allowed reports whether the request may proceed.
	Allowed bool

	// Limit is the configured limit of the deciding limit: its burst for a
	// bucket algorithm, its rate per period for a window algorithm.
	Limit int64

	// Remaining is how many more hits the deciding limit would admit now,
	// never negative.
	Remaining int64

	// ResetAfter is the time until the limit is fully replenished (bucket
	// algorithms) or its window ends (window algorithms).
	ResetAfter time.Duration

	// RetryAfter is zero when allowed; otherwise the time until the same
	// request would be allowed, or Never.
	RetryAfter time.Duration

	// Index is the position, in the request's hits, of the limit that
	// decided: the denying limit with the longest RetryAfter, or when
	// allowed the one with the least Remaining. -1 for a request with no
	// hits.
	Index int

	// Shadow reports that a shadow-mode limit would have denied this
	// request (on a per-hit decision: that this limit would have).
	Shadow bool

	// Over reports that the request was admitted beyond the configured
	// limit, within a soft or elastic margin.
	Over bool

	// Blocked reports that the key is serving a block_for penalty.
	Blocked bool

	// Overdrawn reports a denied hit consumed all the same, past the limit
	// (Limiter.TakeEach): its limit carries a debt.
	Overdrawn bool
}
