// Package regions is the region tier: one limit across regions, each
// deciding from its allocation of it (docs/internals/regions.md).
//
// A Store wraps a region's store (Redis, with leases or a local cache in
// front as the region chooses). For a hit whose limit is Global (a fixed
// window), the region's counter keeps the whole limit L, and the region's
// allocation a is enforced by holding L − a of it as spent: at the first
// decision of a key in a window, the store charges the counter L − s (s,
// the region's safe share), once for the whole region (a settlement with
// an ID made of the region, the key, the limit and the window, which a
// store that may see it twice applies once). A grant from the coordinator's
// ledger is then refunded from that charge, in that window only; a
// give-back is first spent in the region (an all-or-nothing take, so that
// no node can admit it), then returned to the ledger. So no region admits
// more than the ledger allocated it, and the ledger never allocates more
// than L: a region it has not heard from in a window counts as its safe
// share, which the region takes without asking.
//
// Nothing of this is on the request path but the first decision of a key
// in a window on each node, which waits for the charge; grants and
// give-backs run every Interval in the background, and decisions never
// wait for another region.
//
// When the region's store fails, the node's local failure policy answers
// (decide.Failover); Budget bounds it by what the region has left of its
// allocation, as the node last learnt it. What the policy admits reaches
// the region's store only with the decider's write-back, so a node that
// saw its store fail gives nothing back for that window (held). A store
// that loses its counters mid-window (restarted empty) is told by a
// decision whose Remaining rose beyond what this node knows the region
// holds, confirmed by the key's charge marker (marker): the node then
// charges the counter again, for what it knew the region had left.
package regions

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/stores/decorator"
)

// Config configures a Store.
type Config struct {
	Next    sluice.Store // the region's store; it must settle (sluice.Limiter.Settle)
	Region  string       // this region's name, one of Regions
	Regions []string     // every region's name
	// Shares are the regions' safe shares, fractions of a limit in the
	// order of Regions, summing to at most 1; nil means equal shares.
	Shares   []float64
	Ledger   Ledger
	Now      func() time.Time // the region store's clock estimate
	Error    func() time.Duration
	Interval time.Duration // how often grants and give-backs run; 0: 200ms
	Nodes    func() int    // this region's nodes, for a region's demand; nil: 1
	Logger   *slog.Logger
	// Started returns when the region's store last started, on its
	// clock (Redis: RedisStarted): a store that started in a window may
	// have lost what the region spent of it (restart.go). Nil: a store
	// that never loses its state.
	Started func(context.Context) (time.Time, error)

	// For a simulation on a virtual clock (cmd/regionsim): Sleep waits d
	// or until ctx ends, at a window's edge (nil: a timer); Manual starts
	// no background rounds, and the caller calls Round every Interval.
	Sleep  func(ctx context.Context, d time.Duration) error
	Manual bool
	// Plan, if set, replaces the round's allocation policy (plan), to
	// simulate another design (cmd/regionsim -loop design).
	Plan func(*Demand) int64
}

// Store is a region's store for global limits; every other hit goes to
// Next unchanged.
type Store struct {
	base   // the region's store: Unwrap, Health
	cfg    Config
	region int

	mu   sync.Mutex
	keys map[gkey]*gstate

	// failAt is when (Unix ns, by Now) this node last saw the region's
	// store fail: a take or a charge that failed, a round that found it
	// unhealthy, counters lost. See held.
	failAt atomic.Int64

	// since is when this node started (Unix ns, by Now, and a slack):
	// what the region spent of a window that began before cannot be
	// known here (restart.go).
	since int64

	stop func()
	done chan struct{}

	stats counters
}

// base is the forwarding helper every decorator embeds: Unwrap returns
// the region's store, and Health is its. Close is the tier's own.
type base = decorator.Base

type gkey struct {
	key          string
	rate, period int64
}

// gstate is what the node knows of a global key in its current window.
type gstate struct {
	limit     *sluice.Limit
	marker    *sluice.Limit // the key's charge marker (markerOf)
	window    int64         // start, Unix ns
	init      chan struct{}
	initErr   error
	lost      bool    // the region's store lost the key's counters; a new state replaces this one
	remaining int64   // region-wide, from the last decision; -1: none yet
	asked     int64   // hits asked (admitted or not) this window
	lastAsked int64   // asked at the last round
	rate      float64 // the demand, hits a second (Demand.Rate)
	memo      any     // Demand.Memo
	granted   int64   // by this node, this window
	given     int64   // given back by this node, this window
	yielded   bool    // given back for another region's want
	born      time.Time
	fresh     bool // the node had no state of the window before this one
	blind     bool // what the region spent of the window before this state is unknown here (restart.go)
}

// New checks cfg and starts the background rounds (unless Manual).
func New(cfg Config) (*Store, error) {
	_, ok := cfg.Next.(decorator.Settler)
	switch {
	case cfg.Next == nil || cfg.Ledger == nil || cfg.Now == nil:
		return nil, errors.New("regions: Next, Ledger and Now are required")
	case !ok:
		return nil, errors.New("regions: the region's store cannot settle")
	case len(cfg.Regions) == 0:
		return nil, errors.New("regions: no regions")
	case cfg.Shares != nil && len(cfg.Shares) != len(cfg.Regions):
		return nil, errors.New("regions: a share for every region")
	}
	region := -1
	for i, r := range cfg.Regions {
		if r == cfg.Region {
			region = i
		}
	}
	if region < 0 {
		return nil, fmt.Errorf("regions: region %q is not among %v", cfg.Region, cfg.Regions)
	}
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	s := &Store{base: decorator.New(cfg.Next, "the region tier"), cfg: cfg, region: region, keys: map[gkey]*gstate{}, done: make(chan struct{})}
	s.since = cfg.Now().Add(cfg.Error() + startSlack).UnixNano()
	ctx, stop := context.WithCancel(context.Background())
	s.stop = stop
	if cfg.Manual {
		close(s.done)
		return s, nil
	}
	go s.loop(ctx)
	return s, nil
}

// fill checks cfg's shares and fills in what zero means.
func (cfg *Config) fill() error {
	if cfg.Shares == nil {
		for range cfg.Regions {
			cfg.Shares = append(cfg.Shares, 1/float64(len(cfg.Regions)))
		}
	}
	sum := 0.0
	for _, f := range cfg.Shares {
		if f < 0 || math.IsNaN(f) {
			return errors.New("regions: shares must not be negative")
		}
		sum += f
	}
	if sum > 1+1e-9 {
		return fmt.Errorf("regions: shares sum to %g, more than 1", sum)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 200 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Error == nil {
		cfg.Error = func() time.Duration { return 0 }
	}
	if cfg.Sleep == nil {
		cfg.Sleep = sleep
	}
	if cfg.Plan == nil {
		cfg.Plan = plan
	}
	return nil
}

// Close stops the background rounds (not the store it wraps).
func (s *Store) Close() error {
	s.stop()
	<-s.done
	return nil
}

// Settle passes a settlement to the region's store.
func (s *Store) Settle(ctx context.Context, st *sluice.Settlement) (int64, error) {
	return s.Settler.Settle(ctx, st)
}
