package rules

import (
	"fmt"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/entrytext"
)

// Entry is one key/value pair of a request descriptor.
type Entry struct {
	Key, Value string
}

// Override is a limit carried by the request itself, as Envoy's
// RateLimitDescriptor.limit: it replaces the rules for its descriptor with
// a fixed window of RequestsPerUnit per Unit (times UnitMultiplier).
type Override struct {
	RequestsPerUnit uint32
	Unit            Unit
	UnitMultiplier  uint32 // 0 means 1
}

// Descriptor is one descriptor of a request: ordered entries, the cost of
// the request for it, and optionally its own limit.
type Descriptor struct {
	Entries []Entry

	// Cost is the number of hits to apply (Envoy's hits_addend, resolved
	// by the caller); 0 peeks.
	Cost int64

	// Override, when set, applies instead of the rules.
	Override *Override
}

// MaxEntryLen bounds the key and the value of a request entry, in bytes.
const MaxEntryLen = 1024

// Status says what a request descriptor matched.
type Status uint8

const (
	// NoMatch: no rule applies (the domain is unknown, the walk stopped
	// short, or the rule reached has no rate_limit). The descriptor is
	// allowed, as in Envoy.
	NoMatch Status = iota
	// Limited: the rule's limits are among the plan's hits.
	Limited
	// Unlimited: the rule reached is `unlimited: true`.
	Unlimited
	// Replaced: the rule's named limit is replaced by another matched
	// limit of the request (`replaces`) and is not enforced.
	Replaced
	// Overridden: the descriptor's own Override is enforced.
	Overridden
)

var statusNames = [...]string{"no_match", "limited", "unlimited", "replaced", "overridden"}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return "rules.Status(" + strconv.Itoa(int(s)) + ")"
}

// Runtime is a source of limits set at runtime (package overrides),
// consulted for every descriptor that carries no limit of its own, before
// the rules. Match must not allocate on the way of a decision.
type Runtime interface {
	Match(domain string, entries []Entry) (RuntimeMatch, bool)
}

// RuntimeMatch is what a Runtime found for a descriptor.
type RuntimeMatch struct {
	Limits    []*sluice.Limit // enforced together, instead of the rule's
	Unlimited bool            // no limit at all
	ID        string          // the override's identity, for explanations
}

// Match is the outcome for one request descriptor.
type Match struct {
	Status Status

	// Rule is the rule reached (Limited, Unlimited, Replaced), else nil.
	Rule *Rule

	// First and Count locate the descriptor's hits: Plan.Hits[First :
	// First+Count]. Count is zero unless Status is Limited or Overridden.
	First, Count int

	// StatKey is the Envoy stats key of the match: the rule's StatKey, or
	// with detailed_metric or value_to_metric the request values where
	// Envoy puts them; for an override, the domain and the descriptor's
	// entries. Empty for NoMatch.
	StatKey string

	// Runtime is the identity of the runtime override that applies
	// instead of the rules (Plan.Runtime), empty when none. Rule is then
	// the rule the entries reach, or nil: the stats stay the rule's.
	Runtime string

	// Schedule is the window of the rule's schedules whose limits apply,
	// nil when the rule's own do (or a runtime override's). Until is when
	// the limits in force change: another window of the schedules (or
	// none) applies, or a calendar period ends; zero when they never do.
	Schedule *Schedule
	Until    time.Time

	runtime            []*sluice.Limit
	set                *limitSet // what the rule enforces now (Limited, without Runtime)
	lv                 int       // first level in Plan.levels
	statStart, statEnd int       // StatKey span in the plan's buffer, statStart < 0 if none
}

// Plan is the matching of one request: the hits to decide together and,
// per request descriptor, what it matched. Reuse a Plan across requests to
// avoid allocation; its contents are valid until the next Config.Plan
// call with it. The zero value is ready to use.
type Plan struct {
	// Domain is the request's domain, nil when the Config has no such
	// domain (every descriptor then matches nothing).
	Domain *Domain

	// Hits are the limits to decide, in the order of the descriptors; the
	// domain capacity last. They are decided together, all-or-nothing, or
	// one by one (Domain.AllOrNothing).
	Hits []sluice.Hit

	// Matches has one element per request descriptor.
	Matches []Match

	// Capacity is the index in Hits of the domain capacity hit, -1 if none.
	Capacity int

	// Runtime, when set by the caller before Config.Plan, is consulted
	// for each descriptor without Envoy's own limit, before the rules
	// (reset keeps it).
	Runtime Runtime

	// Now, when set by the caller before Config.Plan, is the clock that
	// chooses the window of a rule with schedules and the period of a
	// calendar limit: the store's clock, so that the limits change when
	// the store's time says. It is read at most once per Config.Plan, and
	// only when such a rule is matched; nil means time.Now (reset keeps
	// it).
	Now func() time.Time

	now time.Time // read for this plan, zero until then

	buf       []byte
	scratch   []byte
	levels    []level
	spans     []int // per hit: end of its key in buf; starts at the previous end or at keyStart
	starts    []int
	replacing []string
}

type level struct {
	rule   *Rule
	how    uint8
	shared bool
}

const (
	howNone uint8 = iota
	howExact
	howWildcard
	howDefault
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", sluice.ErrInvalid, fmt.Sprintf(format, args...))
}

// Plan matches the descriptors of a request for domain and fills p with the
// hits to decide and what each descriptor matched. An error (wrapping
// sluice.ErrInvalid) means the request itself is invalid; an unknown domain
// is not an error but matches nothing.
func (c *Config) Plan(domain string, descs []Descriptor, p *Plan) error {
	p.reset()
	if domain == "" {
		return invalid("rate limit domain must not be empty")
	}
	if len(descs) == 0 {
		return invalid("rate limit descriptor list must not be empty")
	}
	for i := range descs {
		if err := checkDescriptor(i, &descs[i]); err != nil {
			return err
		}
	}
	for range descs {
		p.Matches = append(p.Matches, Match{statStart: -1})
	}
	d := c.domains[domain]
	if d == nil {
		return nil
	}
	p.Domain = d
	p.match(d, descs)

	// Keys.
	var capCost int64
	for i := range descs {
		desc := &descs[i]
		m := &p.Matches[i]
		capCost = max(capCost, desc.Cost)
		switch m.Status {
		case Limited:
			if m.Runtime != "" {
				if err := p.runtimeHits(d, desc, m); err != nil {
					return err
				}
				continue
			}
			if err := p.ruleHits(d, desc, m); err != nil {
				return err
			}
		case Unlimited, Replaced:
			p.matchStat(m, d.Name, desc.Entries)
		case Overridden:
			if err := p.override(c, d, desc, m); err != nil {
				return err
			}
		}
	}
	if d.Capacity != nil {
		if err := p.capacity(d, capCost); err != nil {
			return err
		}
	}
	if len(p.Hits) > sluice.MaxHits {
		return invalid("%d limits in one request (at most %d)", len(p.Hits), sluice.MaxHits)
	}
	p.strings()
	return nil
}

// ruleHits adds the hits of the limits m's rule has in force for desc (a
// calendar limit's of the period that holds now), and m's stats key.
func (p *Plan) ruleHits(d *Domain, desc *Descriptor, m *Match) error {
	lv := p.levels[m.lv : m.lv+len(desc.Entries)]
	m.First = len(p.Hits)
	set := m.set
	m.Count = len(set.limits)
	for j, l := range set.limits {
		tag := set.tags[j]
		if set.cals != nil && set.cals[j] != nil {
			// A calendar period: its own limit and counter.
			var end time.Time
			l, tag, end = set.cals[j].at(p.clock(), tag)
			if m.Until.IsZero() || end.Before(m.Until) {
				m.Until = end
			}
		}
		start := len(p.buf)
		p.buf = appendRuleKey(p.buf, d.Name, m.Rule, tag, desc.Entries, lv)
		if err := p.addHit(start, l, desc.Cost); err != nil {
			return err
		}
	}
	if err := p.permitHit(d, desc, m); err != nil {
		return err
	}
	p.stat(m, d.Name, desc.Entries, lv)
	return nil
}

// permitHit adds the hit of the concurrency limit of m's rule, if it has
// one: a permit for the request (cost 1; 0 for a peek), keyed as the
// rule's limits are, by the values of the request.
func (p *Plan) permitHit(d *Domain, desc *Descriptor, m *Match) error {
	r := m.Rule
	if r == nil || r.Concurrency == nil {
		return nil
	}
	lv := p.levels[m.lv : m.lv+len(desc.Entries)]
	start := len(p.buf)
	p.buf = appendRuleKey(p.buf, d.Name, r, concurrencyTag, desc.Entries, lv)
	if err := p.addHit(start, r.Concurrency, permitCost(desc.Cost)); err != nil {
		return err
	}
	m.Count++
	return nil
}

// clock returns the time of this plan, reading p.Now the first time.
func (p *Plan) clock() time.Time {
	if p.now.IsZero() {
		if p.Now != nil {
			p.now = p.Now()
		} else {
			p.now = time.Now()
		}
	}
	return p.now
}

// reset empties p for a new plan, keeping its storage.
func (p *Plan) reset() {
	p.Domain = nil
	p.Hits = p.Hits[:0]
	p.Matches = p.Matches[:0]
	p.Capacity = -1
	p.now = time.Time{}
	p.buf = p.buf[:0]
	p.levels = p.levels[:0]
	p.spans = p.spans[:0]
	p.starts = p.starts[:0]
	p.replacing = p.replacing[:0]
}

// noRates is the limits of a rule whose rates another limit replaces:
// none (its concurrency limit, if any, stays).
var noRates limitSet

// match matches every descriptor of descs in d into p.Matches, and marks
// Replaced the matched limits whose name another matched limit replaces,
// as Envoy drops them.
func (p *Plan) match(d *Domain, descs []Descriptor) {
	for i := range descs {
		m := &p.Matches[i]
		if descs[i].Override != nil {
			m.Status = Overridden
			continue
		}
		m.lv = len(p.levels)
		r := p.walk(d, descs[i].Entries)
		if p.Runtime != nil {
			if rm, ok := p.Runtime.Match(d.Name, descs[i].Entries); ok {
				// A runtime override: the rule reached, if any, keeps
				// the stats (walk leveled every entry to reach it); its
				// limits and its replaces do not apply.
				m.Rule, m.Runtime, m.runtime = r, rm.ID, rm.Limits
				m.Status = Limited
				if (rm.Unlimited || len(rm.Limits) == 0) && (r == nil || r.Concurrency == nil) {
					m.Status = Unlimited
				}
				continue
			}
		}
		if r == nil {
			continue
		}
		m.Rule = r
		m.Status = Limited
		if len(r.windows) == 0 {
			m.set = &r.set
		} else {
			var i int
			m.set, i, m.Until = r.setAt(p.clock())
			if i >= 0 {
				m.Schedule = r.Schedules[i]
			}
		}
		if m.set.unlimited && r.Concurrency == nil {
			m.Status = Unlimited
		}
		p.replacing = append(p.replacing, r.Replaces...)
	}
	if len(p.replacing) > 0 {
		p.replace()
	}
}

// replace marks Replaced the matched rules whose name another matched
// limit replaces; a rule with a concurrency limit keeps it (replaces
// names a rate: the slots stay), and loses its rates.
func (p *Plan) replace() {
	for i := range p.Matches {
		m := &p.Matches[i]
		if m.Status != Limited || m.Runtime != "" || m.Rule.Name == "" || !contains(p.replacing, m.Rule.Name) {
			continue
		}
		m.Status = Replaced
		if m.Rule.Concurrency != nil {
			m.Status, m.set = Limited, &noRates
		}
	}
}

// override adds the hit of a descriptor's own limit (Envoy's per-request
// override), keyed by the domain, its period and the entries, and its
// stats key.
func (p *Plan) override(c *Config, d *Domain, desc *Descriptor, m *Match) error {
	o := desc.Override
	l := c.overrideLimit(o.RequestsPerUnit, o.Unit, o.UnitMultiplier)
	m.First = len(p.Hits)
	m.Count = 1
	start := len(p.buf)
	p.buf = append(p.buf, 'o')
	p.buf = entrytext.AppendField(p.buf, d.Name)
	p.buf = appendEntriesKey(p.buf, l.Period, desc.Entries)
	if err := p.addHit(start, l, desc.Cost); err != nil {
		return err
	}
	p.entriesStat(m, d.Name, desc.Entries)
	return nil
}

// appendEntriesKey appends the period and the entries of a counter key
// that no rule names: a descriptor's own limit, a runtime override.
func appendEntriesKey(b []byte, period time.Duration, entries []Entry) []byte {
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(period), 10)
	for _, e := range entries {
		b = append(b, 'v')
		b = entrytext.AppendField(b, e.Key)
		b = entrytext.AppendField(b, e.Value)
	}
	return b
}

// runtimeHits adds the hits of a descriptor's runtime override, keyed by
// the domain, the limit's index and period, and the entries; its stats key
// is its rule's, or made of the entries when no rule matched.
func (p *Plan) runtimeHits(d *Domain, desc *Descriptor, m *Match) error {
	m.First = len(p.Hits)
	m.Count = len(m.runtime)
	for j, l := range m.runtime {
		start := len(p.buf)
		p.buf = append(p.buf, 'u')
		p.buf = entrytext.AppendField(p.buf, d.Name)
		p.buf = strconv.AppendInt(p.buf, int64(j), 10)
		p.buf = appendEntriesKey(p.buf, l.Period, desc.Entries)
		if err := p.addHit(start, l, desc.Cost); err != nil {
			return err
		}
	}
	if err := p.permitHit(d, desc, m); err != nil {
		return err
	}
	p.matchStat(m, d.Name, desc.Entries)
	return nil
}

// capacity adds the hit of the domain capacity, at the largest cost of the
// request's descriptors.
func (p *Plan) capacity(d *Domain, cost int64) error {
	start := len(p.buf)
	p.buf = append(p.buf, 'c')
	p.buf = entrytext.AppendField(p.buf, d.Name)
	p.buf = append(p.buf, '/')
	p.buf = append(p.buf, d.Capacity.Algorithm.String()...)
	p.buf = append(p.buf, '/')
	p.buf = strconv.AppendInt(p.buf, int64(d.Capacity.Period), 10)
	p.Capacity = len(p.Hits)
	return p.addHit(start, d.Capacity, cost)
}

// strings makes one string of every key of the request and points the
// hits' keys and the matches' stats keys into it.
func (p *Plan) strings() {
	all := string(p.buf)
	for i := range p.Hits {
		p.Hits[i].Key = all[p.starts[i]:p.spans[i]]
	}
	for i := range p.Matches {
		m := &p.Matches[i]
		if m.statStart >= 0 {
			m.StatKey = all[m.statStart:m.statEnd]
		}
	}
}

func (p *Plan) addHit(start int, l *sluice.Limit, cost int64) error {
	if n := len(p.buf) - start; n > sluice.MaxKeyLen {
		return invalid("counter key of %d bytes (at most %d): too many or too long descriptor entries", n, sluice.MaxKeyLen)
	}
	p.Hits = append(p.Hits, sluice.Hit{Limit: l, Cost: cost})
	p.starts = append(p.starts, start)
	p.spans = append(p.spans, len(p.buf))
	return nil
}

func checkDescriptor(i int, d *Descriptor) error {
	if len(d.Entries) == 0 {
		return invalid("descriptor %d has no entries", i)
	}
	for j, e := range d.Entries {
		if e.Key == "" {
			return invalid("descriptor %d entry %d has an empty key", i, j)
		}
		if len(e.Key) > MaxEntryLen || len(e.Value) > MaxEntryLen {
			return invalid("descriptor %d entry %d: key or value longer than %d bytes", i, j, MaxEntryLen)
		}
	}
	if d.Cost < 0 || d.Cost > sluice.MaxCost {
		return invalid("descriptor %d: cost %d out of range (0 to %d)", i, d.Cost, int64(sluice.MaxCost))
	}
	if o := d.Override; o != nil {
		u := o.Unit.Duration()
		if u == 0 {
			return invalid("descriptor %d: limit override has unit %s", i, o.Unit)
		}
		if time.Duration(o.UnitMultiplier) > MaxPeriod/u {
			return invalid("descriptor %d: limit override period of %d %ss is too long", i, o.UnitMultiplier, o.Unit)
		}
	}
	return nil
}

// walk follows Envoy's lookup for one descriptor, recording one level per
// entry visited, and returns the rule reached by the last entry if it has a
// rate_limit.
func (p *Plan) walk(d *Domain, entries []Entry) *Rule {
	node := &d.root
	last := len(entries) - 1
	var matched *Rule
	for i, e := range entries {
		p.scratch = append(p.scratch[:0], e.Key...)
		p.scratch = append(p.scratch, '_')
		p.scratch = append(p.scratch, e.Value...)
		how := howExact
		next := node.children[string(p.scratch)]
		if next == nil {
			for _, w := range node.wildcards {
				if w.glob.match(p.scratch) {
					next, how = w, howWildcard
					break
				}
			}
		}
		if next == nil {
			next, how = node.children[e.Key], howDefault
		}
		if next == nil {
			how = howNone
		}
		p.levels = append(p.levels, level{rule: next, how: how, shared: how == howWildcard && next.ShareThreshold})
		if next != nil && next.limited && i == last {
			matched = next
		}
		if next == nil || len(next.children) == 0 {
			break
		}
		node = next
	}
	return matched
}

// appendRuleKey appends the counter key of limit j of rule r for the
// request entries: the domain, the rule's path, the limit's index,
// algorithm, period and refill interval, and every entry's key and value —
// or, where a share_threshold wildcard matched, its pattern. Every variable
// part is length-prefixed, so no two distinct requests share a key.
func appendRuleKey(b []byte, domain string, r *Rule, tag string, entries []Entry, lv []level) []byte {
	b = append(b, 'r')
	b = entrytext.AppendField(b, domain)
	b = entrytext.AppendField(b, r.ident)
	b = append(b, tag...)
	for i, e := range entries {
		if lv[i].shared {
			b = append(b, 's')
			b = entrytext.AppendField(b, e.Key)
			b = entrytext.AppendField(b, pattern(lv[i].rule.composite, e.Key))
			continue
		}
		b = append(b, 'v')
		b = entrytext.AppendField(b, e.Key)
		b = entrytext.AppendField(b, e.Value)
	}
	return b
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
