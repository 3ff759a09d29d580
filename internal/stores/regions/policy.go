package regions

import (
	"math"
	"time"

	"github.com/sluicehq/sluice"
)

// The allocation policy: what a region holds without asking, what a round
// asks for or gives back, and what the ledger grants. Written once, here;
// ledgerLua mirrors Grantable, and cmd/regionsim runs these very functions.

// shares returns every region's safe share of l, in hits.
func (s *Store) shares(l int64) []int64 {
	out := make([]int64, len(s.cfg.Shares))
	for i, f := range s.cfg.Shares {
		out[i] = int64(math.Floor(f * float64(l)))
	}
	return out
}

// headroom is what a region keeps of l beyond its need: 1% of it.
func headroom(l *sluice.Limit) int64 { return max(l.Rate/100, 1) }

// smooth is a key's demand, hits asked a second, after a round that
// measured per: smoothed over a few rounds, from per at the first.
func smooth(rate, per float64) float64 {
	if rate == 0 {
		return per
	}
	return 0.7*rate + 0.3*per
}

// Demand is what a round knows of a key, for the allocation policy
// (plan, or Config.Plan), which sets Rate and Memo.
type Demand struct {
	Limit     *sluice.Limit
	Asked     int64         // hits asked of the key on this node since the last round
	Remaining int64         // what the region has left, as this node last learnt it; -1: not yet
	Left      time.Duration // until the window's end
	Known     time.Duration // since this node first knew the key in the window
	Nodes     int64         // the region's nodes
	Interval  time.Duration // between rounds
	// Rate is the key's demand on this node, hits asked a second, and
	// Memo the policy's own; both carry over from the window before.
	// Rate is the region's demand in the tier's Stats, and a key with a
	// Rate gives back no more for the wanted set than its round does.
	Rate float64
	Memo any
}

// plan is the allocation policy as built: what a node asks the ledger
// for (> 0) or gives back (< 0) of a key in a round, or 0. The rate is
// smoothed (smooth); the region needs, for the rest of the window with a
// headroom of two rounds, its demand (the rate times its nodes) and 1; a
// node asks for its part of what the region lacks of it, or gives back
// its part of a surplus beyond the need and a quarter, but not near the
// window's end nor in the key's first two rounds of it, when a rate
// measured from nothing would give back what the window will need.
func plan(d *Demand) int64 {
	d.Rate = smooth(d.Rate, float64(d.Asked)/d.Interval.Seconds())
	if d.Remaining < 0 {
		return 0
	}
	need := int64(math.Ceil(d.Rate*float64(d.Nodes)*(float64(d.Left)/1e9+2*d.Interval.Seconds()))) + 1
	switch {
	case need > d.Remaining:
		return (need - d.Remaining + d.Nodes - 1) / d.Nodes
	case d.Remaining > need+need/4+headroom(d.Limit) && d.Left > time.Second && d.Known >= 2*d.Interval:
		return -((d.Remaining - need - need/4) / d.Nodes)
	}
	return 0
}

// Grantable is what a grant gives of want when free is what no region
// holds of the limit: at most half of it (at least 1, when any), so that
// regions asking at once share it; a region asking alone gets it over a
// few rounds. ledgerLua computes the same.
func Grantable(free, want int64) int64 {
	if free <= 0 {
		return 0
	}
	return min(want, max((free+1)/2, min(free, 1)))
}
