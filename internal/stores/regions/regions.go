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
	"github.com/sluicehq/sluice/internal/stores/decorator"
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
	// Started returns when the region's store last started, on its
	// clock (Redis: RedisStarted): a store that started in a window may
	// have lost what the region spent of it (restart.go). Nil: a store
	// that never loses its state.
	Started func(context.Context) (time.Time, error)
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
	lost      bool  // the region's store lost the key's counters; a new state replaces this one
	remaining int64 // region-wide, from the last decision; -1: none yet
	asked     int64 // hits asked (admitted or not) this window
	lastAsked int64 // asked at the last round
	rate      float64
	granted   int64 // by this node, this window
	given     int64 // given back by this node, this window
	yielded   bool  // given back for another region's want
	born      time.Time
	fresh     bool // the node had no state of the window before this one
	blind     bool // what the region spent of the window before this state is unknown here (restart.go)
}

// New checks cfg and starts the background rounds.
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
	s := &Store{base: decorator.New(cfg.Next, "the region tier"), cfg: cfg, region: region, keys: map[gkey]*gstate{}, done: make(chan struct{})}
	s.since = cfg.Now().Add(cfg.Error() + startSlack).UnixNano()
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

// Settle passes a settlement to the region's store.
func (s *Store) Settle(ctx context.Context, st *sluice.Settlement) (int64, error) {
	return s.Settler.Settle(ctx, st)
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
	return s.take(ctx, hits, out, s.Next.Take)
}

// TakeEach decides one by one, as the region's store does.
func (s *Store) TakeEach(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	if s.Each == nil {
		return errors.New("regions: the region's store does not decide one by one")
	}
	return s.take(ctx, hits, out, s.Each.TakeEach)
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
	if !global {
		return take(ctx, hits, out)
	}
	// What this node knows each global key's region has left as the
	// store is asked: an answer above it (and this node's grants since)
	// may come from counters the store lost.
	var buf [sluice.MaxHits]known
	before := buf[:0]
	s.mu.Lock()
	for i := range hits {
		var b known
		if h := &hits[i]; h.Limit.Global {
			if g := s.keys[keyOf(h)]; g != nil {
				b = known{g: g, left: s.ceiling(g), granted: g.granted}
			}
		}
		before = append(before, b)
	}
	s.mu.Unlock()
	if err := take(ctx, hits, out); err != nil {
		if ctx.Err() == nil {
			s.failed()
		}
		return err
	}
	for {
		i, g, lost := s.learn(hits, out, before)
		if g == nil {
			return nil
		}
		if !lost {
			// Above what the region can have left: its counters may
			// be lost, which the marker tells. Another node's grant
			// raises them too.
			var err error
			if lost, err = s.check(ctx, keyOf(&hits[i]), hits[i].Key, g); err != nil {
				return err
			}
		}
		if lost {
			return fmt.Errorf("%w (limit %q)", errLost, hits[i].Limit.Name)
		}
		before[i].verified = true
	}
}

// known is what a node knew of a key's region before a decision: its
// state, what it had left (Store.known), and this node's grants; verified
// once the key's marker showed an answer above it true.
type known struct {
	g             *gstate
	left, granted int64
	verified      bool
}

// learn records the decisions out of the global hits, which the store
// took while this node knew before of them: the demand, and what the
// region has left. It stops at a hit whose Remaining is above what the
// region had left and was granted since, or whose counters were found
// lost meanwhile (lost: it may have been decided on what was left of
// them), and returns it unrecorded, with its state (nil when all are
// recorded).
func (s *Store) learn(hits []sluice.Hit, out []sluice.Decision, before []known) (i int, g *gstate, lost bool) {
	now := s.cfg.Now().UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range hits {
		h, b := &hits[i], &before[i]
		g := b.g
		if !h.Limit.Global || g == nil {
			continue
		}
		rem := out[i].Remaining
		switch {
		case g.lost:
			return i, g, true
		case s.keys[keyOf(h)] != g || later(g, &out[i], now):
			continue // a new window since
		case rem > b.left+g.granted-b.granted && !b.verified:
			return i, g, false
		}
		b.g = nil
		// The least of the answers (answers to concurrent decisions come
		// in any order), but for one the marker showed true. A grant adds
		// to it (grant).
		if g.remaining < 0 || rem < g.remaining || b.verified {
			g.remaining = rem
		}
		if h.Limit.Debit {
			continue // a write-back of what the failure policy admitted
		}
		g.asked += h.Cost
		if out[i].Allowed {
			s.stats.Admitted.Add(h.Cost)
		} else {
			s.stats.Denied.Add(h.Cost)
		}
	}
	return 0, nil, false
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
	if g == nil || g.window < ws || g.window == ws && chargeFailed(g) {
		// A state per window: a charge still running for an earlier one
		// closes its own. The demand carries over from the window before:
		// a rate measured from nothing would give back, on the first
		// round, what the window will need.
		prev := g
		g = &gstate{limit: h.Limit, marker: markerOf(h.Limit), window: ws, init: make(chan struct{}), remaining: -1, born: now}
		spent := h.Limit.Rate - s.shares(h.Limit.Rate)[s.region]
		switch {
		case prev != nil && prev.window == ws:
			// The charge failed: charged again, for what the region
			// had left as far as this node knew (its safe share, or
			// after lost counters what it last learnt).
			g.carry(prev)
			spent = h.Limit.Rate - s.known(prev)
		case prev != nil && prev.window == ws-p:
			g.rate = prev.rate
		}
		if prev == nil || prev.window != ws {
			g.fresh, g.blind = true, ws < s.since
		}
		s.keys[k] = g
		go s.charge(k, h.Key, g, spent)
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
		s.failed()
		return fmt.Errorf("regions: charging the region's share of %q: %w", h.Limit.Name, err)
	}
	return nil
}

// markerRate is the rate of a charge marker's limit: one no rule uses
// (one below the largest a limit may have), so that the marker's state,
// under the key's own name (and so in its Cluster slot), is its own.
const markerRate = sluice.MaxCost - 1

// markerOf returns the limit of the charge marker of l: a fixed window of
// l's, which the charge sets (a hit of 1) before it charges the counter.
// The two live and die together in the region's store, but for eviction
// (docs/regions.md asks for a store that does not evict): a marker found
// empty (a peek's Remaining is markerRate) means the store lost the key's
// window, its counter and the charge with it.
func markerOf(l *sluice.Limit) *sluice.Limit {
	return &sluice.Limit{Name: l.Name, Algorithm: sluice.FixedWindow, Rate: markerRate, Period: l.Period, WindowOffset: l.WindowOffset}
}

// charge charges key's counter in g's window what the region does not
// hold of the limit, spent (at a window's first decision, L − its safe
// share), once for the region: a settlement whose ID names the region,
// key, limit and window, and which the region's store marks applied. The
// key's charge marker is set first, so that a store that loses the window
// (and the settlement's mark with it) shows it (lost).
func (s *Store) charge(k gkey, key string, g *gstate, spent int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, ws := g.limit, g.window
	st := sluice.Settlement{
		Hit:        sluice.Hit{Key: key, Limit: l},
		Spent:      spent,
		ResetAfter: l.Period,
		At:         time.Unix(0, ws),
		ID:         settleID(s.cfg.Region, key, l, ws, "init"),
	}
	var out [1]sluice.Decision
	err := s.Next.Take(ctx, []sluice.Hit{{Key: key, Limit: g.marker, Cost: 1}}, out[:])
	if err == nil && g.fresh {
		st.Spent = s.firstCharge(ctx, g, st.Spent)
	}
	if err == nil && st.Spent > 0 {
		var moved int64
		moved, err = s.Settler.Settle(ctx, &st)
		s.stats.Charged.Add(moved)
	}
	s.mu.Lock()
	g.initErr = err // the next decision charges again (chargeFailed)
	close(g.init)
	s.mu.Unlock()
}

// chargeFailed reports whether g's charge ended in an error. s.mu is held.
func chargeFailed(g *gstate) bool {
	select {
	case <-g.init:
		return g.initErr != nil
	default:
		return false
	}
}

// carry makes g, a new state of prev's window, keep what prev knew.
func (g *gstate) carry(prev *gstate) {
	g.born, g.rate, g.asked, g.lastAsked = prev.born, prev.rate, prev.asked, prev.lastAsked
	g.remaining, g.granted, g.given, g.yielded = prev.remaining, prev.granted, prev.given, prev.yielded
	g.blind = prev.blind
}

// known is what g's region has left of its allocation as far as this
// node knows: the store's last answer, or before one, the safe share and
// this node's grants. s.mu is held.
func (s *Store) known(g *gstate) int64 {
	if g.remaining < 0 && g.blind {
		return g.granted - g.given // the safe share counts as spent
	}
	return s.ceiling(g)
}

// ceiling is the most g's region can have left of its allocation as far
// as this node knows: the store's last answer, or before one, the safe
// share and this node's grants, blind or not. An answer above it may come
// from counters the store lost (verify); known, which a blind state lowers,
// is what this node may count on, not what the region may hold. s.mu is
// held.
func (s *Store) ceiling(g *gstate) int64 {
	if g.remaining >= 0 {
		return g.remaining
	}
	return s.shares(g.limit.Rate)[s.region] + g.granted - g.given
}

// failed notes that the region's store failed now (held).
func (s *Store) failed() {
	s.failAt.Store(s.cfg.Now().UnixNano())
}

// held reports whether a give-back of the window starting at ws (Unix ns)
// must wait: this node saw the region's store fail during it, or within a
// second and the clock's error before it, and its local failure policy
// may have admitted what the store has not counted yet (the decider writes
// it back once the store answers, when it can). A node cannot tell when
// every node's write-back has landed, so the wait lasts until the window
// ends: what the region holds unused then stays unused.
func (s *Store) held(ws int64) bool {
	return s.failAt.Load() >= ws-int64(s.cfg.Error())-int64(time.Second)
}

// lose replaces g, whose counters the region's store lost mid-window, by
// a state that charges the counter again for what the region had left as
// far as this node knew (known): the next decisions wait for it, as for
// a window's first charge. The settlement's ID is the first charge's,
// whose mark the store lost with the counter: the region's nodes charge
// it once between them.
func (s *Store) lose(k gkey, key string, g *gstate) {
	s.failed()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys[k] != g || g.lost {
		return
	}
	g.lost = true
	s.stats.Lost.Add(1)
	n := &gstate{limit: g.limit, marker: g.marker, window: g.window, init: make(chan struct{})}
	n.carry(g)
	s.keys[k] = n
	s.cfg.Logger.Warn("regions: the region's store lost a global key's counters mid-window; charging it again for what the region had left",
		"limit", g.limit.Name, "left", s.known(g))
	go s.charge(k, key, n, g.limit.Rate-s.known(g))
}

// errLost is the error of a decision taken on counters the region's store
// had lost: the failure policy answers it.
var errLost = errors.New("regions: the region's store lost this key's counters mid-window")

// check peeks k's charge marker in g's window: lost reports that the
// region's store lost the window (lose has then replaced g).
func (s *Store) check(ctx context.Context, k gkey, key string, g *gstate) (lost bool, err error) {
	var out [1]sluice.Decision
	if err := s.Next.Take(ctx, []sluice.Hit{{Key: key, Limit: g.marker}}, out[:]); err != nil {
		if ctx.Err() == nil {
			s.failed()
		}
		return false, err
	}
	if out[0].Remaining < markerRate || later(g, &out[0], s.cfg.Now().UnixNano()) {
		return false, nil
	}
	s.lose(k, key, g)
	return true, nil
}

// later reports whether the store took d, a decision of g's key (or its
// marker) answered at about now (Unix ns, by Now), in a window after g's:
// one readied near g's end but taken after the next began, whose count
// says nothing of g's window. The window's end is told by d's ResetAfter,
// to half a period.
func later(g *gstate, d *sluice.Decision, now int64) bool {
	p := int64(g.limit.Period)
	return now+int64(d.ResetAfter) > g.window+p+p/2
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
