package rules

import (
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/calendar"
	"github.com/sluicehq/sluice/internal/base/yamlwalk"
)

// Schedule is one window of a descriptor's `schedules:` (a sluice
// extension): on its days, from From to To in the local time of Zone, its
// limits replace the descriptor's own. The first window of the list that
// holds the time of a decision applies; outside every window the
// descriptor's own limits do. A window whose To is not after its From
// crosses midnight and belongs to the day it starts on; on the days the
// clocks change, a time the clock skips is the instant of the jump and a
// time it shows twice is its first occurrence. Each window counts in its
// own counters: entering or leaving one never carries another's count.
type Schedule struct {
	// Name is the entry's name:, or "schedule N" (N counting from 1).
	Name string

	// Days lists the days the window starts on, as "mon,tue" or "every
	// day"; From and To are the wall-clock times as written (HH:MM), and
	// Zone the IANA time zone.
	Days, From, To, Zone string

	// Limits are the window's compiled limits, all enforced together;
	// empty when the window is unlimited.
	Limits []*sluice.Limit

	// Unlimited reports a window with `rate_limit: {unlimited: true}`:
	// while it holds, the descriptor matches and nothing is enforced.
	Unlimited bool

	// Position of the entry in its file.
	Line, Column int

	// In says whether the window holds at now, and until when that holds
	// (the end of the occurrence now is in, or the start of the next; zero
	// when the window never holds). Which window applies is the first of
	// the rule's Schedules that holds.
	In func(now time.Time) (in bool, until time.Time)

	window calendar.Window
	set    limitSet // its key tags carry the window's index
}

// scheduleKeys are the keys of a schedules entry.
var scheduleKeys = []string{"name", "days", "from", "to", "tz", "rate_limit", "rate_limits"}

// maxSchedules bounds the windows of one descriptor.
const maxSchedules = 32

// schedules reads a descriptor's schedules: list into r.
func (p *parser) schedules(r *Rule, n *yaml.Node) {
	items, ok := p.List(n, "schedules", maxSchedules)
	if !ok {
		return
	}
	if len(items) == 0 {
		p.Errorf(p.Deref(n), "schedules is empty")
		return
	}
	seen := map[string]int{} // name -> line
	for i, item := range items {
		s := p.schedule(r, item, i)
		if s == nil {
			continue
		}
		if line, dup := seen[s.Name]; dup {
			// Names label metrics and explanations: one each.
			p.Errorf(p.Deref(item), "schedule name %q is used twice in one descriptor (first at line %d)", s.Name, line)
			continue
		}
		seen[s.Name] = s.Line
		r.Schedules = append(r.Schedules, s)
		r.windows = append(r.windows, s.window)
	}
}

// schedule reads the i-th entry of a schedules list, nil when it has a
// problem (reported).
func (p *parser) schedule(r *Rule, n *yaml.Node, i int) *Schedule {
	pairs, ok := p.Mapping(n, "a schedules entry")
	if !ok {
		return nil
	}
	n = p.Deref(n)
	before := len(p.Errs)
	s := &Schedule{Name: "schedule " + strconv.Itoa(i+1), Line: n.Line, Column: n.Column}
	f := p.scheduleFields(s, pairs)
	days, from, to, tz, rl, rls := f.days, f.from, f.to, f.tz, f.rl, f.rls
	s.window.Loc = p.zone(n, tz)
	s.window.Days = p.days(days)
	s.From, s.window.From = p.clock(n, from, "from", false)
	s.To, s.window.To = p.clock(n, to, "to", true)
	if s.window.Loc != nil {
		s.Zone = s.window.Loc.String()
	}
	s.Days = s.window.Days.String()

	// The window's limits, read as the descriptor's own would be, into a
	// rule of its own that carries the descriptor's name and flags.
	w := &Rule{StatKey: r.StatKey + "@" + s.Name, ShadowMode: r.ShadowMode}
	switch {
	case rl != nil && rls != nil:
		p.Errorf(rls, "rate_limits and rate_limit cannot both be set; put every limit in rate_limits")
	case rl != nil:
		p.rateLimit(w, rl)
	case rls != nil:
		p.rateLimits(w, rls)
	default:
		p.Errorf(n, "a schedules entry needs rate_limit or rate_limits (what applies while it holds)")
	}
	if w.Name != "" || len(w.Replaces) > 0 {
		p.Errorf(n, "name and replaces of a scheduled limit belong to the descriptor's own rate_limit")
	}
	if len(p.Errs) > before {
		return nil
	}
	s.Limits, s.Unlimited = w.Limits, w.Unlimited
	s.set = w.set
	s.set.tags = nil
	s.In = s.window.At
	for _, t := range w.set.tags {
		s.set.tags = append(s.set.tags, "@"+strconv.Itoa(i)+t)
	}
	return s
}

// scheduleNodes are the fields of a schedules entry read after its name.
type scheduleNodes struct{ days, from, to, tz, rl, rls *yaml.Node }

// scheduleFields reads the name of a schedules entry into s and returns
// its other fields.
func (p *parser) scheduleFields(s *Schedule, pairs []yamlwalk.Pair) scheduleNodes {
	var f scheduleNodes
	for _, kv := range pairs {
		switch kv.K.Value {
		case "name":
			if v, ok := p.str(kv.V, "name"); ok && v != "" {
				s.Name = v
			}
		case "days":
			f.days = kv.V
		case "from":
			f.from = kv.V
		case "to":
			f.to = kv.V
		case "tz":
			f.tz = kv.V
		case "rate_limit":
			f.rl = kv.V
		case "rate_limits":
			f.rls = kv.V
		default:
			p.unknown(kv.K, "a schedules entry", scheduleKeys, false)
		}
	}
	return f
}

// zone reads a tz: field, which every window needs.
func (p *parser) zone(entry, n *yaml.Node) *time.Location {
	if n == nil {
		p.Errorf(entry, "a schedules entry needs tz: (an IANA time zone such as Europe/Berlin, or UTC)")
		return nil
	}
	name, ok := p.str(n, "tz")
	if !ok {
		return nil
	}
	if name == "" || name == "Local" {
		p.Errorf(p.Deref(n), "tz %q: name an IANA time zone such as Europe/Berlin, or UTC", name)
		return nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		p.Errorf(p.Deref(n), "unknown time zone %q (an IANA name such as Europe/Berlin, America/New_York or UTC)", name)
		return nil
	}
	return loc
}

// days reads a days: list; absent is every day, an empty list an error.
func (p *parser) days(n *yaml.Node) calendar.Days {
	if n == nil {
		return 0
	}
	items, ok := p.List(n, "days", 7)
	if !ok {
		return 0
	}
	if len(items) == 0 {
		p.Errorf(p.Deref(n), "days is empty: the window would never apply (leave days: out for every day)")
		return 0
	}
	var names []string
	for _, it := range items {
		if v, ok := p.str(it, "a day"); ok {
			names = append(names, v)
		}
	}
	d, err := calendar.ParseDays(names)
	if err != nil {
		p.Errorf(p.Deref(n), "days: %v", err)
	}
	return d
}

// clock reads a from: or to: time of day.
func (p *parser) clock(entry, n *yaml.Node, what string, end bool) (string, int) {
	if n == nil {
		p.Errorf(entry, "a schedules entry needs %s: (a time of day HH:MM)", what)
		return "", 0
	}
	v, ok := p.str(n, what)
	if !ok {
		return "", 0
	}
	m, err := calendar.ParseClock(v, end)
	if err != nil {
		p.Errorf(p.Deref(n), "%s: %v", what, err)
	}
	return v, m
}

// checkSchedules reports a descriptor with schedules but no limits of its
// own, and lints its windows: one that overlaps an earlier one (the earlier
// wins where they overlap), and one that earlier ones cover wholly (it
// never applies).
func (p *parser) checkSchedules(r *Rule, at *yaml.Node) {
	if len(r.Schedules) == 0 {
		return
	}
	if !r.limited {
		p.Errorf(at, "schedules need the descriptor's own rate_limit (what applies outside the windows); use rate_limit: {unlimited: true} for none")
	}
	reach, overlap := lintWindows(r.windows, time.Now())
	for i, s := range r.Schedules {
		node := &yaml.Node{Line: s.Line, Column: s.Column}
		switch {
		case !reach[i]:
			p.Warnf(node, "schedule %q never applies: the windows listed before it hold whenever it does", s.Name)
		case overlap[i] >= 0:
			p.Warnf(node, "schedule %q overlaps %q (line %d), listed first, which applies where both hold", s.Name, r.Schedules[overlap[i]].Name, r.Schedules[overlap[i]].Line)
		}
	}
}

// lintWindows walks a year of the windows from now, boundary by boundary,
// and says of each window whether it ever applies (no earlier window
// holds when it does) and which earlier window, if any, it overlaps (-1
// for none).
func lintWindows(ws []calendar.Window, now time.Time) (reach []bool, overlap []int) {
	reach = make([]bool, len(ws))
	overlap = make([]int, len(ws))
	for i := range overlap {
		overlap[i] = -1
	}
	end := now.AddDate(1, 0, 1)
	for t := now; t.Before(end); {
		first := -1
		next := time.Time{}
		for i, w := range ws {
			in, until := w.At(t)
			if in {
				if first < 0 {
					first = i
					reach[i] = true
				} else if overlap[i] < 0 {
					overlap[i] = first
				}
			}
			if !until.IsZero() && (next.IsZero() || until.Before(next)) {
				next = until
			}
		}
		if next.IsZero() {
			break
		}
		t = next
	}
	return reach, overlap
}

// setAt returns what r enforces at now: the set of the first window of its
// schedules that holds now, or its own; sched is the window's index (-1
// for its own) and until when the answer holds (zero: for ever).
func (r *Rule) setAt(now time.Time) (set *limitSet, sched int, until time.Time) {
	if len(r.windows) == 0 {
		return &r.set, -1, time.Time{}
	}
	i, until := calendar.Active(r.windows, now)
	if i < 0 {
		return &r.set, -1, until
	}
	return &r.Schedules[i].set, i, until
}
