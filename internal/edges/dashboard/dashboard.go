// Package dashboard is the live dashboard of sluice serve and sluice
// proxy: one HTML page embedded in the binary (its script and styles
// inline, nothing loaded from elsewhere) that polls its data as JSON
// every two seconds. Per rule: what it allowed, denied and let through in
// shadow mode in each 10 s of the last 10 minutes, its top offenders and
// the keys near their limit (from a hitters.Tracker), and for a rule with
// a concurrency limit the permits its top askers hold; above them the
// store's health, the requests by result and where decisions were made
// (from the Prometheus registry), and, with the region tier, the node's
// region: its allocation, demand, admissions and calls to the coordinator.
package dashboard

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/base/wheremetric"
	"github.com/sluicehq/sluice/internal/edges/hitters"
	"github.com/sluicehq/sluice/internal/edges/topkeys"
	"github.com/sluicehq/sluice/rules"
)

//go:embed index.html
var page []byte

// Explainer reads what is left of a descriptor's tightest limit, without
// consuming any (a peek, through the decisions' own matching), for the
// near-limit lists.
type Explainer func(ctx context.Context, domain string, descs []rules.Descriptor) (remaining, limit int64, ok bool)

// InFlightReader sets, on the top keys of lists, of rule, the permits the
// keys of a concurrency limit hold now (topkeys.InFlight).
type InFlightReader func(ctx context.Context, rule string, lists ...[]hitters.Item)

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

	// InFlight, when set, reads the permits held now by the top keys of
	// each rule with a concurrency limit: its offenders get an in-flight
	// column, and its top askers of the last hour a list. Nil: none.
	InFlight InFlightReader

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

	// Region, when set, gives this node's figures of the region tier
	// (sluice serve --region), shown in a Region panel. Nil: no region
	// tier, no panel.
	Region func() Region
}

// Region is what a node knows of its region's global limits: the region
// tier's counters on this node (internal/stores/regions.Stats), as the page reads
// them.
type Region struct {
	Name         string `json:"name"`
	Allocation   int64  `json:"allocation"`    // this window's, of the keys decided here, in hits
	Demand       int64  `json:"demand"`        // hits of global limits asked a second, smoothed
	Admitted     int64  `json:"admitted"`      // hits of global limits admitted here
	Denied       int64  `json:"denied"`        // hits of global limits denied here
	Granted      int64  `json:"granted"`       // hits the coordinator granted beyond the safe share
	GivenBack    int64  `json:"given_back"`    // hits given back to the coordinator
	LedgerErrors int64  `json:"ledger_errors"` // calls to the coordinator that failed
	LastGrant    int64  `json:"last_grant"`    // Unix seconds of the last grant; 0: none
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
	Region    *Region            `json:"region,omitempty"` // nil: no region tier
}

type rule struct {
	Rule      string          `json:"rule"`
	Series    []hitters.Point `json:"series"`
	Offenders []hitters.Item  `json:"top_offenders"` // by denials, the last minute
	NearLimit []nearLimit     `json:"near_limit"`    // the top askers with little left
	// InFlight is, for a rule with a concurrency limit, its top askers
	// of the last hour with the permits each holds now; empty for other
	// rules.
	InFlight []hitters.Item `json:"in_flight"`
}

// nearLimit is a key that asks much and has little of its limit left.
type nearLimit struct {
	Key       string `json:"key"`
	Requests  uint64 `json:"requests"` // in the last minute
	Remaining int64  `json:"remaining"`
	Limit     int64  `json:"limit"`
}

// serveData answers the page's poll: the store's state, the request and
// decision counts, the rules, and the region.
func (cfg Config) serveData(w http.ResponseWriter, r *http.Request) {
	d := data{Title: cfg.Title, Now: time.Now().Unix(), Store: cfg.storeState(), Requests: map[string]float64{}, Decisions: map[string]float64{}, Rules: []rule{}}
	cfg.count(d.Requests, d.Decisions)
	if cfg.Tracker != nil {
		d.Scope, d.Rules = cfg.rules(r.Context())
	}
	if cfg.Region != nil {
		g := cfg.Region()
		d.Region = &g
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(d)
}

// storeState is "up", or why the store is not.
func (cfg Config) storeState() string {
	if cfg.StoreHealth != nil {
		if err := cfg.StoreHealth(); err != nil {
			return err.Error()
		}
	}
	return "up"
}

// count adds up, from the Gatherer, the requests counter by its label
// result into requests and sluice_decisions_total by where into
// decisions. Without a Gatherer, or when it fails, both stay empty.
func (cfg Config) count(requests, decisions map[string]float64) {
	if cfg.Gatherer == nil {
		return
	}
	mfs, err := cfg.Gatherer.Gather()
	if err != nil {
		return
	}
	for _, mf := range mfs {
		var into map[string]float64
		var label string
		switch mf.GetName() {
		case cfg.RequestsMetric:
			into, label = requests, "result"
		case wheremetric.Name:
			into, label = decisions, "where"
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

// topFunc reads the top k keys of a rule by kind, over the last minute or
// (hour) the last hour.
type topFunc func(rule string, kind hitters.Kind, hour bool, k int) []hitters.Item

// rules is every rule of the Tracker (or of the cluster) with its series,
// its top offenders, with Explain its keys near their limit and with
// InFlight its askers' permits held; scope says whose top keys they are.
func (cfg Config) rules(ctx context.Context) (scope string, out []rule) {
	scope, names, top := cfg.topKeys(ctx)
	var domains []string
	if cfg.Domains != nil {
		domains = cfg.Domains()
	}
	out = []rule{}
	for _, name := range names {
		dr := rule{Rule: name, Series: cfg.Tracker.Series(name), Offenders: []hitters.Item{}, NearLimit: []nearLimit{}, InFlight: []hitters.Item{}}
		if items := top(name, hitters.Denials, false, 5); items != nil {
			dr.Offenders = items
		}
		var askers []hitters.Item
		if cfg.Explain != nil {
			askers = top(name, hitters.Requests, false, 10)
		}
		if cfg.InFlight != nil {
			// The hour's askers: a stream holds its permit for minutes
			// after it asked.
			hourly := top(name, hitters.Requests, true, 10)
			cfg.InFlight(ctx, name, dr.Offenders, hourly)
			for _, a := range hourly {
				if a.InFlight != nil {
					dr.InFlight = append(dr.InFlight, a)
				}
			}
		}
		if cfg.Explain != nil {
			dr.NearLimit = cfg.nearTheirLimit(ctx, topkeys.Domain(name, domains), askers)
		}
		out = append(out, dr)
	}
	return scope, out
}

// topKeys returns whose top keys the page shows, the rules to show, and
// how to read a rule's top keys: this node's, or with Cluster the
// cluster's, merged, unless Cluster fails.
func (cfg Config) topKeys(ctx context.Context) (scope string, names []string, top topFunc) {
	t := cfg.Tracker
	names = t.Rules()
	top = func(rule string, kind hitters.Kind, hour bool, k int) []hitters.Item {
		items, _ := t.Top(rule, kind, hour, k)
		return items
	}
	if cfg.Cluster == nil {
		return "this node", names, top
	}
	snaps, err := cfg.Cluster(ctx)
	if err != nil {
		return "this node (the cluster's top keys: " + err.Error() + ")", names, top
	}
	return fmt.Sprintf("cluster (%d nodes)", len(snaps)), hitters.SnapshotRules(snaps, names...), func(rule string, kind hitters.Kind, hour bool, k int) []hitters.Item {
		items, _ := hitters.Merge(snaps, rule, kind, hour, k)
		return items
	}
}

// nearTheirLimit is those of askers, keys of a rule of domain, that have a
// fifth or less of their limit left, as Explain reads it.
func (cfg Config) nearTheirLimit(ctx context.Context, domain string, askers []hitters.Item) []nearLimit {
	near := []nearLimit{}
	for _, a := range askers {
		if a.Truncated { // not the whole key: its counter is not known
			continue
		}
		remaining, limit, ok := cfg.Explain(ctx, domain, []rules.Descriptor{{Entries: topkeys.ParseKey(a.Key), Cost: 1}})
		if ok && limit > 0 && remaining*5 <= limit {
			near = append(near, nearLimit{Key: a.Key, Requests: a.High, Remaining: remaining, Limit: limit})
		}
	}
	return near
}

// HeldPermits reads, for the dashboard, the permits the top keys of a
// concurrency limit hold now, from dec's store (topkeys.InFlight).
func HeldPermits(dec *decide.Decider) InFlightReader {
	return func(ctx context.Context, rule string, lists ...[]hitters.Item) {
		topkeys.InFlight(ctx, dec, rule, lists...)
	}
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
