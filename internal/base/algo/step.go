package algo

// Step evaluates a request of cost n against the state s of one key at time
// now (nanoseconds since the Unix epoch) for the five algorithms that keep
// one [State] per key: FixedWindow, TokenBucket, LeakyBucket, GCRA and
// SlidingWindow.
//
// Step is pure: it returns the state the key would have if the request were
// admitted, and the caller commits it only when the whole request (every
// limit it matched) is allowed. When the request is denied, or n is 0, the
// returned state is s itself. p must be valid ([Params.Validate]); Step never
// panics and never overflows, whatever s, now and n are.
//
// Conventions shared by every algorithm:
//
//   - The zero State is a fresh key, and s.A is the idle-at time: at or after
//     s.A the state is equivalent to the zero State.
//   - n = 0 is a peek: it is always allowed, consumes nothing and reports
//     Remaining and ResetAfter (Overdraw's peek at a state in debt is
//     denied). A negative n is treated as 0.
//   - A zero limit (Rate 0 or Capacity 0) denies every n > 0 with RetryAfter
//     [Never], as does any n above Capacity.
//   - Times before the Unix epoch are treated as the epoch, and now is at most
//     math.MaxInt64-1.
//   - A state whose idle-at time would lie beyond math.MaxInt64 (year 2262)
//     cannot be stored. Bucket requests that would need one are denied with
//     RetryAfter Never (waiting does not help: the idle-at time of such a
//     request never moves earlier); windows that end after it are cut there.
//   - Time going backwards (now earlier than a time the state has already
//     seen) never admits more than the same request at the later time would:
//     the window algorithms count the request in the state's own, later
//     window, as if it came at that window's start; the bucket algorithms
//     measure the time left to the state's idle-at time from the earlier now,
//     which makes the bucket look fuller. A request admitted with a backwards
//     now leaves exactly the state it would have left at the later time.
//     Durations in the Result are measured from the given now.
//
// The per-algorithm semantics are documented on the unexported functions and
// in docs/internals/algorithms.md.
func Step(p *Params, s State, now, n int64) (State, Result) {
	if n < 0 {
		n = 0
	}
	now = clampNow(now)
	if p.Period <= 0 || p.Rate < 0 || p.Capacity < 0 || p.Interval < 0 {
		return s, zeroLimit(n, 0)
	}
	switch p.Kind {
	case FixedWindow:
		return fixedWindow(p, s, now, n)
	case TokenBucket:
		if p.Interval > 0 {
			return discreteBucket(p, s, now, n)
		}
		return gcra(p, s, now, n)
	case LeakyBucket, GCRA:
		return gcra(p, s, now, n)
	case SlidingWindow:
		return slidingWindow(p, s, now, n)
	}
	// SlidingLog, Sketch and Concurrency keep no State: see LogStep,
	// CMSketch and PermitStep.
	return s, zeroLimit(n, 0)
}

// zeroLimit is the result of a request against a limit that admits nothing:
// a peek is allowed, anything else never will be.
func zeroLimit(n, resetAfter int64) Result {
	if n == 0 {
		return Result{Allowed: true, ResetAfter: resetAfter}
	}
	return Result{ResetAfter: resetAfter, RetryAfter: Never}
}
