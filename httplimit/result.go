package httplimit

// Result is what the middleware did with a request, as Config.OnResult
// is told: the values of a metric's result label.
type Result uint8

// The results.
const (
	// Allowed: decided, admitted, passed to the handler.
	Allowed Result = iota + 1
	// Delayed: admitted after waiting in the Shaping queue, passed to
	// the handler.
	Delayed
	// Denied: denied by a limit (or a failure limit), answered
	// Config.DenyStatus or by Config.OnDeny.
	Denied
	// Shadow: would have been denied (by a limit, or the Concurrency
	// cap), passed to the handler in shadow mode (Config.ShadowMode, or a
	// rule's shadow_mode).
	Shadow
	// TooConcurrent: denied by the Concurrency cap.
	TooConcurrent
	// Unlimited: every descriptor skipped, passed to the handler
	// undecided.
	Unlimited
	// Invalid: values the limits cannot take, answered 400.
	Invalid
	// Error: could not be decided, answered by Config.OnError.
	Error
	// Canceled: the request's context ended while it was being decided
	// or waited in the Shaping queue; not answered.
	Canceled

	numResults
)

var resultNames = [numResults]string{"", "allowed", "delayed", "denied", "shadow", "too_concurrent", "unlimited", "invalid", "error", "canceled"}

// String returns the result's name in snake case ("too_concurrent"), ""
// for an unknown value.
func (r Result) String() string {
	if r < numResults {
		return resultNames[r]
	}
	return ""
}
