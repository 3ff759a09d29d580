package server

import "github.com/sluicehq/sluice/internal/edges/dashboard"

// Explainer reads a counter's state for the dashboard's near-limit list
// (decide.Decider.Explain, with the same matching as decisions).
type Explainer = dashboard.Explainer

// dashboardConfig is the dashboard of the debug listener.
func (s *Server) dashboardConfig() dashboard.Config {
	cfg := dashboard.Config{Title: "sluice serve", Tracker: s.hitters, RequestsMetric: "sluice_requests_total", StoreHealth: s.storeHealth, Explain: s.explain, InFlight: dashboard.HeldPermits(s.dec), Region: s.region}
	if s.reg != nil {
		cfg.Gatherer = s.reg
	}
	cfg.Domains = func() []string {
		if c := s.dec.Rules(); c != nil {
			return c.Domains()
		}
		return nil
	}
	if s.hittersShared != nil {
		cfg.Cluster = s.hittersShared.Snapshots
	}
	return cfg
}
