package server

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/sluicehq/sluice/internal/edges/hitters"
	"github.com/sluicehq/sluice/internal/edges/topkeys"
)

// hittersReport is what /hitters answers for one rule.
type hittersReport struct {
	Rule   string         `json:"rule"`
	Kind   string         `json:"kind"`
	Window string         `json:"window"`
	Hits   uint64         `json:"hits"`
	Top    []hitters.Item `json:"top"`
}

// serveHitters answers /hitters: the top keys of every rule, or of
// ?rule=, by ?kind= (requests or denials, both when absent), over
// ?window= (minute, the default, or hour), ?k= of them (10). The keys of
// a rule with a concurrency limit carry the permits each holds now, read
// from the store (topkeys.InFlight: one peek of the keys listed).
func (s *Server) serveHitters(w http.ResponseWriter, r *http.Request) {
	if s.hitters == nil {
		writeError(w, http.StatusNotFound, "heavy hitters are not tracked (--top-keys=false)")
		return
	}
	q := r.URL.Query()
	k := 10
	if v := q.Get("k"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			writeError(w, http.StatusBadRequest, "k: a number from 1 to 1000")
			return
		}
		k = n
	}
	hour := false
	switch q.Get("window") {
	case "", "minute":
	case "hour":
		hour = true
	default:
		writeError(w, http.StatusBadRequest, "window: minute or hour")
		return
	}
	kinds := []hitters.Kind{hitters.Requests, hitters.Denials}
	switch q.Get("kind") {
	case "":
	case "requests":
		kinds = kinds[:1]
	case "denials":
		kinds = kinds[1:]
	default:
		writeError(w, http.StatusBadRequest, "kind: requests or denials")
		return
	}
	ruleNames := s.hitters.Rules()
	top := func(rule string, kind hitters.Kind) ([]hitters.Item, uint64) {
		return s.hitters.Top(rule, kind, hour, k)
	}
	switch q.Get("scope") {
	case "", "node":
	case "cluster":
		// Every node's top keys, merged (each node publishes its own
		// through Redis every 2 s).
		if s.hittersShared == nil {
			writeError(w, http.StatusBadRequest, "scope=cluster needs --store redis: nodes share their top keys through Redis")
			return
		}
		snaps, err := s.hittersShared.Snapshots(r.Context())
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, "the nodes' top keys: "+err.Error())
			return
		}
		ruleNames = hitters.SnapshotRules(snaps)
		top = func(rule string, kind hitters.Kind) ([]hitters.Item, uint64) {
			return hitters.Merge(snaps, rule, kind, hour, k)
		}
	default:
		writeError(w, http.StatusBadRequest, "scope: node or cluster")
		return
	}
	if rule := q.Get("rule"); rule != "" {
		ruleNames = []string{rule}
	}
	out := []hittersReport{}
	window := map[bool]string{false: "minute", true: "hour"}[hour]
	for _, rule := range ruleNames {
		lists := make([][]hitters.Item, 0, len(kinds))
		for _, kind := range kinds {
			top, total := top(rule, kind)
			if top == nil {
				top = []hitters.Item{}
			}
			lists = append(lists, top)
			out = append(out, hittersReport{Rule: rule, Kind: map[hitters.Kind]string{hitters.Requests: "requests", hitters.Denials: "denials"}[kind], Window: window, Hits: total, Top: top})
		}
		topkeys.InFlight(r.Context(), s.dec, rule, lists...)
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}
