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
package regions

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/sluicehq/sluice"
)

// Ledger is the coordinator's ledger of allocations: per key, window and
// region, what the region may admit; a region absent from a window's entry
// holds its safe share. Both calls are atomic at the coordinator.
type Ledger interface {
	// Grant gives region up to want of what no region holds of limit in
	// the window starting at window (Unix ns), never letting the
	// allocations exceed limit; it returns what it gave.
	Grant(ctx context.Context, e Entry, want int64) (int64, error)
	// GiveBack returns x of region's allocation to the ledger.
	GiveBack(ctx context.Context, e Entry, x int64) error
	// Allocation returns region's allocation in the entry.
	Allocation(ctx context.Context, e Entry) (int64, error)
	// Wanted lists the entries of windows not ended at now (Unix ms)
	// that a region asked more of than was free: a region holding what
	// it does not use of one gives it back.
	Wanted(ctx context.Context, now int64) ([]Wanted, error)
}

// Entry names one ledger entry and the region asking.
type Entry struct {
	Key    string  // the counter's key and the limit's identity (entryKey)
	Window int64   // the window's start, Unix ns
	Period int64   // the window's length, ns
	TTL    int64   // ns the entry lives from its last change: a period and more
	Limit  int64   // the global limit L
	Region int     // the asking region's index in Shares
	Shares []int64 // every region's safe share
}

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
}

// Store is a region's store for global limits; every other hit goes to
// Next unchanged.
type Store struct {
	cfg    Config
	next   sluice.Store
	settle interface {
		Settle(context.Context, *sluice.Settlement) (int64, error)
	}
	each interface {
		TakeEach(context.Context, []sluice.Hit, []sluice.Decision) error
	}
	region int

	mu   sync.Mutex
	keys map[gkey]*gstate

	stop func()
	done chan struct{}

	Stats Stats
}

// Stats are the region tier's counters, for metrics.
type Stats struct {
	Granted, GivenBack, Charged atomic.Int64 // hits
	LedgerErrors                atomic.Int64
	Denied                      atomic.Int64 // hits of global limits denied
	Admitted                    atomic.Int64
	LastGrant                   atomic.Int64 // Unix ns of the last grant, 0: none
	Allocation                  atomic.Int64 // this window's known allocations, summed over keys
	Demand                      atomic.Int64 // hits asked per second, summed over keys
}

type gkey struct {
	key          string
	rate, period int64
}

// gstate is what the node knows of a global key in its current window.
type gstate struct {
	limit     *sluice.Limit
	window    int64 // start, Unix ns
	init      chan struct{}
	initErr   error
	remaining int64 // region-wide, from the last decision
	asked     int64 // hits asked (admitted or not) this window
	lastAsked int64 // asked at the last round
	rate      float64
	granted   int64 // by this node, this window
	given     int64 // given back by this node, this window
	yielded   bool  // given back for another region's want
	born      time.Time
}

// New checks cfg and starts the background rounds.
func New(cfg Config) (*Store, error) {
	st, ok := cfg.Next.(interface {
		Settle(context.Context, *sluice.Settlement) (int64, error)
	})
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
	if cfg.Shares == nil {
		for range cfg.Regions {
			cfg.Shares = append(cfg.Shares, 1/float64(len(cfg.Regions)))
		}
	}
	sum := 0.0
	for _, f := range cfg.Shares {
		if f < 0 || math.IsNaN(f) {
			return nil, errors.New("regions: shares must not be negative")
		}
		sum += f
	}
	if sum > 1+1e-9 {
		return nil, fmt.Errorf("regions: shares sum to %g, more than 1", sum)
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
	s := &Store{cfg: cfg, next: cfg.Next, settle: st, region: region, keys: map[gkey]*gstate{}, done: make(chan struct{})}
	s.each, _ = cfg.Next.(interface {
		TakeEach(context.Context, []sluice.Hit, []sluice.Decision) error
	})
	ctx, stop := context.WithCancel(context.Background())
	s.stop = stop
	go s.loop(ctx)
	return s, nil
}

// Close stops the background rounds (not the store it wraps).
func (s *Store) Close() error {
	s.stop()
	<-s.done
	return nil
}

// Unwrap returns the region's store.
func (s *Store) Unwrap() sluice.Store { return s.next }

// Health reports the region store's.
func (s *Store) Health() error {
	if h, ok := s.next.(interface{ Health() error }); ok {
		return h.Health()
	}
	return nil
}

// Settle passes a settlement to the region's store.
func (s *Store) Settle(ctx context.Context, st *sluice.Settlement) (int64, error) {
	return s.settle.Settle(ctx, st)
}

// shares returns every region's safe share of l, in hits.
func (s *Store) shares(l int64) []int64 {
	out := make([]int64, len(s.cfg.Shares))
	for i, f := range s.cfg.Shares {
		out[i] = int64(math.Floor(f * float64(l)))
	}
	return out
}

// Take implements sluice.Store: the global hits' windows are readied, then
// the region's store decides.
func (s *Store) Take(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	return s.take(ctx, hits, out, s.next.Take)
}

// TakeEach decides one by one, as the region's store does.
func (s *Store) TakeEach(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	if s.each == nil {
		return errors.New("regions: the region's store does not decide one by one")
	}
	return s.take(ctx, hits, out, s.each.TakeEach)
}

func (s *Store) take(ctx context.Context, hits []sluice.Hit, out []sluice.Decision, take func(context.Context, []sluice.Hit, []sluice.Decision) error) error {
	global := false
	for i := range hits {
		if h := &hits[i]; h.Limit.Global {
			global = true
			if err := s.ready(ctx, h); err != nil {
				return err
			}
		}
	}
	if err := take(ctx, hits, out); err != nil || !global {
		return err
	}
	s.mu.Lock()
	for i := range hits {
		h := &hits[i]
		if !h.Limit.Global {
			continue
		}
		g := s.keys[keyOf(h)]
		if g == nil {
			continue
		}
		g.asked += h.Cost
		g.remaining = out[i].Remaining
		if out[i].Allowed {
			s.Stats.Admitted.Add(h.Cost)
		} else {
			s.Stats.Denied.Add(h.Cost)
		}
	}
	s.mu.Unlock()
	return nil
}

func keyOf(h *sluice.Hit) gkey {
	return gkey{key: h.Key, rate: h.Limit.Rate, period: int64(h.Limit.Period)}
}

// windowOf returns the start of the window of l that holds t (Unix ns).
func windowOf(l *sluice.Limit, t int64) int64 {
	p := int64(l.Period)
	return t - t%p
}

// ready makes sure the window of h's key in which the store decides now
// holds the charge of the region's safe share: the first decision of a key
// in a window, on each node, charges it (once for the region) and waits.
// Within the clock's error of a window's end, it waits for the window to
// begin, so that the charge lands in the window it is for.
func (s *Store) ready(ctx context.Context, h *sluice.Hit) error {
	now := s.cfg.Now()
	p := int64(h.Limit.Period)
	t := now.UnixNano()
	ws := windowOf(h.Limit, t)
	margin := int64(s.cfg.Error()) + int64(5*time.Millisecond)
	if t-ws < margin {
		// Redis may still be in the window before.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(ws + margin - t)):
		}
	} else if ws+p-t < margin {
		// Redis may be in the next window already: wait for it.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(ws + p + margin - t)):
		}
		ws += p
	}
	k := keyOf(h)
	s.mu.Lock()
	g := s.keys[k]
	if g == nil || g.window < ws {
		// A state per window: a charge still running for an earlier one
		// closes its own. The demand carries over from the window before:
		// a rate measured from nothing would give back, on the first
		// round, what the window will need.
		prev := g
		g = &gstate{limit: h.Limit, window: ws, init: make(chan struct{}), remaining: -1, born: now}
		if prev != nil && prev.window == ws-p {
			g.rate = prev.rate
		}
		s.keys[k] = g
		go s.charge(k, h.Key, h.Limit, ws, g)
	}
	init := g.init
	s.mu.Unlock()
	select {
	case <-init:
	case <-ctx.Done():
		return ctx.Err()
	}
	s.mu.Lock()
	err := g.initErr
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("regions: charging the region's share of %q: %w", h.Limit.Name, err)
	}
	return nil
}

// charge charges key's counter in window ws what the region does not hold
// of the limit: L − its safe share, once for the region.
func (s *Store) charge(k gkey, key string, l *sluice.Limit, ws int64, g *gstate) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	share := s.shares(l.Rate)[s.region]
	st := sluice.Settlement{
		Hit:        sluice.Hit{Key: key, Limit: l},
		Spent:      l.Rate - share,
		ResetAfter: l.Period,
		At:         time.Unix(0, ws),
		ID:         settleID(s.cfg.Region, key, l, ws, "init"),
	}
	var err error
	if st.Spent > 0 {
		var moved int64
		moved, err = s.settle.Settle(ctx, &st)
		s.Stats.Charged.Add(moved)
	}
	s.mu.Lock()
	g.initErr = err
	if err != nil && s.keys[k] == g {
		delete(s.keys, k) // the next decision charges again
	}
	close(g.init)
	s.mu.Unlock()
}

// settleID is the ID of a settlement of the region on key and l in the
// window ws: the same on every node of the region, another for another
// window, limit, key or purpose.
func settleID(region, key string, l *sluice.Limit, ws int64, what string) uint64 {
	var b []byte
	b = append(b, region...)
	b = append(b, 0)
	b = append(b, key...)
	b = append(b, 0)
	b = binary.LittleEndian.AppendUint64(b, uint64(l.Rate))
	b = binary.LittleEndian.AppendUint64(b, uint64(l.Period))
	b = binary.LittleEndian.AppendUint64(b, uint64(ws))
	b = append(b, what...)
	id := xxh3.Hash(b)
	if id == 0 {
		id = 1
	}
	return id
}

// loop runs a round every Interval.
func (s *Store) loop(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.round(ctx)
		}
	}
}

// round asks for what the keys of this window need beyond what the region
// holds, and gives back what they will not use.
func (s *Store) round(ctx context.Context) {
	now := s.cfg.Now().UnixNano()
	type job struct {
		k    gkey
		g    *gstate
		want int64 // > 0 ask, < 0 give back
	}
	var jobs []job
	nodes := int64(1)
	if s.cfg.Nodes != nil {
		nodes = max(int64(s.cfg.Nodes()), 1)
	}
	var alloc, demand float64
	s.mu.Lock()
	for k, g := range s.keys {
		p := int64(g.limit.Period)
		if g.window+p <= now {
			if g.window+2*p <= now {
				delete(s.keys, k)
			}
			continue
		}
		select {
		case <-g.init:
		default:
			continue // not charged yet
		}
		// The demand: hits asked per second, smoothed over a few rounds.
		per := float64(g.asked-g.lastAsked) / s.cfg.Interval.Seconds()
		g.lastAsked = g.asked
		if g.rate == 0 {
			g.rate = per
		} else {
			g.rate = 0.7*g.rate + 0.3*per
		}
		demand += g.rate
		share := s.shares(g.limit.Rate)[s.region]
		alloc += float64(share + g.granted - g.given)
		if g.remaining < 0 {
			continue
		}
		left := float64(g.window+p-now) / 1e9
		// What the region will ask for the rest of the window, with a
		// headroom of two rounds.
		need := int64(math.Ceil(g.rate*float64(nodes)*(left+2*s.cfg.Interval.Seconds()))) + 1
		switch {
		case need > g.remaining:
			jobs = append(jobs, job{k, g, (need - g.remaining + nodes - 1) / nodes})
		case g.remaining > need+need/4+headroom(g.limit) && g.window+p-now > int64(time.Second) && now-g.born.UnixNano() >= int64(2*s.cfg.Interval):
			// A surplus beyond the need and a quarter, not near the
			// window's end: this node gives back its part of it.
			jobs = append(jobs, job{k, g, -((g.remaining - need - need/4) / nodes)})
		}
	}
	s.mu.Unlock()
	s.Stats.Allocation.Store(int64(alloc))
	s.Stats.Demand.Store(int64(demand))
	for _, j := range jobs {
		if j.want > 0 {
			s.grant(ctx, j.k, j.g, j.want)
		} else if j.want < 0 {
			s.giveBack(ctx, j.k, j.g, -j.want)
		}
	}
	s.yieldWanted(ctx, now)
}

// headroom is what a region keeps of l beyond its need: 1% of it.
func headroom(l *sluice.Limit) int64 { return max(l.Rate/100, 1) }

// yieldWanted gives back what this region holds and does not use of the
// entries another region asked more of than was free: a key this region
// has not decided in the window still holds its safe share, which it gives
// back, but for a headroom, after spending it in the region, as any
// give-back.
func (s *Store) yieldWanted(ctx context.Context, now int64) {
	c, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	wanted, err := s.cfg.Ledger.Wanted(c, now/1e6)
	if err != nil {
		s.Stats.LedgerErrors.Add(1)
		return
	}
	for _, w := range wanted {
		if w.Window > now || w.Window+w.Period-now < int64(time.Second) {
			continue
		}
		k := gkey{key: w.Key, rate: w.Rate, period: w.Period}
		s.mu.Lock()
		g := s.keys[k]
		busy := g != nil && g.window == w.Window && (g.rate > 0 || g.yielded)
		s.mu.Unlock()
		if busy {
			continue // decided here: the round gives back its surplus
		}
		l := &sluice.Limit{Name: w.Name, Algorithm: sluice.FixedWindow, Rate: w.Rate, Period: time.Duration(w.Period), Global: true}
		h := sluice.Hit{Key: w.Key, Limit: l}
		if err := s.ready(c, &h); err != nil {
			continue
		}
		var out [1]sluice.Decision
		if err := s.next.Take(c, []sluice.Hit{{Key: w.Key, Limit: l}}, out[:]); err != nil {
			continue
		}
		s.mu.Lock()
		g = s.keys[k]
		if g == nil || g.window != w.Window {
			s.mu.Unlock()
			continue
		}
		g.yielded = true
		g.remaining = out[0].Remaining
		s.mu.Unlock()
		s.giveBack(c, k, g, out[0].Remaining-headroom(l))
	}
}

func (s *Store) entry(k gkey, g *gstate) Entry {
	p := int64(g.limit.Period)
	return Entry{Key: entryKey(k.key, k.rate, k.period, g.limit.Name), Window: g.window, Period: p, TTL: p + int64(time.Minute),
		Limit: g.limit.Rate, Region: s.region, Shares: s.shares(g.limit.Rate)}
}

// grant asks the ledger for want more of k's window and refunds what it
// gives from the region's charge, in that window.
func (s *Store) grant(ctx context.Context, k gkey, g *gstate, want int64) {
	c, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	got, err := s.cfg.Ledger.Grant(c, s.entry(k, g), want)
	if err != nil {
		s.Stats.LedgerErrors.Add(1)
		s.cfg.Logger.Debug("regions: grant failed", "err", err)
		return
	}
	if got <= 0 {
		return
	}
	s.Stats.LastGrant.Store(time.Now().UnixNano())
	st := sluice.Settlement{
		Hit:        sluice.Hit{Key: k.key, Limit: g.limit, Cost: got},
		Spent:      0,
		ResetAfter: g.limit.Period,
		At:         time.Unix(0, g.window),
		ID:         settleID(s.cfg.Region, k.key, g.limit, g.window, fmt.Sprintf("grant %d %d", time.Now().UnixNano(), got)),
	}
	moved, err := s.settle.Settle(c, &st)
	if err != nil {
		s.cfg.Logger.Debug("regions: a grant could not be applied; it stays unused this window", "err", err)
		return
	}
	s.Stats.Granted.Add(-moved)
	s.mu.Lock()
	g.granted += -moved
	g.remaining += -moved
	s.mu.Unlock()
}

// giveBack spends x of k's window in the region, so that no node can admit
// it, then returns it to the ledger.
func (s *Store) giveBack(ctx context.Context, k gkey, g *gstate, x int64) {
	if x <= 0 {
		return
	}
	c, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	hits := []sluice.Hit{{Key: k.key, Limit: g.limit, Cost: x}}
	var out [1]sluice.Decision
	// The window must still be the one given back for: the take lands in
	// the store's window, so not near its end.
	if now := s.cfg.Now().UnixNano(); g.window+int64(g.limit.Period)-now < int64(time.Second) {
		return
	}
	if err := s.next.Take(c, hits, out[:]); err != nil || !out[0].Allowed {
		return
	}
	if err := s.cfg.Ledger.GiveBack(c, s.entry(k, g), x); err != nil {
		s.Stats.LedgerErrors.Add(1)
		return // spent in the region, lost to the ledger this window: never over-allocated
	}
	s.Stats.GivenBack.Add(x)
	s.mu.Lock()
	g.given += x
	g.remaining = out[0].Remaining
	s.mu.Unlock()
}

// Allocation returns this region's allocation of l for key in the window
// of now, and its safe share: the coordinator's ledger's, or, when it does
// not answer, what this node knows (its share, its grants and give-backs).
func (s *Store) Allocation(ctx context.Context, key string, l *sluice.Limit) (alloc, share int64, err error) {
	share = s.shares(l.Rate)[s.region]
	ws := windowOf(l, s.cfg.Now().UnixNano())
	k := gkey{key: key, rate: l.Rate, period: int64(l.Period)}
	g := &gstate{limit: l, window: ws}
	s.mu.Lock()
	known := share
	if cur := s.keys[k]; cur != nil && cur.window == ws {
		known += cur.granted - cur.given
	}
	s.mu.Unlock()
	c, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	alloc, err = s.cfg.Ledger.Allocation(c, s.entry(k, g))
	if err != nil {
		return known, share, err
	}
	return alloc, share, nil
}
