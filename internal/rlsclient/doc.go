// Package rlsclient decides rate limit requests on a remote rate limit
// service over Envoy RLS v3 gRPC (envoy.service.ratelimit.v3): a sluice
// serve, or envoyproxy/ratelimit. Its Client has the DecideInto of
// decide.Decider, so that httplimit and sluice proxy decide on a shared
// remote service exactly as they would on local rules, and the DecideInto
// of rls.Decider as DecideRLS, for Envoy's request and response:
//
//	c, err := rlsclient.New(rlsclient.Config{Target: "ratelimit:8081"})
//	mw, err := httplimit.New(httplimit.Config{Decider: c, Domain: "api"})
//
// # The outcome
//
// The remote's RateLimitResponse is the outcome's Response, unchanged. A
// descriptor status that carries a current limit is a limited descriptor
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
// # Failures
//
// Every call is bounded by Config.Timeout within the caller's own
// deadline. A circuit breaker (internal/breaker: open after consecutive
// failures, a probe after a cooldown that doubles while the remote stays
// down) turns calls away at once while the remote is down. A call that
// the remote does not answer (unavailable, refused, our own timeout, the
// breaker open, any gRPC error but InvalidArgument) is answered by the
// failure policy: Config.Fallback, an rls.Decider of the same rules,
// answers as it does when its own store fails (rls.Decider.DecideDegraded:
// the domain's failure_policy, fail_open, fail_closed, or local limits
// divided by the number of nodes); without one, Config.FailurePolicy.
// The caller's own cancellation and an invalid request (the remote's
// InvalidArgument) are errors, never answered by a policy.
//
// It imports the root package, rls, rules, internal/breaker, gRPC, the
// Envoy protos and Prometheus; it must not import a transport (httplimit,
// server) or a store.
package rlsclient
