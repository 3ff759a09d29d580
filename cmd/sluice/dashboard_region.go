package main

import "github.com/sluicehq/sluice/internal/edges/dashboard"

// regionFigures reads the region tier's counters on this node for the
// dashboard's Region panel; nil without --region.
func regionFigures(set *storeSet) func() dashboard.Region {
	if set.Regions == nil {
		return nil
	}
	rs, name := set.Regions, set.Region
	return func() dashboard.Region {
		st := rs.Stats()
		r := dashboard.Region{
			Name: name, Allocation: st.Allocation, Demand: st.Demand,
			Admitted: st.Admitted, Denied: st.Denied,
			Granted: st.Granted, GivenBack: st.GivenBack, LedgerErrors: st.LedgerErrors,
		}
		if ns := st.LastGrant; ns > 0 {
			r.LastGrant = max(ns/1e9, 1)
		}
		return r
	}
}
