package rules

import (
	"crypto/sha256"
	"fmt"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/calendar"
)

// Domain is the parsed rules of one domain: one rules file. It is immutable
// once parsed and shared by concurrent requests: callers must not modify it,
// its rules or their limits.
type Domain struct {
	// Name is the domain, as in the file's `domain:` key.
	Name string

	// File is the name the rules were parsed under.
	File string

	// Capacity is the domain-wide limit applied once to every request of
	// the domain (the `capacity:` extension), or nil.
	Capacity *sluice.Limit

	// FailurePolicy is how the domain's requests are answered when the
	// store fails (the `failure_policy:` extension); FailDefault, when the
	// file sets none, leaves it to the server.
	FailurePolicy FailurePolicy

	// AllOrNothing is how the domain's requests consume (the
	// `all_or_nothing:` extension): true, every limit of a request decided
	// together, none consumed when one denies; false, each limit on its
	// own, as envoyproxy/ratelimit counts; nil, when the file says
	// nothing, the front door's default (sluice serve: Envoy's way; the
	// library, httplimit and sluice proxy: all-or-nothing).
	AllOrNothing *bool

	// Rules lists every descriptor of the file, nested ones included, in
	// file order (depth first).
	Rules []*Rule

	// Warnings lists what the file says that has no effect, but loads in
	// envoyproxy/ratelimit and therefore loads here too: keys that Envoy
	// accepts anywhere and ignores where they stand, a requests_per_unit
	// next to unlimited, a replaces that names no limit of the domain.
	Warnings []Problem

	root  Rule
	names map[string]bool // every rate_limit name of the domain
	sum   [32]byte        // sha256 of the source
}

// Rule is one descriptor of a rules file: a key, an optional value, and
// optionally the limits that apply to requests reaching it.
type Rule struct {
	// Key and Value as written; Value is empty for a value-less rule,
	// which gives every distinct request value its own counter. A Value
	// containing '*' is a wildcard: each '*' matches any run of characters,
	// the empty run included, and every other character is literal (a
	// trailing '*' is Envoy's prefix wildcard). As in Envoy, a value-less
	// rule whose Key ends in '*' matches any key with that prefix.
	Key, Value string

	// Parent is the enclosing descriptor, nil at the top level.
	Parent *Rule

	// StatKey is Envoy's stats key of the rule: the domain and the
	// key_value (or key) of every descriptor on the path, joined by dots,
	// e.g. "messaging.message_type_marketing.to_number".
	StatKey string

	// Name is the rate_limit name that `replaces` refers to; empty if none.
	Name string

	// Replaces lists the names of the limits this rule's limits replace.
	Replaces []string

	// Limits are the compiled limits of the rule, all enforced together;
	// empty when the rule has no rate_limit or is unlimited.
	Limits []*sluice.Limit

	// Unlimited reports `unlimited: true`: the request matches but no limit
	// is enforced.
	Unlimited bool

	// Concurrency is the rule's cap on requests in flight per descriptor
	// value (`concurrency: {max, ttl}`), a sluice.Concurrency limit; nil
	// when none. It is enforced beside the rate limits, all or nothing with
	// them, and stays when schedules, calendars or runtime overrides change
	// the rates.
	Concurrency *sluice.Limit

	// Schedules are the windows whose limits replace Limits while they
	// hold (the `schedules:` extension), in file order: the first that
	// holds applies.
	Schedules []*Schedule

	// The descriptor flags, with Envoy's meaning.
	ShadowMode     bool // shadow_mode: evaluate and report, never deny
	DetailedMetric bool // detailed_metric: stats key carries request values
	ValueToMetric  bool // value_to_metric: this level's request value in the stats key
	ShareThreshold bool // share_threshold: all values matching this wildcard share a counter

	// QuotaMode (quota_mode) makes the descriptor a quota: a request is
	// denied by its quota descriptors only when every one of them is over
	// its limit (envoyproxy/ratelimit's quota mode).
	QuotaMode bool

	// Metadata (metadata) is what the rule tells Envoy when it allows a
	// request, in the response's dynamic metadata: a tree of maps, lists,
	// strings, float64 numbers, booleans and nils, as in JSON.
	Metadata map[string]any

	// Position of the descriptor in its file.
	File         string
	Line, Column int

	composite string            // key, or key_value: Envoy's map key
	children  map[string]*Rule  // by composite
	wildcards []*Rule           // wildcard children, in file order
	glob      glob              // the pattern of a wildcard rule, else nil
	limited   bool              // has a rate_limit block (limits or unlimited) or a concurrency
	depth     int               // 1 at the top level
	ident     string            // length-prefixed path, part of counter keys
	windows   []calendar.Window // of Schedules, in order
	set       limitSet          // what it enforces, outside its schedules' windows
}

// limitSet is what a rule, or a window of its schedules, enforces: its
// limits, their key tags (index, algorithm and period, part of counter
// keys), their calendars (nil when none has one), and whether it is
// unlimited. A match points to one, so that choosing a window costs a
// pointer.
type limitSet struct {
	limits    []*sluice.Limit
	tags      []string
	cals      []*calLimit
	unlimited bool
}

// HasRateLimit reports whether the rule has a rate_limit (or rate_limits)
// block, unlimited included, or a concurrency: a request whose last entry reaches a rule
// without one matches nothing.
func (r *Rule) HasRateLimit() bool { return r.limited }

// merge adds the descriptors of o, another file of the same domain, to d
// (LoadOptions.MergeDomains) and returns the problems: a top-level
// descriptor both define, or a domain-wide setting both set to different
// values. d's digest becomes that of both sources, in order.
func (d *Domain) merge(o *Domain) []Problem {
	var probs []Problem
	conflict := func(what string) {
		probs = append(probs, Problem{File: o.File, Line: 1, Msg: fmt.Sprintf("%s of domain '%s' differs from the one in %s (files of one domain merge their descriptors, not their %s)", what, d.Name, d.File, what)})
	}
	for k, r := range o.root.children {
		if first, dup := d.root.children[k]; dup {
			probs = append(probs, Problem{File: r.File, Line: r.Line, Column: r.Column, Msg: fmt.Sprintf("duplicate descriptor composite key '%s' (also in %s at line %d)", r.StatKey, first.File, first.Line)})
			continue
		}
		d.root.children[k] = r
	}
	d.root.wildcards = append(d.root.wildcards, o.root.wildcards...)
	d.Rules = append(d.Rules, o.Rules...)
	for n := range o.names {
		d.names[n] = true
	}
	switch {
	case o.Capacity == nil:
	case d.Capacity == nil:
		d.Capacity = o.Capacity
	case *d.Capacity != *o.Capacity:
		conflict("capacity")
	}
	switch {
	case o.FailurePolicy == FailDefault:
	case d.FailurePolicy == FailDefault:
		d.FailurePolicy = o.FailurePolicy
	case d.FailurePolicy != o.FailurePolicy:
		conflict("failure_policy")
	}
	switch {
	case o.AllOrNothing == nil:
	case d.AllOrNothing == nil:
		d.AllOrNothing = o.AllOrNothing
	case *d.AllOrNothing != *o.AllOrNothing:
		conflict("all_or_nothing")
	}
	d.Warnings = append(d.Warnings, o.Warnings...)
	d.sum = sha256.Sum256(append(d.sum[:], o.sum[:]...))
	return probs
}
