// Package httpretry is the client side of rate limiting: an
// http.RoundTripper that behaves well under someone else's limits.
//
// A Transport retries refused requests (429 and 503 by default), waiting
// first for what the server said — Retry-After, then the IETF RateLimit
// field's reset, then X-RateLimit-Reset — and otherwise for an exponential
// backoff with full jitter, so that many clients refused together do not
// come back together. It retries only requests that are safe to repeat
// (idempotent methods, or an Idempotency-Key header) and whose bodies can be
// replayed. It fails at once with ErrDeadline when the wait would reach the
// request's deadline, and caps every wait on a server's word at MaxWait.
//
// When a host says its quota is spent, later requests to it wait for the
// reset instead of being sent to be refused (self-throttling). Optionally
// it paces requests to each host with a token bucket (Config.Pace), and
// rejects requests locally while a host refuses most of them (Config.Budget,
// the adaptive throttling of the Google SRE book).
//
// Most callers want NewClient:
//
//	client := httpretry.NewClient(httpretry.Config{})
//	resp, err := client.Get("https://api.example.com/v1/things")
//
// docs/internals/client-design.md explains the choices. The package owns the client's
// retry, wait and pacing policy; it imports only the standard library and
// sluice's algo package (the token bucket arithmetic), and must not import
// a store, a transport of the server side, or the rules.
package httpretry
