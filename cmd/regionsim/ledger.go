package main

import (
	"context"
	"slices"
	"strconv"

	"github.com/sluicehq/sluice/internal/stores/regions"
)

// The coordinator's ledger, in the simulation's memory: regions.Ledger,
// as regions.RedisLedger keeps it in Redis. A node's calls go through
// nodeLedger, which parks the node's proc until the answer comes back
// (half a round trip there, half back) or the call times out; the
// coordinator applies a call when it arrives (coordinate).

// op is a ledger call's operation.
type op int

const (
	opGrant op = iota + 1
	opGiveBack
	opWanted
	opAllocation
)

// call is one call to the ledger, with its answer.
type call struct {
	op     op
	e      regions.Entry
	x      int64 // asked (grant) or given back
	now    int64 // Wanted's now, Unix ms
	w      int64 // the entry's window id
	yield  bool  // a give-back for the wanted set
	g      int64 // granted (or allocated: Allocation)
	wanted []regions.Wanted
}

// entry is the ledger's entry of one window: each region's allocation,
// its safe share until it calls.
type entry struct {
	w     int64
	alloc []int64
	sum   int64
}

// ledger is the coordinator's state.
type ledger struct {
	entries []*entry                  // the entries alive, oldest first
	wanted  map[string]regions.Wanted // entries a grant fell short of, by entry and window
	ends    map[string]int64          // their windows' ends, Unix ms
}

// entry is the entry of window w, made on first use from shares: every
// region absent, read as its safe share.
func (l *ledger) entry(w int64, shares []int64) *entry {
	for _, e := range l.entries {
		if e.w == w {
			return e
		}
	}
	e := &entry{w: w, alloc: slices.Clone(shares)}
	for _, s := range shares {
		e.sum += s
	}
	l.entries = append(l.entries, e)
	return e
}

// coordinate applies c at the coordinator, as the ledger's script does,
// for region i. The grant is the real policy's (regions.Grantable) but
// for -grant all (the design: all that is free) and the broken "nocap".
func (s *sim) coordinate(i int, c *call) {
	switch c.op {
	case opWanted:
		for k, w := range s.led.wanted {
			if s.led.ends[k] >= c.now {
				c.wanted = append(c.wanted, w)
			}
		}
		slices.SortFunc(c.wanted, func(a, b regions.Wanted) int { return int(a.Window - b.Window) })
	case opAllocation:
		c.g = s.led.entry(c.w, c.e.Shares).alloc[i]
	case opGiveBack:
		e := s.led.entry(c.w, c.e.Shares)
		x := min(c.x, e.alloc[i])
		e.alloc[i] -= x
		e.sum -= x
		s.r.GivenTotal += x
		if c.yield {
			s.r.Yielded += x
		}
	case opGrant:
		e := s.led.entry(c.w, c.e.Shares)
		free := s.c.limit - e.sum
		g := regions.Grantable(free, c.x)
		switch {
		case s.c.broken == "nocap":
			g = c.x
		case s.c.grant == "all":
			g = min(c.x, max(free, 0))
		}
		if g < c.x && s.c.wanted {
			if w, ok := c.e.Wanted(); ok {
				k := strconv.FormatInt(c.w, 10) + "/" + c.e.Key
				s.led.wanted[k] = w
				s.led.ends[k] = (c.e.Window + c.e.Period) / 1e6
			}
		}
		e.alloc[i] += g
		e.sum += g
		c.g = g
		s.r.GrantedTotal += g
		if c.w < int64(len(s.stats)) {
			st := &s.stats[c.w]
			st.LedgerMax = max(st.LedgerMax, e.sum)
		}
	}
}

// expire drops the ledger's entry of window w and its wanted mark.
func (l *ledger) expire(w int64) {
	l.entries = slices.DeleteFunc(l.entries, func(x *entry) bool { return x.w == w })
	for k, x := range l.wanted {
		if x.Window == w {
			delete(l.wanted, k)
			delete(l.ends, k)
		}
	}
}

// nodeLedger is the ledger as node (region, node) calls it.
type nodeLedger struct {
	s            *sim
	region, node int
}

func (l *nodeLedger) call(c *call) error {
	c.w = l.s.windowID(c.e.Window)
	return l.s.sched.wait(&park{kind: parkCall, region: l.region, node: l.node, call: c})
}

// Grant implements regions.Ledger.
func (l *nodeLedger) Grant(_ context.Context, e regions.Entry, want int64) (int64, error) {
	c := &call{op: opGrant, e: e, x: want}
	err := l.call(c)
	return c.g, err
}

// GiveBack implements regions.Ledger.
func (l *nodeLedger) GiveBack(_ context.Context, e regions.Entry, x int64) error {
	return l.call(&call{op: opGiveBack, e: e, x: x})
}

// Allocation implements regions.Ledger.
func (l *nodeLedger) Allocation(_ context.Context, e regions.Entry) (int64, error) {
	c := &call{op: opAllocation, e: e}
	err := l.call(c)
	return c.g, err
}

// Wanted implements regions.Ledger. Without the wanted set (-wanted=false)
// it answers none, at once: no call is made.
func (l *nodeLedger) Wanted(_ context.Context, now int64) ([]regions.Wanted, error) {
	if !l.s.c.wanted {
		return nil, nil
	}
	c := &call{op: opWanted, now: now}
	err := l.call(c)
	return c.wanted, err
}

// windowID is the simulation's id of the window starting at ws (Unix ns).
func (s *sim) windowID(ws int64) int64 {
	return (ws - s.start.UnixNano()) / int64(s.c.window)
}

var _ regions.Ledger = (*nodeLedger)(nil)
