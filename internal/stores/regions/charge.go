package regions

import (
	"context"
	"encoding/binary"
	"errors"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/sluicehq/sluice"
)

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
	g.born, g.rate, g.memo, g.asked, g.lastAsked = prev.born, prev.rate, prev.memo, prev.asked, prev.lastAsked
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
