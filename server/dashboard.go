package server

import (
	"context"
	_ "embed"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/hitters"
	"github.com/sluicehq/sluice/rules"
)

//go:embed dashboard/index.html
var dashboardHTML []byte

// Timeline keeps, per rule, what it allowed, denied and let through in
// shadow mode in each 10 s of the last 10 minutes: the dashboard's
// charts. Rules are bounded as the top keys' are (MaxTimelineRules).
type timeline struct {
	mu    sync.Mutex                               // for adding rules
	rules atomic.Pointer[map[string]*ruleTimeline] // copied on every new rule, read without a lock
}

// MaxTimelineRules bounds the rules the dashboard charts.
const MaxTimelineRules = 100

const (
	timelineStep = 10 * time.Second
	timelineLen  = 60
)

type ruleTimeline struct {
	mu      sync.Mutex
	buckets [timelineLen]timelineBucket
}

type timelineBucket struct {
	slot                    int64 // unix time / step
	allowed, denied, shadow int64
}

func newTimeline() *timeline {
	t := &timeline{}
	t.rules.Store(&map[string]*ruleTimeline{})
	return t
}

// rule returns rule's timeline, adding it (nil beyond MaxTimelineRules).
func (t *timeline) rule(rule string) *ruleTimeline {
	if r := (*t.rules.Load())[rule]; r != nil {
		return r
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.rules.Load()
	if r := old[rule]; r != nil {
		return r
	}
	if len(old) >= MaxTimelineRules {
		return nil
	}
	r := &ruleTimeline{}
	m := maps.Clone(old)
	m[rule] = r
	t.rules.Store(&m)
	return r
}

// add counts one descriptor's outcome for rule at now.
func (t *timeline) add(rule string, now time.Time, denied, shadow bool) {
	slot := now.UnixNano() / int64(timelineStep)
	r := t.rule(rule)
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	b := &r.buckets[slot%timelineLen]
	if b.slot != slot {
		*b = timelineBucket{slot: slot}
	}
	switch {
	case shadow:
		b.shadow++
	case denied:
		b.denied++
	default:
		b.allowed++
	}
}

// dashPoint is one 10 s of a rule's chart.
type dashPoint struct {
	At      int64 `json:"at"` // unix seconds, the start of the 10 s
	Allowed int64 `json:"allowed"`
	Denied  int64 `json:"denied"`
	Shadow  int64 `json:"shadow_denied"`
}

// series returns rule's last 10 minutes, oldest first.
func (t *timeline) series(rule string, now time.Time) []dashPoint {
	slot := now.UnixNano() / int64(timelineStep)
	r := (*t.rules.Load())[rule]
	if r != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
	}
	out := make([]dashPoint, 0, timelineLen)
	for s := slot - timelineLen + 1; s <= slot; s++ {
		p := dashPoint{At: s * int64(timelineStep) / int64(time.Second)}
		if r != nil {
			if b := r.buckets[s%timelineLen]; b.slot == s {
				p.Allowed, p.Denied, p.Shadow = b.allowed, b.denied, b.shadow
			}
		}
		out = append(out, p)
	}
	return out
}

func (t *timeline) ruleNames() []string {
	rules := *t.rules.Load()
	out := make([]string, 0, len(rules))
	for r := range rules {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}

// dashData is what the dashboard's page polls.
type dashData struct {
	Now       int64              `json:"now"`
	Store     string             `json:"store"`     // "up", or why not
	Requests  map[string]float64 `json:"requests"`  // sluice_requests_total by result
	Decisions map[string]float64 `json:"decisions"` // sluice_decisions_total by where
	Rules     []dashRule         `json:"rules"`
}

type dashRule struct {
	Rule      string         `json:"rule"`
	Series    []dashPoint    `json:"series"`
	Offenders []hitters.Item `json:"top_offenders"` // by denials, the last minute
	NearLimit []nearLimit    `json:"near_limit"`    // the top askers with little left
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
	for _, rule := range s.timeline.ruleNames() {
		dr := dashRule{Rule: rule, Series: s.timeline.series(rule, now), Offenders: []hitters.Item{}, NearLimit: []nearLimit{}}
		if s.hitters != nil {
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
