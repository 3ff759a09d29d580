package rules

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algo"
)

// MaxPeriod bounds every period, refill interval and block_for of a rules
// file.
const MaxPeriod = 100 * 365 * 24 * time.Hour

// envoyKeys are the keys envoyproxy/ratelimit accepts anywhere in a file
// (its validation is flat); where they have no meaning it ignores them.
var envoyKeys = map[string]bool{
	"domain": true, "key": true, "value": true, "descriptors": true,
	"rate_limit": true, "unit": true, "requests_per_unit": true,
	"unlimited": true, "shadow_mode": true, "name": true, "replaces": true,
	"detailed_metric": true, "value_to_metric": true, "share_threshold": true,
}

// The keys each kind of mapping takes.
var (
	rootKeys       = []string{"domain", "descriptors", "capacity", "failure_policy", "http"}
	descriptorKeys = []string{"key", "value", "rate_limit", "rate_limits", "descriptors", "shadow_mode", "detailed_metric", "value_to_metric", "share_threshold"}
	limitKeys      = []string{"unit", "requests_per_unit", "unit_multiplier", "period", "algorithm", "burst", "refill_interval", "refill_amount", "soft_percent", "block_for", "sketch"}
	rateLimitKeys  = append(slices.Clone(limitKeys), "unlimited", "name", "replaces", "elastic_ceiling")
	listItemKeys   = append(slices.Clone(limitKeys), "name", "replaces", "elastic_ceiling")
	capacityKeys   = append(slices.Clone(limitKeys), "shadow_mode")
	replacesKeys   = []string{"name"}
	sketchKeys     = []string{"width", "depth"}
)

// maxDepth bounds the nesting of descriptors (and of the walk of a request
// descriptor, which never goes deeper than the rules).
const maxDepth = 64

// nodeBudget bounds the work on one file, aliases included, so that no
// input (an alias bomb, a recursive alias) makes parsing run away.
const nodeBudget = 1 << 20

// Parse parses one rules file: one domain. name is used in problems and as
// Domain.File. An invalid file gives an *Error listing every problem.
func Parse(name string, data []byte) (*Domain, error) {
	p := &parser{file: name, budget: nodeBudget}
	d := &Domain{File: name, names: map[string]bool{}, sum: sha256.Sum256(data)}
	d.root.children = map[string]*Rule{}
	p.d = d
	p.parse(data)
	if len(p.probs) > 0 {
		return nil, &Error{Problems: p.probs}
	}
	d.Warnings = p.warns
	return d, nil
}

type parser struct {
	file   string
	d      *Domain
	probs  []Problem
	warns  []Problem
	budget int
	broke  bool // budget exhausted: stop reporting

	elastic  []*yaml.Node // limits with an elastic_ceiling: need a capacity
	replaces []*yaml.Node // replaces names, checked against the domain's names
}

func (p *parser) errf(n *yaml.Node, format string, args ...any) {
	if p.broke {
		return
	}
	line, col := 0, 0
	if n != nil {
		line, col = n.Line, n.Column
	}
	p.probs = append(p.probs, Problem{File: p.file, Line: line, Column: col, Msg: fmt.Sprintf(format, args...)})
}

func (p *parser) warnf(n *yaml.Node, format string, args ...any) {
	p.warns = append(p.warns, Problem{File: p.file, Line: n.Line, Column: n.Column, Msg: fmt.Sprintf(format, args...)})
}

func (p *parser) parse(data []byte) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.probs = append(p.probs, Problem{File: p.file, Line: 1, Column: 1, Msg: "config file cannot have empty domain"})
			return
		}
		p.yamlError(err)
		return
	}
	// Envoy reads the first document only; so does sluice, with a warning.
	var next yaml.Node
	if err := dec.Decode(&next); err == nil || !errors.Is(err, io.EOF) {
		line := next.Line
		if m := yamlLine.FindStringSubmatch(fmt.Sprint(err)); err != nil && m != nil {
			line, _ = strconv.Atoi(m[1])
		}
		p.warns = append(p.warns, Problem{File: p.file, Line: line, Msg: "a second YAML document is ignored (one domain per file)"})
	}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			p.errf(root, "config file cannot have empty domain")
			return
		}
		root = root.Content[0]
	}
	p.root(root)
}

// yamlError reports a syntax error of the YAML itself, with its line.
func (p *parser) yamlError(err error) {
	p.probs = append(p.probs, SyntaxProblem(p.file, err))
}

// deref follows aliases, charging the budget.
func (p *parser) deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		if !p.spend(n) {
			return nil
		}
		n = n.Alias
	}
	if n != nil && !p.spend(n) {
		return nil
	}
	return n
}

func (p *parser) spend(n *yaml.Node) bool {
	if p.budget <= 0 {
		if !p.broke {
			p.errf(n, "file too large or too deeply aliased")
			p.broke = true
		}
		return false
	}
	p.budget--
	return true
}

type pair struct{ k, v *yaml.Node }

// mapping returns the key/value pairs of a mapping with merge keys (<<)
// applied, reporting non-string and repeated keys; ok is false when n is
// not a mapping.
func (p *parser) mapping(n *yaml.Node, what string) ([]pair, bool) {
	n = p.deref(n)
	if n == nil {
		return nil, false
	}
	if n.Kind != yaml.MappingNode {
		p.errf(n, "%s must be a mapping, got %s", what, describe(n))
		return nil, false
	}
	var out []pair
	seen := map[string]*yaml.Node{}
	var merged []pair
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := p.deref(n.Content[i]), n.Content[i+1]
		if k == nil {
			return nil, false
		}
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			merged = append(merged, p.merge(v)...)
			continue
		}
		if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
			p.errf(k, "key is not a string: %s", describe(k))
			continue
		}
		if first, dup := seen[k.Value]; dup {
			p.errf(k, "key %q repeated (first at line %d)", k.Value, first.Line)
			continue
		}
		seen[k.Value] = k
		out = append(out, pair{k, v})
	}
	for _, m := range merged {
		if _, dup := seen[m.k.Value]; !dup {
			seen[m.k.Value] = m.k
			out = append(out, m)
		}
	}
	return out, true
}

// merge returns the pairs a merge key brings in: from a mapping, or from a
// sequence of mappings where earlier ones win.
func (p *parser) merge(v *yaml.Node) []pair {
	v = p.deref(v)
	if v == nil {
		return nil
	}
	var srcs []*yaml.Node
	switch v.Kind {
	case yaml.MappingNode:
		srcs = []*yaml.Node{v}
	case yaml.SequenceNode:
		srcs = v.Content
	default:
		p.errf(v, "a merge key (<<) needs a mapping or a list of mappings, got %s", describe(v))
		return nil
	}
	var out []pair
	seen := map[string]bool{}
	for _, s := range srcs {
		ps, ok := p.mapping(s, "a merged value")
		if !ok {
			continue
		}
		for _, kv := range ps {
			if !seen[kv.k.Value] {
				seen[kv.k.Value] = true
				out = append(out, kv)
			}
		}
	}
	return out
}

// unknown reports a key that the mapping does not take. Keys that
// envoyproxy/ratelimit accepts anywhere are warnings where Envoy ignores them
// (envoyPos), errors in the sluice-only mappings.
func (p *parser) unknown(k *yaml.Node, what string, allowed []string, envoyPos bool) {
	if envoyPos && envoyKeys[k.Value] {
		p.warnf(k, "%q has no effect in %s and is ignored (as Envoy does)", k.Value, what)
		return
	}
	p.errf(k, "unknown key %q in %s (want one of %s)", k.Value, what, strings.Join(allowed, ", "))
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "null"
		case "!!str":
			return fmt.Sprintf("the string %q", n.Value)
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "an alias"
}

// str reads a string field as yaml.v2 (and so Envoy) does: any scalar's
// text, null as empty.
func (p *parser) str(n *yaml.Node, what string) (string, bool) {
	n = p.deref(n)
	if n == nil {
		return "", false
	}
	if n.Kind != yaml.ScalarNode {
		p.errf(n, "%s must be a string, got %s", what, describe(n))
		return "", false
	}
	if n.ShortTag() == "!!null" {
		return "", true
	}
	return n.Value, true
}

// YAML 1.1 booleans, which yaml.v2 (and so Envoy) accepts.
var (
	yamlTrue  = []string{"y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"}
	yamlFalse = []string{"n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"}
)

func (p *parser) boolean(n *yaml.Node, what string) (bool, bool) {
	n = p.deref(n)
	if n == nil {
		return false, false
	}
	if n.Kind == yaml.ScalarNode {
		if n.ShortTag() == "!!null" {
			return false, true
		}
		if n.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle) == 0 {
			if slices.Contains(yamlTrue, n.Value) {
				return true, true
			}
			if slices.Contains(yamlFalse, n.Value) {
				return false, true
			}
		}
	}
	p.errf(n, "%s must be true or false, got %s", what, describe(n))
	return false, false
}

// integer reads a whole number as yaml.v2 does (decimal, 0x, 0o, 0b, leading
// zero octal, underscores) and checks lo <= value <= hi.
func (p *parser) integer(n *yaml.Node, what string, lo, hi int64) (int64, bool) {
	n = p.deref(n)
	if n == nil {
		return 0, false
	}
	if n.Kind != yaml.ScalarNode || n.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle) != 0 || n.ShortTag() == "!!null" {
		p.errf(n, "%s must be a whole number, got %s", what, describe(n))
		return 0, false
	}
	s := strings.ReplaceAll(n.Value, "_", "")
	v, err := strconv.ParseInt(s, 0, 64)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
			p.errf(n, "%s %s is out of range (%d to %d)", what, n.Value, lo, hi)
		} else {
			p.errf(n, "%s must be a whole number, got %s", what, describe(n))
		}
		return 0, false
	}
	if v < lo || v > hi {
		p.errf(n, "%s must be between %d and %d, got %d", what, lo, hi, v)
		return 0, false
	}
	return v, true
}

// duration reads a Go duration (90s, 1h30m), positive and at most MaxPeriod.
func (p *parser) duration(n *yaml.Node, what string) (time.Duration, bool) {
	n = p.deref(n)
	if n == nil {
		return 0, false
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" {
		p.errf(n, "%s must be a duration such as 90s or 1h30m, got %s", what, describe(n))
		return 0, false
	}
	d, err := time.ParseDuration(n.Value)
	if err != nil {
		p.errf(n, "%s must be a duration such as 90s or 1h30m, got %q", what, n.Value)
		return 0, false
	}
	if d <= 0 || d > MaxPeriod {
		p.errf(n, "%s must be positive and at most %s, got %s", what, MaxPeriod, n.Value)
		return 0, false
	}
	return d, true
}

func (p *parser) root(n *yaml.Node) {
	if isNull(n) {
		p.errf(n, "config file cannot have empty domain")
		return
	}
	pairs, ok := p.mapping(n, "a rules file")
	if !ok {
		return
	}
	var descs, capacity *yaml.Node
	domainSeen := false
	for _, kv := range pairs {
		switch kv.k.Value {
		case "domain":
			domainSeen = true
			if s, ok := p.str(kv.v, "domain"); ok {
				p.d.Name = s
				if s == "" {
					p.errf(kv.v, "config file cannot have empty domain")
				}
			}
		case "descriptors":
			descs = kv.v
		case "capacity":
			capacity = kv.v
		case "failure_policy":
			p.failurePolicy(kv.v)
		case "http":
			// The section of the HTTP front doors (sluice proxy), which
			// read it themselves (package httpconf): not rules.
		default:
			p.unknown(kv.k, "the file's top level", rootKeys, true)
		}
	}
	if !domainSeen {
		p.errf(n, "config file cannot have empty domain")
	}
	if capacity != nil {
		p.capacity(capacity)
	}
	if descs != nil {
		p.descriptors(&p.d.root, descs)
	}
	if p.d.Capacity == nil {
		for _, e := range p.elastic {
			p.errf(e, "elastic_ceiling needs a domain capacity (a top-level capacity: block)")
		}
	}
	for _, r := range p.replaces {
		if !p.d.names[r.Value] {
			p.warnf(r, "replaces names %q, which no rate_limit of domain %q has", r.Value, p.d.Name)
		}
	}
}

func (p *parser) failurePolicy(n *yaml.Node) {
	name, ok := p.str(n, "failure_policy")
	if !ok {
		return
	}
	fp, err := ParseFailurePolicy(name)
	if err != nil {
		p.errf(p.deref(n), "%v", err)
		return
	}
	p.d.FailurePolicy = fp
}

func (p *parser) capacity(n *yaml.Node) {
	pairs, ok := p.mapping(n, "capacity")
	if !ok {
		return
	}
	var spec limitSpec
	var shadow bool
	for _, kv := range pairs {
		if kv.k.Value == "shadow_mode" {
			shadow, _ = p.boolean(kv.v, "shadow_mode")
			continue
		}
		if !p.limitKey(&spec, kv) {
			p.unknown(kv.k, "capacity", capacityKeys, false)
		}
	}
	l, ok := p.compile(p.deref(n), &spec, "capacity")
	if !ok {
		return
	}
	l.Name = p.d.Name + ".capacity"
	l.Shadow = shadow
	p.d.Capacity = l
}

func (p *parser) descriptors(parent *Rule, n *yaml.Node) {
	n = p.deref(n)
	if n == nil {
		return
	}
	if parent.depth >= maxDepth {
		p.errf(n, "descriptors nested deeper than %d levels", maxDepth)
		return
	}
	if isNull(n) {
		return
	}
	if n.Kind != yaml.SequenceNode {
		p.errf(n, "descriptors must be a list, got %s", describe(n))
		return
	}
	for _, item := range n.Content {
		p.descriptor(parent, item)
	}
}

func (p *parser) descriptor(parent *Rule, n *yaml.Node) {
	pairs, ok := p.mapping(n, "a descriptor")
	if !ok {
		return
	}
	n = p.deref(n)
	r := &Rule{File: p.file, Line: n.Line, Column: n.Column, depth: parent.depth + 1}
	if parent != &p.d.root {
		r.Parent = parent
	}
	var rl, rls, children, valueNode *yaml.Node
	keySeen := false
	for _, kv := range pairs {
		switch kv.k.Value {
		case "key":
			keySeen = true
			r.Key, _ = p.str(kv.v, "key")
		case "value":
			r.Value, _ = p.str(kv.v, "value")
			valueNode = kv.v
		case "rate_limit":
			rl = kv.v
		case "rate_limits":
			rls = kv.v
		case "descriptors":
			children = kv.v
		case "shadow_mode":
			r.ShadowMode, _ = p.boolean(kv.v, "shadow_mode")
		case "detailed_metric":
			r.DetailedMetric, _ = p.boolean(kv.v, "detailed_metric")
		case "value_to_metric":
			r.ValueToMetric, _ = p.boolean(kv.v, "value_to_metric")
		case "share_threshold":
			r.ShareThreshold, _ = p.boolean(kv.v, "share_threshold")
		default:
			p.unknown(kv.k, "a descriptor", descriptorKeys, true)
		}
	}
	// A descriptor in error is still checked through, nested descriptors
	// included, so that every problem of the file is reported; it is not
	// added to the tree.
	valid := true
	if r.Key == "" {
		if keySeen {
			p.errf(n, "descriptor has empty key")
		} else {
			p.errf(n, "descriptor has empty key (every descriptor needs a key:)")
		}
		valid = false
	}
	r.composite = r.Key
	if r.Value != "" {
		r.composite += "_" + r.Value
	}
	parentStat := p.d.Name
	parentIdent := ""
	if r.Parent != nil {
		parentStat = r.Parent.StatKey
		parentIdent = r.Parent.ident
	}
	r.StatKey = parentStat + "." + r.composite
	r.ident = parentIdent + field(r.Key) + field(r.Value)
	if first, dup := parent.children[r.composite]; dup && valid {
		p.errf(n, "duplicate descriptor composite key '%s' (first at line %d)", r.StatKey, first.Line)
		valid = false
	}
	r.glob = compileGlob(r.Key, r.Value)
	if r.ShareThreshold && r.glob == nil {
		at := valueNode
		if at == nil {
			at = n
		}
		p.errf(at, "share_threshold can only be used with wildcard values (containing '*'), but found key '%s'", r.composite)
	}
	r.children = map[string]*Rule{}
	if valid {
		parent.children[r.composite] = r
		if r.glob != nil {
			parent.wildcards = append(parent.wildcards, r)
		}
		p.d.Rules = append(p.d.Rules, r)
	}

	switch {
	case rl != nil && rls != nil:
		p.errf(rls, "rate_limits and rate_limit cannot both be set; put every limit in rate_limits")
	case rl != nil:
		p.rateLimit(r, rl)
	case rls != nil:
		p.rateLimits(r, rls)
	}
	if children != nil {
		p.descriptors(r, children)
	}
}

// limitSpec collects the keys of one limit block before compiling it.
type limitSpec struct {
	unit, rpu, mult, period, alg, burst *yaml.Node
	refillInterval, refillAmount        *yaml.Node
	soft, elastic, blockFor, sketch     *yaml.Node
}

// limitKey records kv in s if it is a limit key.
func (p *parser) limitKey(s *limitSpec, kv pair) bool {
	slot := map[string]**yaml.Node{
		"unit": &s.unit, "requests_per_unit": &s.rpu, "unit_multiplier": &s.mult,
		"period": &s.period, "algorithm": &s.alg, "burst": &s.burst,
		"refill_interval": &s.refillInterval, "refill_amount": &s.refillAmount,
		"soft_percent": &s.soft, "block_for": &s.blockFor, "sketch": &s.sketch,
	}[kv.k.Value]
	if slot == nil {
		return false
	}
	*slot = kv.v
	return true
}

// extensions reports the first sluice-only key of s, or nil.
func (s *limitSpec) extension() *yaml.Node {
	for _, n := range []*yaml.Node{s.mult, s.period, s.alg, s.burst, s.refillInterval, s.refillAmount, s.soft, s.elastic, s.blockFor, s.sketch} {
		if n != nil {
			return n
		}
	}
	return nil
}

func (p *parser) rateLimit(r *Rule, n *yaml.Node) {
	n = p.deref(n)
	if n == nil {
		return
	}
	if isNull(n) {
		p.warnf(n, "rate_limit is empty: the descriptor has no limit (as in Envoy)")
		return
	}
	pairs, ok := p.mapping(n, "rate_limit")
	if !ok {
		return
	}
	var spec limitSpec
	var unlimited bool
	unlimitedOK := true
	for _, kv := range pairs {
		switch kv.k.Value {
		case "unlimited":
			unlimited, unlimitedOK = p.boolean(kv.v, "unlimited")
		case "name":
			p.name(r, kv.v)
		case "replaces":
			p.replacesList(r, kv.v)
		case "elastic_ceiling":
			spec.elastic = kv.v
		default:
			if !p.limitKey(&spec, kv) {
				p.unknown(kv.k, "rate_limit", rateLimitKeys, true)
			}
		}
	}
	r.limited = true
	if !unlimitedOK {
		return
	}
	if unlimited {
		r.Unlimited = true
		if spec.unit != nil {
			if s, ok := p.str(spec.unit, "unit"); ok {
				if _, err := ParseUnit(s); err == nil {
					p.errf(spec.unit, "should not specify rate limit unit when unlimited")
				}
			}
		}
		if e := spec.extension(); e != nil {
			p.errf(e, "an unlimited rate_limit takes no other settings")
		}
		if spec.rpu != nil {
			p.warnf(spec.rpu, "requests_per_unit is ignored when unlimited")
		}
		return
	}
	l, ok := p.compile(n, &spec, "rate_limit")
	if !ok {
		return
	}
	p.finish(r, []*sluice.Limit{l}, []*limitSpec{&spec})
}

func (p *parser) rateLimits(r *Rule, n *yaml.Node) {
	n = p.deref(n)
	if n == nil {
		return
	}
	if n.Kind != yaml.SequenceNode {
		p.errf(n, "rate_limits must be a list of limits, got %s", describe(n))
		return
	}
	if len(n.Content) == 0 {
		p.errf(n, "rate_limits is empty")
		return
	}
	r.limited = true
	var limits []*sluice.Limit
	var specs []*limitSpec
	okAll := true
	for _, item := range n.Content {
		pairs, ok := p.mapping(item, "a rate_limits entry")
		if !ok {
			okAll = false
			continue
		}
		spec := &limitSpec{}
		for _, kv := range pairs {
			switch kv.k.Value {
			case "name":
				p.name(r, kv.v)
			case "replaces":
				p.replacesList(r, kv.v)
			case "elastic_ceiling":
				spec.elastic = kv.v
			case "unlimited":
				p.errf(kv.k, "unlimited is not allowed in rate_limits; use rate_limit: {unlimited: true}")
			default:
				if !p.limitKey(spec, kv) {
					p.unknown(kv.k, "a rate_limits entry", listItemKeys, false)
				}
			}
		}
		l, ok := p.compile(p.deref(item), spec, "this limit")
		if !ok {
			okAll = false
			continue
		}
		limits = append(limits, l)
		specs = append(specs, spec)
	}
	if okAll {
		p.finish(r, limits, specs)
	}
}

// finish names the rule's limits and applies the descriptor's flags.
func (p *parser) finish(r *Rule, limits []*sluice.Limit, specs []*limitSpec) {
	for i, l := range limits {
		base := r.Name
		if base == "" {
			base = r.StatKey
		}
		l.Name = base
		if len(limits) > 1 {
			l.Name = fmt.Sprintf("%s#%d", base, i)
		}
		l.Shadow = r.ShadowMode
		if specs[i].elastic != nil {
			p.elastic = append(p.elastic, specs[i].elastic)
		}
		r.tags = append(r.tags, fmt.Sprintf("#%d/%s/%d/%d", i, l.Algorithm, int64(l.Period), int64(l.RefillInterval)))
	}
	r.Limits = limits
}

func (p *parser) name(r *Rule, n *yaml.Node) {
	s, ok := p.str(n, "name")
	if !ok || s == "" {
		return
	}
	if r.Name != "" && r.Name != s {
		p.errf(n, "the limits of one descriptor share one name: %q and %q differ", r.Name, s)
		return
	}
	r.Name = s
	p.d.names[s] = true
	for _, rep := range r.Replaces {
		if rep == s {
			p.errf(n, "replaces should not contain name of same descriptor")
		}
	}
}

func (p *parser) replacesList(r *Rule, n *yaml.Node) {
	n = p.deref(n)
	if n == nil || (isNull(n)) {
		return
	}
	if n.Kind != yaml.SequenceNode {
		p.errf(n, "replaces must be a list like [{name: other}], got %s", describe(n))
		return
	}
	for _, item := range n.Content {
		it := p.deref(item)
		if it == nil {
			return
		}
		if it.Kind != yaml.MappingNode {
			p.errf(it, "replaces entries must be mappings like {name: other}, got %s", describe(it))
			continue
		}
		pairs, _ := p.mapping(it, "a replaces entry")
		var name string
		var nameNode *yaml.Node
		for _, kv := range pairs {
			if kv.k.Value == "name" {
				name, _ = p.str(kv.v, "name")
				nameNode = p.deref(kv.v)
				continue
			}
			p.unknown(kv.k, "a replaces entry", replacesKeys, true)
		}
		if name == "" {
			p.errf(it, "should not have an empty replaces entry")
			continue
		}
		if name == r.Name {
			p.errf(nameNode, "replaces should not contain name of same descriptor")
			continue
		}
		if !slices.Contains(r.Replaces, name) {
			r.Replaces = append(r.Replaces, name)
		}
		p.replaces = append(p.replaces, nameNode)
	}
}

// compile turns a limit block into a valid sluice.Limit, reporting every
// problem; at is the block, for problems of the block as a whole.
func (p *parser) compile(at *yaml.Node, s *limitSpec, what string) (*sluice.Limit, bool) {
	before := len(p.probs)
	l := &sluice.Limit{}
	p.algorithm(l, s)
	p.rate(l, s, at, what)
	p.extras(l, s, before)
	if len(p.probs) > before {
		return nil, false
	}
	if err := l.Validate(); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			p.errf(at, "%s: %s", what, line)
		}
		return nil, false
	}
	return l, true
}

// algorithm reads the spec's algorithm into l.
func (p *parser) algorithm(l *sluice.Limit, s *limitSpec) {
	if s.alg != nil {
		if name, ok := p.str(s.alg, "algorithm"); ok {
			k, err := algo.ParseKind(name)
			if err != nil {
				p.errf(p.deref(s.alg), "%v", err)
			}
			l.Algorithm = k
		}
	}
}

// rate reads into l the rate of the spec at (a limit of what): its count
// and period, or its refill amount and interval, and the refill interval
// of a discrete token bucket.
func (p *parser) rate(l *sluice.Limit, s *limitSpec, at *yaml.Node, what string) {
	// The rate: requests_per_unit per unit (times unit_multiplier) or per
	// period, or refill_amount per refill_interval.
	var rpu int64
	if s.rpu != nil {
		rpu, _ = p.integer(s.rpu, "requests_per_unit", 0, sluice.MaxCost)
	}
	var unitNode *yaml.Node
	if s.unit != nil {
		unitNode = p.deref(s.unit)
	}
	switch {
	case s.refillAmount != nil:
		amount, ok := p.integer(s.refillAmount, "refill_amount", 1, sluice.MaxCost)
		for _, other := range []*yaml.Node{s.rpu, s.unit, s.period, s.mult} {
			if other != nil {
				p.errf(p.deref(other), "refill_amount (with refill_interval) states the rate; leave out requests_per_unit, unit, unit_multiplier and period")
				break
			}
		}
		if s.refillInterval == nil {
			p.errf(p.deref(s.refillAmount), "refill_amount needs refill_interval")
		} else if iv, ok2 := p.duration(s.refillInterval, "refill_interval"); ok && ok2 {
			l.Rate, l.Period, l.RefillInterval = amount, iv, iv
		}
	case s.period != nil:
		if s.unit != nil {
			p.errf(unitNode, "set either unit (with unit_multiplier) or period, not both")
		}
		if s.mult != nil {
			p.errf(p.deref(s.mult), "unit_multiplier goes with unit, not with period")
		}
		if d, ok := p.duration(s.period, "period"); ok {
			l.Period = d
		}
		l.Rate = rpu
	case s.unit != nil:
		name, ok := p.str(s.unit, "unit")
		if !ok {
			break
		}
		u, err := ParseUnit(name)
		if err != nil {
			p.errf(unitNode, "%v", err)
			break
		}
		mult := int64(1)
		if s.mult != nil {
			maxMult := int64(MaxPeriod / u.Duration())
			m, ok := p.integer(s.mult, "unit_multiplier", 1, maxMult)
			if !ok {
				break
			}
			mult = m
		}
		l.Period = u.Duration() * time.Duration(mult)
		l.Rate = rpu
	default:
		p.errf(at, "invalid rate limit unit '' (%s needs unit: one of %s, or a period, or unlimited: true)", what, unitNames)
	}
	if s.rpu == nil && s.refillAmount == nil && l.Period > 0 {
		p.warnf(at, "requests_per_unit is missing, so it is 0 and every request is denied (as in Envoy)")
	}

	if s.refillInterval != nil && s.refillAmount == nil {
		if d, ok := p.duration(s.refillInterval, "refill_interval"); ok {
			l.RefillInterval = d
		}
	}
	if l.RefillInterval > 0 && l.Algorithm != sluice.TokenBucket {
		p.errf(p.deref(s.refillInterval), "refill_interval needs algorithm: token_bucket, not %s", l.Algorithm)
	}
}

// extras reads into l what the spec adds to its rate: burst, soft and
// elastic margins, block_for and the sketch's size. before is the count of
// problems when the limit's reading began: the elastic ceiling is checked
// against the limit only when the rest read without one.
func (p *parser) extras(l *sluice.Limit, s *limitSpec, before int) {
	if s.burst != nil {
		if b, ok := p.integer(s.burst, "burst", 1, sluice.MaxCost); ok {
			// DESIGN.md's own example sets a burst on a sliding window:
			// it loads, with a warning.
			if l.Algorithm == sluice.TokenBucket || l.Algorithm == sluice.LeakyBucket || l.Algorithm == sluice.GCRA {
				l.Burst = b
			} else {
				p.warnf(p.deref(s.burst), "burst has no effect on %s (only on token_bucket, leaky_bucket and gcra) and is ignored", l.Algorithm)
			}
		}
	}
	if s.soft != nil {
		if v, ok := p.integer(s.soft, "soft_percent", 0, sluice.MaxPercent); ok {
			l.SoftPercent = int(v)
		}
	}
	if s.elastic != nil {
		if v, ok := p.integer(s.elastic, "elastic_ceiling", 1, sluice.MaxCost); ok {
			l.ElasticCeiling = v
			if len(p.probs) == before && v < l.Nominal() {
				p.errf(p.deref(s.elastic), "elastic_ceiling %d is below the limit %d", v, l.Nominal())
			}
		}
	}
	if s.blockFor != nil {
		if d, ok := p.duration(s.blockFor, "block_for"); ok {
			l.BlockFor = d
		}
	}
	if s.sketch != nil {
		p.sketch(l, s.sketch)
	}
}

func (p *parser) sketch(l *sluice.Limit, n *yaml.Node) {
	pairs, ok := p.mapping(n, "sketch")
	if !ok {
		return
	}
	if l.Algorithm != sluice.Sketch {
		p.errf(p.deref(n), "sketch settings apply only to algorithm: sketch, not %s", l.Algorithm)
	}
	var w, d int64
	for _, kv := range pairs {
		switch kv.k.Value {
		case "width":
			w, _ = p.integer(kv.v, "sketch width", 1, sluice.MaxSketchCells)
		case "depth":
			d, _ = p.integer(kv.v, "sketch depth", 1, 64)
		default:
			p.unknown(kv.k, "sketch", sketchKeys, false)
		}
	}
	l.Sketch = sluice.SketchConfig{Width: int(w), Depth: int(d)}
	ww, dd := l.SketchDims()
	if ww > 0 && dd > 0 && int64(ww)*int64(dd) > sluice.MaxSketchCells {
		p.errf(p.deref(n), "sketch width*depth must be at most %d, got %dx%d", sluice.MaxSketchCells, ww, dd)
	}
}

// field encodes s length-prefixed, so that concatenated fields are never
// ambiguous whatever bytes s holds.
func field(s string) string {
	return strconv.Itoa(len(s)) + ":" + s
}
