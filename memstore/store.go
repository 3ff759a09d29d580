package memstore

import (
	"crypto/rand"
	"encoding/binary"
	"math"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/sluicehq/sluice/internal/base/algo"
)

// Config configures a Store. The zero value is ready to use: every field's
// zero value means the default written in its comment.
type Config struct {
	// Now returns the current time. The store owns the clock: each Take
	// reads it once and decides every hit at that time. Nil means the wall
	// clock as read when the store was created plus the monotonic time
	// elapsed since: one clock read per decision instead of time.Now's two,
	// and immune to steps of the wall clock (a stepped wall clock is picked
	// up when the store is created again).
	Now func() time.Time

	// Shards is the number of independently locked parts of the store,
	// rounded up to a power of two, at most 1024. Zero means 16 per
	// GOMAXPROCS.
	Shards int

	// MaxBytes caps the memory estimate of the store (Bytes). When a new
	// key would exceed it, the store evicts as the package documentation
	// says, handing the evicted client a fresh quota. Zero means no cap.
	MaxBytes int64

	// SweepInterval is how often a background goroutine drops idle keys.
	// Zero means one minute; negative means no background sweep (call
	// Sweep yourself, or rely on resizing and lookups to reclaim them).
	SweepInterval time.Duration

	// Seed seeds the hash of the keys. Zero means a random seed, which is
	// what you want: a known seed lets clients choose keys that collide.
	// Restoring a snapshot replaces the seed with the snapshot's.
	Seed uint64
}

// Defaults of Config.
const (
	DefaultSweepInterval = time.Minute
	MaxShards            = 1024
)

// Store is the in-memory sluice.Store. It is safe for concurrent use. Create
// it with New and stop its background sweep with Close.
type Store struct {
	now      func() int64 // Unix nanoseconds
	seed     atomic.Uint64
	shards   []shard
	mask     uint64
	maxBytes int64
	sketches sketchSet
	evicted  atomic.Int64
	// permsExpired counts the permits dropped on expiry (Stats).
	permsExpired atomic.Int64

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// shard is one independently locked part of the store: a table of the
// one-state algorithms (and block_for penalties) and the sliding logs whose
// key hashes fall in it. It is padded to two cache lines so that the
// mutexes of neighbouring shards never share one.
type shard struct {
	mu        sync.Mutex
	t         table
	w         atomic.Pointer[wtable] // the word table (words.go)
	logs      map[uint64]logList
	logBytes  int64                 // estimate of the memory held by logs
	perms     map[uint64]*permitSet // the permits of Concurrency limits (nil until one is held)
	permBytes int64                 // estimate of the memory held by perms
	rng       uint64                // state of the eviction sampler
	_         [64]byte
}

// shardBytes is the estimate of the memory of a shard itself, which Bytes
// counts besides what the shard holds.
const shardBytes = 128

// monotonicClock returns the default clock, in Unix nanoseconds: the wall
// clock at the call, advanced by the monotonic clock. time.Since on a time
// with a monotonic reading reads only the monotonic clock, and no
// time.Time is built per reading.
func monotonicClock() func() int64 {
	base := time.Now()
	at := base.UnixNano()
	return func() int64 { return at + int64(time.Since(base)) }
}

// New returns a Store configured by cfg and starts its background sweep.
func New(cfg Config) *Store {
	n := cfg.Shards
	if n <= 0 {
		n = 16 * runtime.GOMAXPROCS(0)
	}
	n = min(n, MaxShards)
	n = 1 << bits.Len(uint(n-1))
	s := &Store{
		shards:   make([]shard, n),
		mask:     uint64(n - 1),
		maxBytes: max(cfg.MaxBytes, 0),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	if now := cfg.Now; now != nil {
		s.now = func() int64 { return now().UnixNano() }
	} else {
		s.now = monotonicClock()
	}
	seed := cfg.Seed
	for seed == 0 {
		var b [8]byte
		rand.Read(b[:])
		seed = binary.LittleEndian.Uint64(b[:])
	}
	s.seed.Store(seed)
	for i := range s.shards {
		sh := &s.shards[i]
		sh.logs = make(map[uint64]logList)
		sh.rng = mix64(seed + uint64(i))
	}
	s.sketches.m = make(map[sketchID]*sketchSlot)
	every := cfg.SweepInterval
	if every == 0 {
		every = DefaultSweepInterval
	}
	if every > 0 {
		go s.sweepLoop(every)
	} else {
		close(s.done)
	}
	return s
}

// Close stops the background sweep. The store remains usable. Close is
// idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() { close(s.stop) })
	<-s.done
	return nil
}

// mix64 is a bijective 64-bit finalizer (the one of MurmurHash3).
func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// paramsMix folds a limit's parameters into the key seed, so that two
// limits given the same key string keep separate state (the period as
// Params.IdentityPeriod says).
func paramsMix(p *algo.Params) uint64 {
	rate, capacity := p.IdentityCounts()
	x := uint64(p.Kind)<<56 ^
		uint64(rate)*0x9e3779b97f4a7c15 ^
		uint64(p.IdentityPeriod())*0xc2b2ae3d27d4eb4f ^
		uint64(capacity)*0x165667b19e3779f9 ^
		uint64(p.Interval)*0xd6e8feb86659fd93
	return mix64(x)
}

// keyHash returns the 64-bit identity of key under limit parameters p,
// never 0 (the empty slot).
func (s *Store) keyHash(key string, p *algo.Params) uint64 {
	h := xxh3.HashStringSeed(key, s.seed.Load()^paramsMix(p))
	if h == 0 {
		h = 1
	}
	return h
}

// blockKey derives the key of the block_for penalty of key k.
func blockKey(k uint64) uint64 {
	b := mix64(k ^ 0x5bd1e9955bd1e995)
	if b == 0 {
		b = 1
	}
	return b
}

func (s *Store) shardOf(k uint64) int { return int(k & s.mask) }

// addSat returns a+b for b >= 0, saturated at math.MaxInt64.
func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// Stats is what the store holds and has done.
type Stats struct {
	// Keys is the number of keys the store holds state for: one-state
	// keys, sliding logs, keys holding permits and active block_for
	// penalties. Keys of sketch limits have no state of their own and are
	// not counted.
	Keys int
	// Bytes is an estimate of the memory the store holds: its tables,
	// sliding logs, permits and sketches. Config.MaxBytes caps it.
	Bytes int64
	// Evictions is how many live keys the memory cap has evicted since
	// the store was created.
	Evictions int64
	// PermitsExpired is how many permits of Concurrency limits the store
	// has dropped since it was created because they reached their expiry
	// unreleased: their holders died, stalled past their Period without
	// renewing, or never released them. A released permit is not
	// counted, nor one the memory cap evicted (Evictions).
	PermitsExpired int64
}

// Stats returns the store's figures, from one pass over its shards.
func (s *Store) Stats() Stats {
	st := Stats{Bytes: s.sketches.bytes.Load(), Evictions: s.evicted.Load(), PermitsExpired: s.permsExpired.Load()}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		st.Keys += sh.t.n + sh.wordsOf().len() + len(sh.logs) + len(sh.perms)
		st.Bytes += shardBytes + sh.bytes()
		sh.mu.Unlock()
	}
	return st
}
