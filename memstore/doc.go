// Package memstore is the embedded, in-memory [sluice.Store]: one process,
// no servers. Most callers want
//
//	lim := sluice.NewLimiter(memstore.New(memstore.Config{}))
//
// # Layout
//
// Keys are not stored: a key is the 64-bit xxh3 hash of its string, seeded
// with a random per-store seed (so that clients cannot aim keys at one slot,
// hash flooding) and mixed with the limit's parameters (algorithm, rate,
// period, capacity, refill interval), so that two limits given the same key
// string keep separate state. Two distinct keys collide with probability
// 2^-64; among k live keys the chance that any two collide is about
// k²/2^65, 3·10^-8 at a billion keys. A collision makes two clients share
// one counter; it never corrupts the store.
//
// The five algorithms with one fixed-size state per key (fixed window, token
// bucket, leaky bucket, GCRA, sliding window counter) live in two kinds of
// sharded open-addressing tables with inline entries and no pointers:
//
//   - Word tables, for the limits whose state is one 64-bit word: GCRA, the
//     smooth token bucket and the leaky bucket when Period/Rate is a whole
//     number of nanoseconds, and the fixed window with a Period of at least
//     16.8 ms and a capacity under 2^24 − 4. 16-byte entries, linear
//     probing that never moves an entry, at a load of up to 70%: 22.9 to
//     28.6 bytes a key. A decision of one hit on a key present takes no
//     lock: it reads the word, computes, and swaps the result in with a
//     compare-and-swap (words.go has the design and why it is safe).
//   - Two-word tables for the rest: 24-byte entries, linear probing with
//     Robin Hood insertion and backward-shift deletion, at a load of up to
//     92%, growing by 1.2x, so at most about 31 bytes per key, under the
//     shard's mutex.
//
// A decision on an existing key, or on a new key that fits, does not
// allocate. Sliding logs are per-key lists in a map per shard.
// Sketches are one count-min sketch per sketch limit (name, rate, period,
// capacity, width, depth), shared by all its keys. The permits of a
// Concurrency limit are per-key sets in a map per shard: each permit's
// ID and expiry, and the same in a queue by expiry, so that the expired
// ones are dropped from its front (algo.PermitStep). A key holds at most
// its limit's Rate permits (each about 64 bytes and its ID's), since an
// acquisition beyond them is denied, and a permit's refreshes leave at
// most twice as many stale queue entries (and 16) before the queue is
// rebuilt: a key's memory is bounded by its Rate, and the memory cap
// bounds the keys.
//
// # Expiry
//
// Every state records when it becomes equivalent to a fresh key (its idle-at
// time, algo.State.A; a fixed window in a word table rounds it up by less
// than 16.8 ms). Idle entries are dropped by a background sweep every
// Config.SweepInterval, when a table is resized (a word table keeps the
// entries idle for less than a second, which a client asking more often
// than its limit refills would otherwise re-insert under the mutex), and
// when a lookup meets them. Sliding logs expire a period after their newest entry, sketches two
// periods after their last hit, block_for penalties when they end, permits
// at their expiry (dropped when their key is next used, or by the sweep).
//
// # Memory cap and eviction
//
// Config.MaxBytes caps the estimate reported by [Store.Bytes]. The budget is
// split evenly across the shards, after the fixed size of the sketches. When
// a new key would take a shard over its share, the shard first drops its
// idle entries; if that is not enough it evicts, among 8 entries sampled
// from a random slot, the one with the earliest idle-at time: the client
// whose counter would have been forgotten soonest anyway. A word table at
// its share evicts the same way in batches, down to 7/8 of what it can
// hold, because it rebuilds to reclaim slots. Sliding logs are
// evicted the same way, by sampling the shard's logs. Evicting a key hands
// that client a fresh quota (and ends a block_for penalty early): the cap
// trades exactness for bounded memory, so size it for the keys you expect
// and watch Stats().Keys. Sketches are never evicted; their memory is fixed
// per sketch limit. Permits held are never evicted: their holders still
// run. They take from a shard's share first (its table is what they leave),
// and when they alone fill it a new permit is refused as if its key were at
// its limit, so a cap too small for the permits in flight denies, never
// over-admits.
//
// # Snapshots
//
// [Store.WriteFile] (or [Store.Snapshot]) saves every live state, the seed,
// the sliding logs, the sketches and the block_for penalties in a versioned
// binary format with a CRC-32C checksum; [Store.LoadFile] (or
// [Store.Restore]) loads it, so that a restart does not hand every client a
// fresh quota. States hold absolute times, so a snapshot restored after
// downtime is still exact: whatever expired in between is dropped. Permits
// are not saved: their holders, in the process that held the store, are
// gone with it (a restore under another seed forgets those held).
//
// # Metrics
//
// [Store.Stats] gives the keys held, the memory estimate and the evictions
// in one pass; the sluice binary exports them to Prometheus
// (internal/stores/stack), as sluice_store_keys, sluice_store_bytes and
// sluice_store_evictions_total.
//
// This package imports the sluice root package, algo, xxh3 and the standard
// library (not Prometheus); nothing imports it but
// callers and the command.
package memstore
