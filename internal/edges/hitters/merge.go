package hitters

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"
)

// Snapshot is a node's top keys, to be merged with other nodes': per rule,
// kind and window, its top list, its hits, and the most a key absent from
// its list may have had there (Floor).
type Snapshot struct {
	Node  string         `json:"node"`
	At    time.Time      `json:"at"`
	Lists []SnapshotList `json:"lists"`
}

// SnapshotList is one rule's top list of one kind over one window.
type SnapshotList struct {
	Rule  string `json:"rule"`
	Kind  Kind   `json:"kind"`
	Hour  bool   `json:"hour"`
	Hits  uint64 `json:"hits"`
	Floor uint64 `json:"floor"` // the most a key not listed may have had
	Top   []Item `json:"top"`
}

// Snapshot returns t's top k keys of every rule, kind and window. A key
// not listed had at most the k-th count of its list (or the window's
// summaries' bound, if the list is shorter than k).
func (t *Tracker) Snapshot(node string, k int) Snapshot {
	s := Snapshot{Node: node, At: t.Now()}
	for _, rule := range t.Rules() {
		for _, kind := range []Kind{Requests, Denials} {
			for _, hour := range []bool{false, true} {
				top, hits := t.Top(rule, kind, hour, k+1)
				l := SnapshotList{Rule: rule, Kind: kind, Hour: hour, Hits: hits}
				if len(top) > k {
					l.Floor = top[k].High
					top = top[:k]
				} else {
					// Not held at all: at most the window's bound.
					l.Floor = hits / uint64(t.cfg.Counters)
				}
				if len(top) == 0 && hits == 0 {
					continue
				}
				l.Top = top
				s.Lists = append(s.Lists, l)
			}
		}
	}
	return s
}

// Merge merges the nodes' lists of rule, kind and window into one top k:
// a key's High adds up its High where listed and the list's Floor where
// not; its Low adds up its Low where listed. Hits add up.
func Merge(snaps []Snapshot, rule string, kind Kind, hour bool, k int) ([]Item, uint64) {
	var lists []SnapshotList
	for _, s := range snaps {
		for _, l := range s.Lists {
			if l.Rule == rule && l.Kind == kind && l.Hour == hour {
				lists = append(lists, l)
			}
		}
	}
	byKey := map[string]*Item{}
	var hits uint64
	for _, l := range lists {
		hits += l.Hits
		for _, it := range l.Top {
			m := byKey[it.Key]
			if m == nil {
				m = &Item{Key: it.Key, Truncated: it.Truncated}
				byKey[it.Key] = m
			}
			m.Low += it.Low
		}
	}
	for key, m := range byKey {
		for _, l := range lists {
			i := slices.IndexFunc(l.Top, func(it Item) bool { return it.Key == key })
			if i >= 0 {
				m.High += l.Top[i].High
			} else {
				m.High += l.Floor
			}
		}
	}
	out := make([]Item, 0, len(byKey))
	for _, m := range byKey {
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b Item) int {
		if a.High != b.High {
			if a.High > b.High {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Key, b.Key)
	})
	if len(out) > k {
		out = out[:k]
	}
	return out, hits
}

// Shared publishes a node's snapshot to a shared hash (a Redis hash every
// node reaches) and reads every node's, so that any node can show the top
// keys of all of them: one field a node, its snapshot as JSON, each
// snapshot dropped by readers once older than MaxAge.
type Shared struct {
	hash Hash
	node string
	t    *Tracker
	k    int
}

// Hash is the few calls of a hash that Shared makes (the command gives one
// over the Redis store's client): set a field, read them all, delete one.
type Hash interface {
	Set(ctx context.Context, field, value string) error
	All(ctx context.Context) (map[string]string, error)
	Delete(ctx context.Context, field string) error
}

// SnapshotRules is the rules of the snapshots and of more (the rules of
// this node, say), each once, sorted: the rules of a cluster view.
func SnapshotRules(snaps []Snapshot, more ...string) []string {
	var out []string
	for _, sn := range snaps {
		for _, l := range sn.Lists {
			out = append(out, l.Rule)
		}
	}
	out = append(out, more...)
	slices.Sort(out)
	return slices.Compact(out)
}

// MaxAge is how old a node's snapshot may be before it is ignored (the
// node is gone): five publications.
const MaxAge = 10 * time.Second

// PublishEvery is how often a node publishes.
const PublishEvery = 2 * time.Second

// NewShared returns the sharing of t's top k keys under node, in hash.
func NewShared(t *Tracker, hash Hash, node string, k int) *Shared {
	return &Shared{hash: hash, node: node, t: t, k: k}
}

// Run publishes every PublishEvery until ctx ends.
func (s *Shared) Run(ctx context.Context) {
	tick := time.NewTicker(PublishEvery)
	defer tick.Stop()
	for {
		s.Publish(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Publish writes this node's snapshot now.
func (s *Shared) Publish(ctx context.Context) error {
	data, err := json.Marshal(s.t.Snapshot(s.node, s.k))
	if err != nil {
		return err
	}
	return s.hash.Set(ctx, s.node, string(data))
}

// Snapshots reads every node's snapshot no older than MaxAge (by this
// node's clock), dropping the older ones from Redis.
func (s *Shared) Snapshots(ctx context.Context) ([]Snapshot, error) {
	all, err := s.hash.All(ctx)
	if err != nil {
		return nil, err
	}
	now := s.t.Now()
	var out []Snapshot
	for node, raw := range all {
		var snap Snapshot
		if json.Unmarshal([]byte(raw), &snap) != nil || now.Sub(snap.At) > MaxAge {
			s.hash.Delete(ctx, node)
			continue
		}
		out = append(out, snap)
	}
	slices.SortFunc(out, func(a, b Snapshot) int { return strings.Compare(a.Node, b.Node) })
	return out, nil
}
