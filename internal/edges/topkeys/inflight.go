package topkeys

import (
	"context"
	"strings"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/edges/hitters"
	"github.com/sluicehq/sluice/rules"
)

// heldChunk is the most keys read in one explanation: a handful of limits
// each, well within a request's bounds (sluice.MaxHits). A chunk the
// bounds refuse all the same is read in halves.
const heldChunk = 16

// InFlight sets, on the items of lists (top keys of rule, a stats key),
// the permits each key holds now of its rule's concurrency limit and the
// most it may hold (hitters.Item.InFlight and InFlightMax). They are read
// from dec's store, so across every node that shares it, by a peek
// through the decisions' own matching (decide.Decider.Explain), which
// consumes nothing. Only the keys listed are read, and only those that
// reach a concurrency limit (matched first, without the store): up to
// heldChunk of them in one explanation, one store call. A key without
// such a limit, a key cut short (its entries are not known) and a key
// whose peek failed keep a nil InFlight; a key in several lists is read
// once.
func InFlight(ctx context.Context, dec *decide.Decider, rule string, lists ...[]hitters.Item) {
	cfg := dec.Rules()
	if cfg == nil {
		return
	}
	domain := Domain(rule, cfg.Domains())
	seen := map[string]int{} // a key's index in descs, -1 when not read
	var descs []rules.Descriptor
	var items [][]*hitters.Item // per desc, the items of its key
	var p rules.Plan
	for _, l := range lists {
		for i := range l {
			it := &l[i]
			if it.Truncated {
				continue
			}
			j, ok := seen[it.Key]
			if !ok {
				j = -1
				d := rules.Descriptor{Entries: ParseKey(it.Key), Cost: 1}
				if hasPermit(cfg, &p, domain, d) {
					j = len(descs)
					descs = append(descs, d)
					items = append(items, nil)
				}
				seen[it.Key] = j
			}
			if j >= 0 {
				items[j] = append(items[j], it)
			}
		}
	}
	for start := 0; start < len(descs); start += heldChunk {
		end := min(start+heldChunk, len(descs))
		readHeld(ctx, dec, domain, descs[start:end], items[start:end])
	}
}

// hasPermit reports whether d, alone in a request of domain, reaches a
// concurrency limit under cfg: the rules' matching, without the store.
// (A runtime override changes a rule's rates, never its concurrency
// limit, so the rules alone say.)
func hasPermit(cfg *rules.Config, p *rules.Plan, domain string, d rules.Descriptor) bool {
	if cfg.Plan(domain, []rules.Descriptor{d}, p) != nil || len(p.Matches) != 1 {
		return false
	}
	m := p.Matches[0]
	for _, h := range p.Hits[m.First : m.First+m.Count] {
		if h.Limit.Algorithm == sluice.Concurrency {
			return true
		}
	}
	return false
}

// readHeld explains descs together and sets each one's held permits on
// its items. A refused explanation (over a request's bounds) is tried in
// halves. A descriptor that another of the same explanation replaced
// (replaces:), which alone it would not be, is explained alone.
func readHeld(ctx context.Context, dec *decide.Decider, domain string, descs []rules.Descriptor, items [][]*hitters.Item) {
	e, err := dec.Explain(ctx, domain, descs)
	if err != nil {
		if h := len(descs) / 2; h > 0 {
			readHeld(ctx, dec, domain, descs[:h], items[:h])
			readHeld(ctx, dec, domain, descs[h:], items[h:])
		}
		return
	}
	for i := range e.Descriptors {
		de := &e.Descriptors[i]
		if de.Status == rules.Replaced.String() && len(descs) > 1 {
			readHeld(ctx, dec, domain, descs[i:i+1], items[i:i+1])
			continue
		}
		for _, l := range de.Limits {
			if l.State == nil || l.State.Held == nil {
				continue
			}
			for _, it := range items[i] {
				held := *l.State.Held
				it.InFlight, it.InFlightMax = &held, l.State.Limit
			}
			break
		}
	}
}

// Domain is the domain of a rule's stats key: the longest of domains that
// the key starts with, followed by "."; else what comes before its first
// ".".
func Domain(rule string, domains []string) string {
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

// ParseKey reads a top key back into the entries it was written from
// (hitters.Entries).
func ParseKey(k string) []rules.Entry {
	var out []rules.Entry
	for _, kv := range hitters.Entries(k) {
		out = append(out, rules.Entry{Key: kv[0], Value: kv[1]})
	}
	return out
}
