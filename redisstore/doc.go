// Package redisstore is the [sluice.Store] on Redis, for many sluice nodes
// sharing their limits: standalone, Sentinel or Cluster, with TLS and ACL
// authentication.
//
//	store, err := redisstore.New(redisstore.Config{URL: "redis://127.0.0.1:6379"})
//	lim := sluice.NewLimiter(localcache.New(store, localcache.Config{}))
//
// # One script, exact arithmetic, Redis's clock
//
// Every request is one call of a Lua function (FCALL) of a library the
// store loads with FUNCTION LOAD when it connects, and again whenever Redis
// answers that it does not know the function (a restarted server, FUNCTION
// FLUSH). A library rather than a script (EVALSHA): a script would run the
// definitions of the whole Lua library again on every call (measured: 30.6
// against 21µs of Redis CPU per decision). The function reads Redis TIME,
// so every node agrees on "now" whatever its own clock says, evaluates
// every hit of the request with the algorithms of package algo translated
// to Lua, and commits all of them or none, exactly as memstore does. Lua numbers are doubles, exact only below 2^53, while
// the algorithms work on nanosecond times (about 2^60.6 today) and 128-bit
// products; the script carries its own exact integer arithmetic
// (redisstore/internal/luasrc), and a differential test holds the Lua to the
// Go on random traces, bit for bit.
//
// # Keys and slots
//
// A key's state lives under <prefix>{<tag>}<id>: the tag is 16 hex digits
// of the hash of Config.HashTag(key), the id 32 hex digits of the 128-bit
// hash of the limit's parameters and the key (so different limits on one key
// string keep separate state, and keys of any length take the prefix plus
// 50 bytes). Values are short decimal strings ("idle-at remainder"); a
// sliding log is a list of "time count" entries; a sketch is two strings
// of 32-bit counters (BITFIELD), one per window, and a key with the latest
// window's start, in the slot of the sketch's own identity. Every key has a
// TTL that ends when its state becomes equivalent to a fresh key, so idle
// keys disappear by themselves.
//
// On a Cluster, the hits of a request whose keys share a slot are decided
// in one call, atomically. Choose Config.HashTag so that the limits one
// request meets share a tag (rules.HashTag does that for the limits of one
// descriptor). A request whose hits span slots makes one call per slot, in
// parallel; each slot commits when all its own hits allow. If another slot
// denied, the store takes back what the allowing slots consumed with a
// second call: a state nobody touched since is restored exactly, a window
// counter touched since is decremented in the same window, a sliding log
// entry loses the hits, sketch counters are restored if nothing was added
// to the sketch since; a bucket touched since, and a sketch added to
// since, keep the consumption. So a cross-slot request never admits more
// than one node would, but between the two calls (and for those
// remainders, which on a hot bucket are common) it can deny more. If a
// slot's call fails, the request is an error (the caller's failure policy
// answers it); the other slots' consumption is taken back as above.
//
// # Permits
//
// The permits of a Concurrency limit are a sorted set at the key's state
// key: each permit's ID scored by its expiry in whole milliseconds of
// Redis TIME (exact in a double), with a TTL (PEXPIRE, never shortened)
// to the latest expiry, so that a key whose holders vanished disappears
// after its last permit would have expired. A Take's call drops the key's
// expired permits (ZREMRANGEBYSCORE), counts the rest and adds the permit
// in the same atomic call as the request's rates, all or nothing; Store.
// Release removes permits (ZREM) and Store.Renew extends those still held,
// one call per batch of permits (per slot, on a Cluster). A request whose
// permit and rates are in different slots is taken back as above: an
// added permit is removed if nobody has touched it since. Lua mirrors
// algo.PermitStep and algo.PermitRenew, differential-tested against them.
//
// # Settling reservations
//
// Store.Settle settles a reservation (sluice.Limiter.Settle) with package
// algo's arithmetic (algo.Settle, mirrored in Lua and differential-tested
// against it) in one call of the store's function, atomically, at Redis
// TIME, as a take is decided: the call reads the key's state, settles it,
// writes it back and records the settlement's ID in a marker key beside
// the state, so that a settlement sent twice is applied once.
//
// What must be chosen before a call is chosen on Redis's clock too:
// Store.Now estimates it (the offset of Redis's TIME from this process's
// clock, sampled every second, the shortest round trip of the last 30
// seconds), and Store.Earliest is a time at or before it. A decision core
// over the store takes them as its clocks, so that the windows of
// scheduled rules change together on every node and a refund never
// returns more than a reservation still holds:
//
//	cfg := decide.Config{Limiter: sluice.NewLimiter(store), Now: store.Now, Earliest: store.Earliest}
//
// # Failures
//
// A call waits for Redis's answer, however slow, and fails only when Redis
// is silent: a connection with calls waiting and no reply for half of
// Config.Timeout is sent a PING, and closed, failing its calls, if that
// has no answer within Config.Timeout. The requests waiting on the node to
// go after a call that failed so fail with it, rather than go next and
// wait as long again: a request sent to a silent Redis fails within about
// twice Config.Timeout. The caller's deadline bounds only its wait for a
// slot among the calls in flight (Config.MaxInFlight). A circuit breaker
// opens after consecutive failures and then fails calls at once with
// ErrUnavailable, letting one probe through after a cooldown that doubles
// up to 5 seconds; Health reports the state. While no request calls
// Redis, the store PINGs it through the breaker every Config.Timeout, so
// that an idle node's health follows Redis too. A store error is never a
// decision: the caller's failure policy (fail open, fail closed, or
// node-local limits; see package decide) decides what happens. New returns
// a working Store even when Redis is down, and connects in the background.
//
// This package imports the root package, algo, rueidis, the Prometheus
// client, xxh3, its Lua (internal/luasrc) and small internal helpers; it
// must not import rules, the decision core or a transport (imports_test.go
// in the root holds it to that).
package redisstore
