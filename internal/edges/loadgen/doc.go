// Package loadgen drives an Envoy rate limit service (RLS v3) with load and
// measures it: requests per second, latency percentiles from a log-linear
// histogram, and the count of each answer (OK, OVER_LIMIT, errors). It
// speaks gRPC (RateLimitService/ShouldRateLimit) or the HTTP JSON API
// (POST /json), closed loop (a fixed number of requests in flight) or open
// loop (a fixed arrival rate, latency measured from the intended send time).
//
// The generator shares the machine with the server it measures, so it is
// kept cheap: every request body is encoded once, before the run, into one
// flat buffer; gRPC requests go out as those bytes and only the overall code
// of a response is decoded; each worker keeps its own counters and
// histogram, merged at the end.
//
// It also holds [NullServer], a do-nothing RLS server that answers OK with a
// response of the same shape as a real one, so that the difference between
// the two measures the work of the server under test.
//
// The package imports the Envoy RLS protos, gRPC and the standard library;
// it must not import sluice's own packages: it measures them from outside.
package loadgen
