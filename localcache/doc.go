// Package localcache is a node-local cache, in front of any [sluice.Store],
// of the keys known to be over their limit. Once the store has said that a
// request is denied until a known time, this node answers the same request
// itself until then, without asking the store: a hot key over its limit
// (a client hammering a node after its 429) costs a map lookup instead of a
// Redis round trip. Most callers want
//
//	store := localcache.New(redis, localcache.Config{})
//
// Closing the cache leaves redis open: a store that wraps another never
// closes it; close redis yourself when done.
//
// # What is cached
//
// An entry is learned from every hit, in a request passed to the wrapped
// store, that has a cost above 0, a limit not in shadow mode, and a decision
// that denies with a RetryAfter above 0. Its identity is the hit's Key, the
// limit's fields that the algorithm's parameters compile (algorithm, rate,
// period, burst, refill interval, soft percent, elastic ceiling), BlockFor,
// and for a sketch limit its Name, width and depth (which name its sketch):
// a per-request override of the limit on the same key string never shares
// an entry. It holds:
//
//   - until = t0 + RetryAfter, where t0 is the local clock read before the
//     store was called. The store decided at t0 or later, so until is never
//     after the time the store meant. A RetryAfter of [sluice.Never] (a
//     cost above the burst, a zero limit) holds for as long as the limit
//     stays the same: such an entry lives until it is evicted.
//   - the cost of the hit: a request of at least that cost is denied until
//     then, since every algorithm that denies a cost denies any larger one.
//   - the Limit, Remaining and Blocked the store reported, and the
//     deadline t0 + ResetAfter.
//
// A limit with BlockFor is cached only from a Blocked denial, and until at
// most t0 + BlockFor: while the key is serving its block every cost of at
// least 1 is denied, so the entry answers any such cost; but once the block
// ends, a denial would start a new block, which a local answer must not
// skip. A newer denial of the same identity replaces the entry.
//
// # What is answered locally
//
// A request (Take, or TakeOne) is answered locally when every one of its
// hits has a cost above 0, a limit not in shadow mode, and a live entry
// (now < until) whose cost is at most the hit's. Each hit's decision is then
// the cached denial:
//
//   - Allowed false; Limit as the store reported it; Remaining as the store
//     last reported it, or 0 and Blocked true when blocked.
//   - RetryAfter = until − now, or Never for an entry that never expires,
//     and for a cost above the limit's enforced capacity (unless blocked),
//     as the store would say.
//   - ResetAfter = the cached deadline − now; for the window algorithms
//     (fixed window, sliding window, sketch), a deadline that has passed
//     moves on by whole periods, as the store's window does; for a blocked
//     key, the end of the block, as the store reports it while the block
//     lasts.
//   - Index 0, Shadow and Over false, as memstore leaves them in per-hit
//     decisions.
//
// Everything else goes to the store: peeks (cost 0), shadow hits, the
// permits of Concurrency limits (a denial there lasts only until a holder
// releases, earlier than its RetryAfter says: never learned, a request
// with one is never answered here), and requests that only some entries
// cover. Releasing and renewing permits go to the store too. A request decided one by one
// (TakeEach, Envoy's way) is answered only from entries that deny every
// cost of at least 1 (learned from a denial of cost 1, an overdrawn hit or
// a block): there a hit with room left overdraws instead of being denied,
// and only such an entry says there is no room. An expired entry is removed when a
// lookup meets it. When a request passed to the store is allowed, it has
// consumed: the entries of its hits, whose Remaining is now out of date, are
// dropped.
//
// This never changes whether a request is allowed. A denied request
// consumes nothing; other nodes sharing the store can only consume more;
// and RetryAfter is the time until the same request would be allowed if
// nothing else happened. So the store would deny every locally answered
// request too, and answering it here skips nothing the store would have done
// (a block is never restarted by a local answer, as said above).
//
// What a local answer reports can differ from what the store would report
// at that moment in these ways only: RetryAfter and ResetAfter are shorter
// by the time the store call took to reach the store (t0 is read before
// it); a cost above the cached one but within the capacity gets the
// RetryAfter of the cached cost, a lower bound; and Remaining is what the
// store reported at t0. Since then other nodes may have consumed, and time
// may have refilled it (buckets, sliding windows and sliding logs; and any
// algorithm, for a cost that can never be allowed, once its window rolls
// over or its bucket refills). Remaining is exact for a cost of 1 (it is 0)
// and, within its window, for a fixed window. What this node consumes is
// not missed: a request passed to the store and allowed drops the entries
// of its keys.
//
// Settle settles a reservation (sluice.Limiter.Settle) in the wrapped
// store; when it refunds hits (or fails, having perhaps refunded them), the
// entry of the hit's key and limit is dropped, so that a denial learnt
// before the refund is not answered after it.
//
// If the store forgets a key early (a memstore memory cap evicting it, a
// Redis flush), the cache keeps denying until the time the store had said:
// stricter than the forgetful store, never more permissive than the one
// that decided.
//
// The local clock is monotonic ([Config.Now]); the store's clock (Redis
// TIME) is never compared with it, only the durations the store reports.
//
// # Size, concurrency and cost
//
// The cache holds at most Config.MaxEntries entries, split evenly across
// shards (of at least 64 entries each, so the bound is MaxEntries rounded
// down to a multiple of the shard count). A shard that is full first drops
// its expired entries, then evicts, among the entries of the new entry's
// two buckets (8 slots each), the one that expires first. Each shard's
// table grows up to 5/4 of its share in slots; an entry goes in the emptier
// of its two buckets, so both are full before the shard is only in rare
// cases, which evict the same way. Evicting an entry only sends its key to
// the store again.
//
// An entry is identified by a 128-bit xxh3 hash of its key, seeded with a
// random per-cache seed and the limit's parameters, not by the key itself:
// entries hold no pointers and need no allocation. Two distinct keys share
// an entry with probability 2^-127 (among a hundred thousand entries, about
// one chance in 10^33 per lookup), far below memstore's own 64-bit
// identities.
//
// Lookups take no lock: each slot is a sequence lock of atomic words that
// writers update under their shard's mutex, so a hot key is read by every
// core without any of them writing to a shared cache line. The counters of
// local answers and store calls are striped across cache lines for the same
// reason. A local answer and a request that misses allocate nothing; a
// request passed to the store allocates what the store does.
//
// [Store.Stats] and [Store.Collector] report the hits (requests answered
// locally), the misses (requests passed to the store), the inserts, the
// evictions and the entries held.
//
// This package imports the sluice root package, the Prometheus client, xxh3
// and the standard library; it must not import a store: it wraps whichever
// it is given.
package localcache
