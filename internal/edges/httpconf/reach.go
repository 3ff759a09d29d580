package httpconf

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/sluicehq/sluice/rules"
)

// shape is what the rules will match of a descriptor of the section: its
// entries' keys, and their values where the file fixes them; and where
// it stands in the file.
type shape struct {
	entries      []entryShape
	line, column int
}

// entryShape is one entry of a shape: its key, and its value when fixed
// (value:); a value taken from the request may be anything.
type entryShape struct {
	key   string
	value string
	fixed bool
}

// String spells the shape as its entries, a request's value as <request>.
func (s shape) String() string {
	parts := make([]string, len(s.entries))
	for i, e := range s.entries {
		v := "<request>"
		if e.fixed {
			v = e.value
		}
		parts[i] = e.key + ": " + v
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// checkFailureRules reports, for each route of s, the failure
// descriptors that can reach a rule of d with a concurrency limit. A
// failure is decided after its response, when nothing is left in flight:
// a permit taken there would cap nothing, and be held by no request.
func (p *parser) checkFailureRules(s *Section, d *rules.Domain) []rules.Problem {
	var probs []rules.Problem
	kids := children(d)
	for _, r := range s.Routes {
		if r.Failures == nil {
			continue
		}
		for i, sh := range p.failureShapes[r.Failures] {
			rule := reachConcurrency(kids, sh.entries)
			if rule == nil {
				continue
			}
			probs = append(probs, rules.Problem{File: p.file, Line: sh.line, Column: sh.column, Msg: fmt.Sprintf(
				"route %q: failures.descriptors[%d] %s can reach rule %s (line %d), which has a concurrency limit: failures are counted after the response, with nothing in flight to cap; give the failure descriptor a key of its own, or put concurrency on the route's descriptors",
				r.Name, i, sh, rule.StatKey, rule.Line)})
		}
	}
	return probs
}

// children maps each rule of d, and nil for the top level, to the rules
// nested in it, in file order.
func children(d *rules.Domain) map[*rules.Rule][]*rules.Rule {
	kids := map[*rules.Rule][]*rules.Rule{}
	for _, r := range d.Rules {
		kids[r.Parent] = append(kids[r.Parent], r)
	}
	return kids
}

// reachConcurrency returns a rule with a concurrency limit that a
// request's descriptor of the shape entries can reach as rules.Plan walks
// the rules (Envoy's lookup), or nil when none can.
func reachConcurrency(kids map[*rules.Rule][]*rules.Rule, entries []entryShape) *rules.Rule {
	level := []*rules.Rule{nil}
	for i, e := range entries {
		var next []*rules.Rule
		for _, r := range level {
			next = append(next, reach(kids[r], e)...)
		}
		if i == len(entries)-1 {
			for _, r := range next {
				if r.Concurrency != nil {
					return r
				}
			}
		}
		level = next
	}
	return nil
}

// reach returns the rules among rs that an entry of shape e can reach. A
// rule is matched by its composite (key, or key_value) against the
// entry's key_value. A fixed value reaches the one rule the lookup picks:
// the composite equal to it, else the first wildcard that matches it,
// else the rule of its key alone. A value from the request may reach any
// of them: the rule of its key, any composite key_v, and any wildcard
// that some key_v matches.
func reach(rs []*rules.Rule, e entryShape) []*rules.Rule {
	kv := e.key + "_"
	if e.fixed {
		kv += e.value
		for _, pick := range []func(c string) bool{
			func(c string) bool { return c == kv },
			func(c string) bool { return strings.Contains(c, "*") && wildcard(c).MatchString(kv) },
			func(c string) bool { return c == e.key },
		} {
			for _, r := range rs {
				if pick(composite(r)) {
					return []*rules.Rule{r}
				}
			}
		}
		return nil
	}
	var out []*rules.Rule
	for _, r := range rs {
		c := composite(r)
		first, _, star := strings.Cut(c, "*")
		switch {
		case c == e.key,
			!star && len(c) > len(kv) && strings.HasPrefix(c, kv),
			star && (strings.HasPrefix(first, kv) || strings.HasPrefix(kv, first)):
			out = append(out, r)
		}
	}
	return out
}

// composite is the rule's key, or key_value: what the lookup matches.
func composite(r *rules.Rule) string {
	if r.Value == "" {
		return r.Key
	}
	return r.Key + "_" + r.Value
}

// wildcard compiles the pattern of a wildcard composite: each '*' any run
// of bytes, everything else literal.
func wildcard(c string) *regexp.Regexp {
	parts := strings.Split(c, "*")
	for i, s := range parts {
		parts[i] = regexp.QuoteMeta(s)
	}
	return regexp.MustCompile(`(?s)\A` + strings.Join(parts, ".*") + `\z`)
}
