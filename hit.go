package sluice

// Hit is one limit applied to one key with a cost: what a Limiter decides,
// and what a Store applies.
type Hit struct {
	// Key identifies the counter of Limit. A store keeps one state per key
	// and limit: different limits given the same key string keep separate
	// state (the Store contract), so the key need not repeat the limit.
	// Hits of one request that must share a counter give the same key and
	// the same limit.
	Key string

	// Limit is what to enforce. It must be valid (Limit.Validate) and must
	// not change while it is in use.
	Limit *Limit

	// Cost is the number of hits to apply, 0 <= Cost <= MaxCost.
	// Zero is a peek: it consumes nothing and reports the state. A
	// Concurrency hit costs 0 (a peek at the permits held) or 1 (it
	// acquires its Permit).
	Cost int64

	// Permit is the ID of the permit a Concurrency hit of cost 1
	// acquires, non-empty and at most 64 bytes: the permit is held under
	// it until it is released or expires, and acquiring an ID already
	// held refreshes it and counts once (a retry). Limiter.Acquire makes
	// a random one. Other limits ignore it.
	Permit string
}
