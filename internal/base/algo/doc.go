// Package algo holds the arithmetic of the seven rate limiting algorithms as
// pure step functions: (state, params, now, n) -> (state', result).
//
// It does no I/O, never reads a clock (now is an argument, in nanoseconds
// since the Unix epoch) and allocates nothing on the hot path. It is the
// single source of truth for the arithmetic: stores call it, and the Redis
// scripts mirror it and are tested against it.
//
// Five algorithms keep one fixed-size [State] per key (fixed window, token
// bucket, leaky bucket, GCRA, sliding window counter) and are evaluated by
// [Step]. The sliding log keeps a list of timestamped entries per key
// ([LogStep], [LogAppend]); the count-min sketch keeps one table per limit,
// shared by all its keys ([CMSketch]). Concurrency, beside them, is not a
// rate: a key holds a set of permits, each with an expiry ([PermitStep],
// [PermitRenew]).
//
// All arithmetic saturates instead of overflowing; a result that can never
// become true (a cost above the capacity, a zero limit) has RetryAfter equal
// to [Never].
//
// This package imports only the standard library.
package algo
