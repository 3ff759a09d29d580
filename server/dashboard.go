package server

import (
	"context"
	_ "embed"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice/hitters"
	"github.com/sluicehq/sluice/rules"
)

//go:embed dashboard/index.html
var dashboardHTML []byte

// dashData is what the dashboard's page polls.
type dashData struct {
	Now       int64              `json:"now"`
	Store     string             `json:"store"`     // "up", or why not
	Requests  map[string]float64 `json:"requests"`  // sluice_requests_total by result
	Decisions map[string]float64 `json:"decisions"` // sluice_decisions_total by where
	Rules     []dashRule         `json:"rules"`
}

type dashRule struct {
	Rule      string          `json:"rule"`
	Series    []hitters.Point `json:"series"`
	Offenders []hitters.Item  `json:"top_offenders"` // by denials, the last minute
	NearLimit []nearLimit     `json:"near_limit"`    // the top askers with little left
}

// nearLimit is a key that asks much and has little of its limit left.
type nearLimit struct {
	Key       string `json:"key"`
	Requests  uint64 `json:"requests"` // in the last minute
	Remaining int64  `json:"remaining"`
	Limit     int64  `json:"limit"`
}

// Explainer reads a counter's state for the dashboard's near-limit list
// (decide.Decider.Explain, with the same matching as decisions).
type Explainer func(ctx context.Context, domain string, descs []rules.Descriptor) (remaining, limit int64, ok bool)

// serveDashboard serves the page, and its data at /dashboard/data.
func (s *Server) serveDashboard(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'")
	w.Write(dashboardHTML)
}

func (s *Server) serveDashboardData(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	d := dashData{Now: now.Unix(), Store: "up", Requests: map[string]float64{}, Decisions: map[string]float64{}, Rules: []dashRule{}}
	if err := s.storeHealth(); err != nil {
		d.Store = err.Error()
	}
	if s.reg != nil {
		if mfs, err := s.reg.Gather(); err == nil {
			for _, mf := range mfs {
				var into map[string]float64
				var label string
				switch mf.GetName() {
				case "sluice_requests_total":
					into, label = d.Requests, "result"
				case "sluice_decisions_total":
					into, label = d.Decisions, "where"
				default:
					continue
				}
				for _, m := range mf.GetMetric() {
					for _, lp := range m.GetLabel() {
						if lp.GetName() == label {
							into[lp.GetValue()] += m.GetCounter().GetValue()
						}
					}
				}
			}
		}
	}
	var ruleNames []string
	if s.hitters != nil {
		ruleNames = s.hitters.Rules()
	}
	for _, rule := range ruleNames {
		dr := dashRule{Rule: rule, Series: s.hitters.Series(rule), Offenders: []hitters.Item{}, NearLimit: []nearLimit{}}
		{
			if top, _ := s.hitters.Top(rule, hitters.Denials, false, 5); top != nil {
				dr.Offenders = top
			}
			if s.explain != nil {
				askers, _ := s.hitters.Top(rule, hitters.Requests, false, 10)
				for _, a := range askers {
					domain, _, _ := strings.Cut(rule, ".")
					remaining, limit, ok := s.explain(r.Context(), domain, []rules.Descriptor{{Entries: parseKey(a.Key), Cost: 1}})
					if ok && limit > 0 && remaining*5 <= limit {
						dr.NearLimit = append(dr.NearLimit, nearLimit{Key: a.Key, Requests: a.High, Remaining: remaining, Limit: limit})
					}
				}
			}
		}
		d.Rules = append(d.Rules, dr)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(d)
}

// parseKey reads a top key, key=value pairs joined by "/", back into
// entries.
func parseKey(k string) []rules.Entry {
	var out []rules.Entry
	for part := range strings.SplitSeq(k, "/") {
		key, value, _ := strings.Cut(part, "=")
		out = append(out, rules.Entry{Key: key, Value: value})
	}
	return out
}
