package decide

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
)

// Explanation says, for a domain and descriptors, what would apply to each
// descriptor and why: the same matching as a decision (rules.Config.Plan,
// with the runtime overrides in force), without deciding anything.
type Explanation struct {
	Domain      string                  `json:"domain"`
	DomainKnown bool                    `json:"domain_known"`
	Descriptors []DescriptorExplanation `json:"descriptors"`
	Capacity    *LimitExplanation       `json:"capacity,omitempty"` // the domain capacity, applied once
}

// DescriptorExplanation is what applies to one descriptor.
type DescriptorExplanation struct {
	Entries []ExplainedEntry `json:"entries"`
	// Status: limited, unlimited, no_match, replaced (another matched
	// limit replaces the rule's) or overridden (the request's own limit).
	Status string `json:"status"`
	// Source: rules, override (a runtime override), request (Envoy's
	// per-descriptor limit) or none.
	Source   string `json:"source"`
	Rule     string `json:"rule,omitempty"`     // the rule reached: file:line:column
	StatKey  string `json:"stat_key,omitempty"` // its stats key
	Override string `json:"override,omitempty"` // the runtime override's domain and path
	// Schedule is the window of the rule's schedules whose limits apply
	// (its name, days, hours and zone), empty when the rule's own do;
	// Until, for a rule with schedules, when that changes (RFC 3339, empty
	// when it never does).
	Schedule string             `json:"schedule,omitempty"`
	Until    string             `json:"until,omitempty"`
	Limits   []LimitExplanation `json:"limits,omitempty"`
	Why      string             `json:"why"`
}

// ExplainedEntry is one entry of a descriptor.
type ExplainedEntry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// LimitExplanation is one limit that would apply.
type LimitExplanation struct {
	// Name is the limit's name: the rule's name:, else its stats key
	// (with #i for one of several limits); for a runtime override's
	// limit, the override's ID.
	Name      string `json:"name,omitempty"`
	Algorithm string `json:"algorithm"`
	Rate      int64  `json:"rate"`
	Period    string `json:"period"`
	Burst     int64  `json:"burst,omitempty"`
	Shadow    bool   `json:"shadow,omitempty"`
	Key       string `json:"key"` // the counter key

	// The counter's state now, read without consuming (a peek), when the
	// store answered: what is left, when the limit resets, and how long a
	// hit of cost 1 would have to wait (0: it would pass now).
	State *CounterState `json:"state,omitempty"`

	// Global reports a limit shared by every region (global: true). A
	// node of the region tier (sluice serve --region) adds its region,
	// the region's allocation of the limit in this window (as the
	// coordinator's ledger has it, or as the node knows it when the
	// coordinator does not answer) and its safe share.
	Global     bool   `json:"global,omitempty"`
	Region     string `json:"region,omitempty"`
	Allocation int64  `json:"allocation,omitempty"`
	SafeShare  int64  `json:"safe_share,omitempty"`

	// Hit is what is explained: the counter's key and the compiled limit,
	// for a caller that adds what its store knows of the limit, such as a
	// region's allocation of a global one. Not in the JSON.
	Hit sluice.Hit `json:"-"`
}

// CounterState is a counter's state, as a peek reads it.
type CounterState struct {
	Limit      int64  `json:"limit"`
	Remaining  int64  `json:"remaining"`
	ResetAfter string `json:"reset_after"`
	RetryAfter string `json:"retry_after,omitempty"`

	// Held is, for a concurrency limit, the permits its key holds now,
	// across every node that shares the store: requests in flight, out
	// of Limit (max). ResetAfter is then the time until the earliest of
	// them expires unless renewed, and RetryAfter, when every slot is
	// taken, that time too: an upper bound, since a holder may release
	// sooner. Nil for a rate.
	Held *int64 `json:"held,omitempty"`
	// Summary says Held in words, for a concurrency limit: "3 of 4
	// permits held". Empty for a rate.
	Summary string `json:"summary,omitempty"`
}

// Explain explains what would apply to descs in domain under the rules and
// runtime overrides in force, with each counter's state read from the store
// without consuming anything (a peek of each limit; a store that fails
// leaves the states out). A request that a decision would refuse as
// invalid is the same error here.
func (d *Decider) Explain(ctx context.Context, domain string, descs []rules.Descriptor) (*Explanation, error) {
	s := d.plans.Get().(*scratch)
	defer d.plans.Put(s)
	if err := d.plan(s, domain, descs); err != nil {
		return nil, err
	}
	p := &s.plan
	var states []sluice.Decision
	if len(p.Hits) > 0 {
		peeks := make([]sluice.Hit, len(p.Hits))
		for i, h := range p.Hits {
			peeks[i] = sluice.Hit{Key: h.Key, Limit: h.Limit}
		}
		states = make([]sluice.Decision, len(peeks))
		if _, err := d.limiter.TakeEach(ctx, peeks, states); err != nil {
			states = nil
		}
	}
	e := &Explanation{Domain: domain, DomainKnown: p.Domain != nil}
	for i := range p.Matches {
		m := &p.Matches[i]
		de := DescriptorExplanation{Status: m.Status.String(), StatKey: m.StatKey, Source: "none"}
		for _, en := range descs[i].Entries {
			de.Entries = append(de.Entries, ExplainedEntry{en.Key, en.Value})
		}
		if m.Rule != nil {
			de.Rule = m.Rule.File + ":" + strconv.Itoa(m.Rule.Line) + ":" + strconv.Itoa(m.Rule.Column)
		}
		for j := m.First; j < m.First+m.Count; j++ {
			le := explainLimit(p, j, states)
			if m.Runtime != "" {
				// An override's compiled limit is shared by every
				// override with the same JSON: its own name says
				// nothing of this one.
				le.Name = m.Runtime
				if m.Count > 1 {
					le.Name += "#" + strconv.Itoa(j-m.First)
				}
			}
			de.Limits = append(de.Limits, le)
		}
		switch {
		case m.Status == rules.Overridden:
			de.Source, de.Why = "request", "the request carries its own limit for this descriptor (Envoy's per-descriptor limit), which wins over overrides and rules"
		case m.Runtime != "":
			de.Source, de.Override = "override", m.Runtime
			de.Why = "the most specific runtime override for these entries applies instead of the rules"
			if m.Status == rules.Unlimited {
				de.Why += "; it is unlimited"
			}
		case p.Domain == nil:
			de.Why = "no rules for this domain: allowed"
		case m.Status == rules.NoMatch:
			de.Why = "the entries reach no rule with a rate_limit: allowed"
		case m.Status == rules.Unlimited:
			de.Source, de.Why = "rules", "the rule reached is unlimited: true"
		case m.Status == rules.Replaced:
			de.Source, de.Why = "rules", "another limit matched by the request replaces this rule's (replaces:)"
		default:
			de.Source, de.Why = "rules", "the rule reached by the entries applies"
		}
		explainSchedule(&de, m)
		e.Descriptors = append(e.Descriptors, de)
	}
	if p.Capacity >= 0 {
		c := explainLimit(p, p.Capacity, states)
		e.Capacity = &c
	}
	return e, nil
}

// explainSchedule says which window of a rule's schedules applies, and
// until when.
func explainSchedule(de *DescriptorExplanation, m *rules.Match) {
	if m.Rule == nil || len(m.Rule.Schedules) == 0 || m.Runtime != "" || m.Status == rules.Replaced {
		return
	}
	until := "for good"
	if !m.Until.IsZero() {
		de.Until = m.Until.Format(time.RFC3339)
		until = "until " + de.Until
	}
	if s := m.Schedule; s != nil {
		if s.Unlimited {
			de.Why = "the rule reached applies"
		}
		de.Schedule = fmt.Sprintf("%s (%s %s-%s %s)", s.Name, s.Days, s.From, s.To, s.Zone)
		de.Why += fmt.Sprintf("; its schedule %s holds now, %s, and its limits replace the rule's own", de.Schedule, until)
		if s.Unlimited {
			de.Why += " (it is unlimited)"
		}
		return
	}
	de.Why += "; none of its schedules holds now: its own limits apply " + until
}

func explainLimit(p *rules.Plan, j int, states []sluice.Decision) LimitExplanation {
	h := p.Hits[j]
	l := h.Limit
	le := LimitExplanation{Name: l.Name, Algorithm: l.Algorithm.String(), Rate: l.Rate, Period: l.Period.String(),
		Burst: l.Burst, Shadow: l.Shadow, Key: fmt.Sprintf("%q", h.Key), Global: l.Global, Hit: sluice.Hit{Key: h.Key, Limit: l}}
	if j < len(states) {
		st := states[j]
		le.State = &CounterState{Limit: st.Limit, Remaining: st.Remaining, ResetAfter: st.ResetAfter.String()}
		if !st.Allowed || st.Remaining < 1 {
			le.State.RetryAfter = st.RetryAfter.String()
		}
		if l.Algorithm == sluice.Concurrency {
			// A peek at a key's permits: Remaining is max less those
			// held. A full key frees a slot by its earliest expiry at
			// the latest.
			held := max(st.Limit-st.Remaining, 0)
			le.State.Held = &held
			le.State.Summary = fmt.Sprintf("%d of %d permits held", held, st.Limit)
			if st.Remaining < 1 && held > 0 {
				le.State.RetryAfter = st.ResetAfter.String()
			}
		}
	}
	return le
}
