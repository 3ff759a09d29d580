package main

import "github.com/sluicehq/sluice/internal/edges/dashboard"

// regionFigures reads the region tier's counters on this node for the
// dashboard's Region panel; nil without --region.
func regionFigures(set *storeSet) func() dashboard.Region {
	if set.regions == nil {
		return nil
	}
	st, name := &set.regions.Stats, set.region
	return func() dashboard.Region {
		r := dashboard.Region{
			Name: name, Allocation: st.Allocation.Load(), Demand: st.Demand.Load(),
			Admitted: st.Admitted.Load(), Denied: st.Denied.Load(),
			Granted: st.Granted.Load(), GivenBack: st.GivenBack.Load(), LedgerErrors: st.LedgerErrors.Load(),
		}
		if ns := st.LastGrant.Load(); ns > 0 {
			r.LastGrant = max(ns/1e9, 1)
		}
		return r
	}
}
