// Package rlsclient decides rate limit requests on a remote rate limit
// service over Envoy RLS v3 gRPC (envoy.service.ratelimit.v3): a sluice
// serve, or envoyproxy/ratelimit. Its Client is a decide.Remote: a
// Decider with it decides every request on the remote first, and answers
// what the remote cannot by its own rules' failure policy, so that
// httplimit and sluice proxy decide on a shared remote service through
// the one door of package decide:
//
//	c, err := rlsclient.New(rlsclient.Config{Target: "ratelimit:8081"})
//	dec, err := decide.New(decide.Config{Limiter: local, Rules: rules, Remote: c, Failover: ...})
//
// # The outcome
//
// A descriptor status that carries a current limit is a limited descriptor
// with one limit: a sluice.Limit named as the remote names it, of
// requests_per_unit per unit × unit_multiplier (the remote tells nothing
// more: its algorithm and burst stay its own), and a decision of that
// limit, remaining and reset; an OVER_LIMIT status retries after its
// reset, as the remote says no finer time and its reset is never earlier
// than the limit allows. A status without a current limit (no rule, an
// unlimited rule, or the remote's own fail_open) is unlimited. The overall
// decision is the remote's overall code, reported against the denying
// limit with the longest wait, or when allowed the limit with the least
// remaining, as a local decision would. The remote does not say which
// rule matched, so StatKey and Rule are empty.
//
// # Permits
//
// A sluice serve started with --stream-done-release answers a request
// admitted holding permits of its concurrency limits with a permit token
// in the answer's dynamic metadata (rls.PermitToken). Ask puts it in
// Outcome.PermitToken, and the Decider makes Outcome.Permit of it
// (decide.Remote): the front door keeps that Permit as it keeps a local
// one, and its Release is one more Ask, of the request's descriptors
// each with the token in a sluice_permit entry (Envoy's stream-done
// descriptor), whose answer is not read; an error counts as a failed
// release, and the permits then expire by their TTL. Nothing renews them
// (RLS cannot): a permit lives its rule's TTL from the remote's decision
// unless released, so the TTL must exceed the requests' duration. A
// remote that denies says not why, so no permit is counted denied.
//
// # Failures
//
// Every call is bounded by Config.Timeout within the caller's own
// deadline. A circuit breaker (internal/stores/breaker: open after consecutive
// failures, a probe after a cooldown that doubles while the remote stays
// down) turns calls away at once while the remote is down. A call that
// the remote does not answer (unavailable, refused, our own timeout, the
// breaker open, any gRPC error but InvalidArgument, an answer that does
// not fit the request) is an error wrapping ErrUnavailable, which the
// Decider answers by the domain's failure policy on its own rules. The
// caller's own cancellation and an invalid request (the remote's
// InvalidArgument) are errors, never answered by a policy.
//
// It imports the root package, decide, internal/edges/rls (the codec), internal/stores/breaker, gRPC, the
// Envoy protos and Prometheus; it must not import a transport (httplimit,
// server) or a store.
package rlsclient
