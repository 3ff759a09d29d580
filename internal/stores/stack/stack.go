// Package stack assembles the store stack of the sluice binary from one
// configuration, in one order, and hands back its parts: the top store the
// limiter decides with, the parts the binary wires elsewhere (the embedded
// store for its snapshots, Redis for health, the nodes' count and state of
// its own beside the counters, the region tier for the admin API and the
// dashboard), the pair of clocks the decision core reads, the store's
// health, its Prometheus collectors, and one Close.
//
// The stack, from the top:
//
//	regions    (--region: global limits from the region's allocation; with its coordinator Redis)
//	localcache (keys known to be over their limit, answered on the node; unless CacheSize is 0)
//	lease      (limits with consistency: lease, decided from local leases)
//	redis      (redisstore: the counters, Redis's clock)
//
// or, with Kind Memory, the embedded store (memstore) alone. Open opens
// the parts bottom up; Close closes them top down, in the reverse order: a
// decorator's own Close never closes the store below it
// (internal/stores/decorator), so the stack closes every part itself, each
// once.
//
// The decision tier is above this one: the failure policy (decide.Failover,
// with its node-local store) is built by the command, from the parts.
//
// It imports the stores and the region tier, and the Prometheus client; it
// must not import the decision core, a front door or a command.
package stack

import (
	"errors"
	"log/slog"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/stores/regions"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/localcache"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/redisstore"
)

// The kinds of store (Config.Kind).
const (
	Memory = "memory"
	Redis  = "redis"
)

// CoordinatorPrefix starts the coordinator's keys of the region tier.
const CoordinatorPrefix = "sluice:regions:"

// Config configures a stack.
type Config struct {
	// Kind is Memory or Redis.
	Kind string

	// MaxBytes caps the embedded store's memory (memstore.Config.MaxBytes);
	// 0 means no cap. Memory only.
	MaxBytes int64

	// Redis configures the Redis store. Redis only.
	Redis redisstore.Config

	// CacheSize is the entries of the local cache in front of the leases;
	// 0 means no cache. Redis only.
	CacheSize int

	// Region, when not nil, puts the region tier in front. Redis only.
	Region *RegionConfig

	// Logger receives what the region tier and its coordinator log (the
	// Redis store logs to Redis.Logger); nil discards.
	Logger *slog.Logger
}

// RegionConfig configures the region tier (internal/stores/regions).
type RegionConfig struct {
	Region      string        // this node's region, one of Regions
	Regions     []string      // every region
	Shares      []float64     // the regions' safe shares; nil: equal
	Coordinator string        // the coordinator's Redis URL
	Interval    time.Duration // how often grants and give-backs run
}

// Stack is an open store stack. Its fields are its parts: those of the
// kinds not configured are nil.
type Stack struct {
	Store sluice.Store // the top: what the limiter decides with

	Mem     *memstore.Store   // Kind Memory
	Redis   *redisstore.Store // Kind Redis
	Lease   *lease.Store      // in front of Redis
	Cache   *localcache.Store // in front of Lease, unless CacheSize is 0
	Regions *regions.Store    // in front of all, with Config.Region
	Region  string            // its name, for metrics

	// Now is the store's clock, for decide.Config.Now: Redis's as
	// estimated (redisstore.Store.Now); nil with the embedded store,
	// whose clock is time.Now's.
	Now func() time.Time
	// Earliest is a time at or before the store's clock, for
	// decide.Config.Earliest.
	Earliest func() time.Time

	// Health is the store's health check, nil when it cannot tell (the
	// embedded store is always up).
	Health func() error

	closers []func() error // in the order the parts were opened
}

// Open opens the stack cfg describes. On an error, what it had opened is
// closed.
func Open(cfg Config) (*Stack, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Stack{}
	switch cfg.Kind {
	case Memory:
		s.openMemory(cfg)
		return s, nil
	case Redis:
		if err := s.openRedis(cfg); err != nil {
			s.Close()
			return nil, err
		}
		return s, nil
	}
	return nil, errors.New("unknown store " + strconv.Quote(cfg.Kind))
}

// openMemory opens the embedded store.
func (s *Stack) openMemory(cfg Config) {
	// The store keeps its own clock, the wall clock at start advanced by
	// the monotonic one; this one, started just before it, reads the same
	// to within the moment between the two starts, and a millisecond
	// less: a time at or before the store's.
	clock := monotonicClock()
	m := memstore.New(memstore.Config{MaxBytes: cfg.MaxBytes})
	s.opened(m.Close)
	s.Store, s.Mem = m, m
	s.Earliest = func() time.Time { return clock().Add(-time.Millisecond) }
}

// openRedis opens Redis, the leases, the cache and the region tier, in
// that order.
func (s *Stack) openRedis(cfg Config) error {
	r, err := redisstore.New(cfg.Redis)
	if err != nil {
		return err
	}
	s.opened(r.Close)
	s.Redis, s.Store = r, r
	s.Now, s.Earliest, s.Health = r.Now, r.Earliest, r.Health
	// Leases (rules with consistency: lease) between the cache and
	// Redis: the cache answers denials, leases most admissions.
	s.Lease = lease.New(r, lease.Config{})
	s.opened(s.Lease.Close)
	s.Store = s.Lease
	if cfg.CacheSize > 0 {
		s.Cache = localcache.New(s.Lease, localcache.Config{MaxEntries: cfg.CacheSize})
		s.opened(s.Cache.Close)
		s.Store = s.Cache
	}
	if cfg.Region != nil {
		return s.openRegions(*cfg.Region, cfg.Logger)
	}
	return nil
}

// openRegions opens the coordinator and puts the region tier in front.
func (s *Stack) openRegions(rc RegionConfig, log *slog.Logger) error {
	coord, err := redisstore.New(redisstore.Config{URL: rc.Coordinator, Prefix: CoordinatorPrefix, Logger: log.With("component", "coordinator")})
	if err != nil {
		return &CoordinatorError{Err: err}
	}
	s.opened(coord.Close)
	r := s.Redis
	rs, err := regions.New(regions.Config{
		Next: s.Store, Region: rc.Region, Regions: rc.Regions, Shares: rc.Shares,
		Ledger: &regions.RedisLedger{Client: coord.Client, Prefix: CoordinatorPrefix},
		Now:    r.Now,
		Error: func() time.Duration {
			e, _ := r.ClockError()
			return e
		},
		Interval: rc.Interval,
		Nodes:    r.Nodes,
		Logger:   log.With("component", "regions"),
		// A Redis restarted mid-window lost what the region spent of it.
		Started: regions.RedisStarted(r.Client),
	})
	if err != nil {
		return err
	}
	s.opened(rs.Close)
	s.Store, s.Regions, s.Region = rs, rs, rc.Region
	return nil
}

// CoordinatorError is Open's error when the coordinator's configuration
// is refused (redisstore.New's error, in Err).
type CoordinatorError struct{ Err error }

func (e *CoordinatorError) Error() string { return "coordinator: " + e.Err.Error() }
func (e *CoordinatorError) Unwrap() error { return e.Err }

// opened records the closer of a part just opened.
func (s *Stack) opened(close func() error) { s.closers = append(s.closers, close) }

// Close closes every part, in the reverse order of opening: the region
// tier (its rounds) and its coordinator, the cache, the leases, Redis (or
// the embedded store). It returns the first error, and closes the rest
// all the same. Close is idempotent.
func (s *Stack) Close() error {
	var first error
	for i := len(s.closers) - 1; i >= 0; i-- {
		if err := s.closers[i](); err != nil && first == nil {
			first = err
		}
	}
	s.closers = nil
	return first
}

// monotonicClock is the embedded store's way of keeping time, which the
// decision core's reservations read (decide.Config.Earliest): the wall
// clock at start, advanced by the monotonic clock, so that a step of the
// wall clock moves neither.
func monotonicClock() func() time.Time {
	base := time.Now()
	return func() time.Time { return base.Add(time.Since(base)) }
}
