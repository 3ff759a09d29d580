package regions

import "sync/atomic"

// Stats are the region tier's counters, for metrics: a snapshot, from
// Store.Stats.
type Stats struct {
	Granted, GivenBack, Charged int64 // hits
	LedgerErrors                int64
	Denied                      int64 // hits of global limits denied
	Admitted                    int64
	Lost                        int64 // keys whose counters the region's store lost mid-window
	LastGrant                   int64 // Unix ns of the last grant, 0: none
	Allocation                  int64 // this window's known allocations, summed over keys
	Demand                      int64 // hits asked per second, summed over keys
}

// counters are the live counts behind Stats.
type counters struct {
	Granted, GivenBack, Charged, LedgerErrors, Denied, Admitted, Lost atomic.Int64
	LastGrant, Allocation, Demand                                     atomic.Int64
}

// Stats returns a snapshot of the tier's counters.
func (s *Store) Stats() Stats {
	c := &s.stats
	return Stats{
		Granted: c.Granted.Load(), GivenBack: c.GivenBack.Load(), Charged: c.Charged.Load(),
		LedgerErrors: c.LedgerErrors.Load(), Denied: c.Denied.Load(), Admitted: c.Admitted.Load(),
		Lost: c.Lost.Load(), LastGrant: c.LastGrant.Load(), Allocation: c.Allocation.Load(), Demand: c.Demand.Load(),
	}
}
