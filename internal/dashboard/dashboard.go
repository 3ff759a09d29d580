// Package dashboard is the live dashboard of sluice serve and sluice
// proxy: one HTML page embedded in the binary (its script and styles
// inline, nothing loaded from elsewhere) that polls its data as JSON
// every two seconds. Per rule: what it allowed, denied and let through in
// shadow mode in each 10 s of the last 10 minutes, its top offenders and
// the keys near their limit (from a hitters.Tracker); above them the
// store's health, the requests by result and where decisions were made
// (from the Prometheus registry).
package dashboard

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/hitters"
	"github.com/sluicehq/sluice/internal/wheremetric"
	"github.com/sluicehq/sluice/rules"
)

//go:embed index.html
var page []byte

// Explainer reads what is left of a descriptor's tightest limit, without
// consuming any (a peek, through the decisions' own matching), for the
// near-limit lists.
type Explainer func(ctx context.Context, domain string, descs []rules.Descriptor) (remaining, limit int64, ok bool)

// Config configures the dashboard; every field may be nil or empty.
type Config struct {
	// Title is the page's heading ("sluice serve", "sluice proxy").
	Title string

	// Tracker gives the rules' series and top keys. Nil shows no rules.
	Tracker *hitters.Tracker

	// Gatherer gives the request counts (RequestsMetric, by its label
	// result) and sluice_decisions_total by where.
	Gatherer prometheus.Gatherer

	// RequestsMetric is the counter of requests by result.
	RequestsMetric string

	// StoreHealth is the store's state: nil when it is up.
	StoreHealth func() error

	// Explain, when set, lists the top askers of each rule with a fifth
	// or less of their limit left.
	Explain Explainer

	// Domains, when set, gives the domains in force, so that a rule (a
	// stats key, the domain and "." before the rest) whose domain has
	// dots in it is explained in its own domain. Nil: the domain is what
	// comes before the first ".".
	Domains func() []string

	// Cluster, when set, gives every node's top keys (hitters.Shared's
	// Snapshots): the offenders and near-limit lists are then the
	// cluster's, merged, and the rules those of any node. The series stay
	// this node's. When it fails, the page says so and shows this node's.
	Cluster func(ctx context.Context) ([]hitters.Snapshot, error)
}

// Register serves the page at GET /dashboard and its data at GET
// /dashboard/data on mux.
func Register(mux *http.ServeMux, cfg Config) {
	mux.HandleFunc("GET /dashboard", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'")
		w.Write(page)
	})
	mux.HandleFunc("GET /dashboard/data", cfg.serveData)
}

// data is what the page polls.
type data struct {
	Title     string             `json:"title"`
	Now       int64              `json:"now"`
	Scope     string             `json:"scope"`     // whose top keys: "this node", "cluster (N nodes)", or why not the cluster
	Store     string             `json:"store"`     // "up", or why not
	Requests  map[string]float64 `json:"requests"`  // the requests counter by result
	Decisions map[string]float64 `json:"decisions"` // sluice_decisions_total by where
	Rules     []rule             `json:"rules"`
}

type rule struct {
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

func (cfg Config) serveData(w http.ResponseWriter, r *http.Request) {
	d := data{Title: cfg.Title, Now: time.Now().Unix(), Store: "up", Requests: map[string]float64{}, Decisions: map[string]float64{}, Rules: []rule{}}
	if cfg.StoreHealth != nil {
		if err := cfg.StoreHealth(); err != nil {
			d.Store = err.Error()
		}
	}
	if cfg.Gatherer != nil {
		if mfs, err := cfg.Gatherer.Gather(); err == nil {
			for _, mf := range mfs {
				var into map[string]float64
				var label string
				switch mf.GetName() {
				case cfg.RequestsMetric:
					into, label = d.Requests, "result"
				case wheremetric.Name:
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
	if t := cfg.Tracker; t != nil {
		d.Scope = "this node"
		names := t.Rules()
		top := func(rule string, kind hitters.Kind, k int) []hitters.Item {
			items, _ := t.Top(rule, kind, false, k)
			return items
		}
		if cfg.Cluster != nil {
			if snaps, err := cfg.Cluster(r.Context()); err != nil {
				d.Scope = "this node (the cluster's top keys: " + err.Error() + ")"
			} else {
				d.Scope = fmt.Sprintf("cluster (%d nodes)", len(snaps))
				names = hitters.SnapshotRules(snaps, names...)
				top = func(rule string, kind hitters.Kind, k int) []hitters.Item {
					items, _ := hitters.Merge(snaps, rule, kind, false, k)
					return items
				}
			}
		}
		var domains []string
		if cfg.Domains != nil {
			domains = cfg.Domains()
		}
		for _, name := range names {
			dr := rule{Rule: name, Series: t.Series(name), Offenders: []hitters.Item{}, NearLimit: []nearLimit{}}
			if items := top(name, hitters.Denials, 5); items != nil {
				dr.Offenders = items
			}
			if cfg.Explain != nil {
				askers := top(name, hitters.Requests, 10)
				domain := domainOf(name, domains)
				for _, a := range askers {
					if a.Truncated { // not the whole key: its counter is not known
						continue
					}
					remaining, limit, ok := cfg.Explain(r.Context(), domain, []rules.Descriptor{{Entries: ParseKey(a.Key), Cost: 1}})
					if ok && limit > 0 && remaining*5 <= limit {
						dr.NearLimit = append(dr.NearLimit, nearLimit{Key: a.Key, Requests: a.High, Remaining: remaining, Limit: limit})
					}
				}
			}
			d.Rules = append(d.Rules, dr)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(d)
}

// domainOf is the domain of a rule's stats key: the longest of domains
// that the key starts with, followed by "."; else what comes before its
// first ".".
func domainOf(rule string, domains []string) string {
	best := ""
	for _, d := range domains {
		if len(d) > len(best) && len(rule) > len(d) && rule[len(d)] == '.' && rule[:len(d)] == d {
			best = d
		}
	}
	if best == "" {
		best, _, _ = strings.Cut(rule, ".")
	}
	return best
}

// ParseKey reads a top key back into entries (hitters.Entries).
func ParseKey(k string) []rules.Entry {
	var out []rules.Entry
	for _, kv := range hitters.Entries(k) {
		out = append(out, rules.Entry{Key: kv[0], Value: kv[1]})
	}
	return out
}

// TightestLimit reads, for the near-limit list, what is left of a
// descriptor's tightest limit: a peek, through the decisions' own
// matching (decide.Decider.Explain).
func TightestLimit(dec *decide.Decider) Explainer {
	return func(ctx context.Context, domain string, descs []rules.Descriptor) (int64, int64, bool) {
		e, err := dec.Explain(ctx, domain, descs)
		if err != nil || len(e.Descriptors) == 0 {
			return 0, 0, false
		}
		found := false
		var remaining, limit int64
		for _, l := range e.Descriptors[0].Limits {
			if l.State == nil || l.State.Limit <= 0 {
				continue
			}
			if !found || l.State.Remaining*limit < remaining*l.State.Limit {
				remaining, limit, found = l.State.Remaining, l.State.Limit, true
			}
		}
		return remaining, limit, found
	}
}
