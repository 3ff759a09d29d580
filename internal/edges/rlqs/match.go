package rlqs

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/entrytext"
	"github.com/sluicehq/sluice/rules"
)

// canonical is a bucket id's map as one string, sorted by key, each key
// and value length-prefixed.
func canonical(m map[string]string) string {
	var b []byte
	for _, e := range sortedEntries(m) {
		b = entrytext.AppendField(entrytext.AppendField(b, e.Key), e.Value)
	}
	return string(b)
}

// sortedEntries is a bucket id's map as entries sorted by key.
func sortedEntries(m map[string]string) []rules.Entry {
	entries := make([]rules.Entry, 0, len(m))
	for k, v := range m {
		entries = append(entries, rules.Entry{Key: k, Value: v})
	}
	slices.SortFunc(entries, func(a, b rules.Entry) int { return strings.Compare(a.Key, b.Key) })
	return entries
}

// match sets what bucket b matches in cfg.
func (s *Server) match(b *bucketState, cfg *rules.Config, domain string) {
	b.rules, b.action, b.limits, b.pools, b.until = cfg, actAbandon, nil, nil, time.Time{}
	m := b.id.Bucket
	if cfg == nil || len(m) > MaxBucketEntries {
		return
	}
	for k, v := range m {
		if len(k) == 0 || len(k) > rules.MaxEntryLen || len(v) > rules.MaxEntryLen {
			return
		}
	}
	entries := sortedEntries(m)
	// The server's clock chooses a schedule's window, as it times the
	// buckets.
	plan := rules.Plan{Runtime: s.runtime(), Now: s.cfg.Now}
	for {
		if s.matchOrder(b, cfg, domain, entries, &plan) || len(entries) > maxPermuted || !nextPermutation(entries) {
			return
		}
	}
}

// runtime is the runtime overrides in force, nil if none.
func (s *Server) runtime() rules.Runtime {
	if s.cfg.Runtime == nil {
		return nil
	}
	return s.cfg.Runtime()
}

// runtimeChanged reports whether the runtime overrides may have changed
// since b was matched, and their Generation now (read before matching,
// so that a change during the match is seen at the next report).
func (s *Server) runtimeChanged(b *bucketState, now time.Time) (gen uint64, changed bool) {
	switch rt := s.runtime().(type) {
	case nil:
		return 0, false
	case interface{ Generation() uint64 }:
		gen = rt.Generation()
		return gen, gen != b.gen
	default:
		return 0, now.Sub(b.matched) >= rematchEvery
	}
}

// rematchEvery is how long a bucket's match is kept, with runtime
// overrides that tell no Generation, before its next report matches it
// again.
const rematchEvery = time.Second

// matchOrder matches entries in their order; true when they reached a rule
// with a rate limit.
func (s *Server) matchOrder(b *bucketState, cfg *rules.Config, domain string, entries []rules.Entry, plan *rules.Plan) bool {
	descs := []rules.Descriptor{{Entries: entries, Cost: 1}}
	if err := cfg.Plan(domain, descs, plan); err != nil {
		s.log.Debug("bucket id does not make a descriptor", "domain", domain, "err", err)
		return false
	}
	m := plan.Matches[0]
	b.until = m.Until
	switch m.Status {
	case rules.Unlimited, rules.Replaced:
		b.action = actAllow
		return true
	case rules.Limited:
	default:
		return false
	}
	if m.Runtime == "" && m.Rule != nil && m.Rule.ShadowMode { // an override is enforced, as in decisions
		b.action = actAllow
		return true
	}
	b.action = actAssign
	for _, h := range plan.Hits {
		if h.Limit.Rate == 0 {
			b.action, b.limits, b.pools = actDeny, nil, nil
			return true
		}
		b.limits = append(b.limits, h.Limit)
		b.pools = append(b.pools, poolKey(h))
	}
	return true
}

// poolKey names the pool of a hit: its counter key and limit.
func poolKey(h sluice.Hit) string {
	l := h.Limit
	return fmt.Sprintf("%s|%d|%d|%d|%d", h.Key, l.Algorithm, l.Rate, l.Period.Milliseconds(), l.Burst)
}

// nextPermutation advances e to its next order by key, false after the
// last.
func nextPermutation(e []rules.Entry) bool {
	i := len(e) - 2
	for i >= 0 && e[i].Key >= e[i+1].Key {
		i--
	}
	if i < 0 {
		return false
	}
	j := len(e) - 1
	for e[j].Key <= e[i].Key {
		j--
	}
	e[i], e[j] = e[j], e[i]
	slices.Reverse(e[i+1:])
	return true
}
