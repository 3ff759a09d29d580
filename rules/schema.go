package rules

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/yamlwalk"
)

// envoyKeys are the keys envoyproxy/ratelimit accepts anywhere in a file
// (its validation is flat); where they have no meaning it ignores them.
var envoyKeys = map[string]bool{
	"domain": true, "key": true, "value": true, "descriptors": true,
	"rate_limit": true, "unit": true, "requests_per_unit": true,
	"unlimited": true, "shadow_mode": true, "name": true, "replaces": true,
	"detailed_metric": true, "value_to_metric": true, "share_threshold": true,
	"quota_mode": true, "metadata": true,
}

// The keys each kind of mapping takes.
var (
	rootKeys       = []string{"domain", "descriptors", "capacity", "failure_policy", "all_or_nothing", "consistency", "max_overshoot", "http"}
	descriptorKeys = []string{"key", "value", "rate_limit", "rate_limits", "schedules", "descriptors", "concurrency", "shadow_mode", "quota_mode", "metadata", "detailed_metric", "value_to_metric", "share_threshold"}
	limitKeys      = []string{"unit", "requests_per_unit", "unit_multiplier", "period", "algorithm", "burst", "refill_interval", "refill_amount", "soft_percent", "block_for", "sketch", "debit", "consistency", "max_overshoot", "calendar", "global"}
	rateLimitKeys  = append(slices.Clone(limitKeys), "unlimited", "name", "replaces", "elastic_ceiling")
	listItemKeys   = append(slices.Clone(limitKeys), "name", "replaces", "elastic_ceiling")
	capacityKeys   = append(slices.Clone(limitKeys), "shadow_mode")
	replacesKeys   = []string{"name"}
	sketchKeys     = []string{"width", "depth"}
)

// unknown reports a key that the mapping does not take. Keys that
// envoyproxy/ratelimit accepts anywhere are warnings where Envoy ignores them
// (envoyPos), errors in the sluice-only mappings.
func (p *parser) unknown(k *yaml.Node, what string, allowed []string, envoyPos bool) {
	if envoyPos && envoyKeys[k.Value] {
		p.Warnf(k, "%q has no effect in %s and is ignored (as Envoy does)", k.Value, what)
		return
	}
	p.Unknown(k, what, allowed)
}

// root reads a whole rules file: its top-level keys, then the capacity
// and the descriptors, then what refers from one part of the file to
// another.
func (p *parser) root(n *yaml.Node) {
	if yamlwalk.IsNull(n) {
		p.Errorf(n, "config file cannot have empty domain")
		return
	}
	pairs, ok := p.Mapping(n, "a rules file")
	if !ok {
		return
	}
	f := p.rootFields(pairs)
	if !f.domainSeen {
		p.Errorf(n, "config file cannot have empty domain")
	}
	if f.capacity != nil {
		p.capacity(f.capacity)
	}
	if f.descs != nil {
		p.descriptors(&p.d.root, f.descs)
	}
	p.crossCheck()
}

// rootNodes are the top-level keys read after the others: the descriptors
// and the capacity, and whether the file has a domain.
type rootNodes struct {
	descs, capacity *yaml.Node
	domainSeen      bool
}

// rootFields reads the file's top-level keys into the domain, and returns
// those read later.
func (p *parser) rootFields(pairs []yamlwalk.Pair) rootNodes {
	var f rootNodes
	for _, kv := range pairs {
		switch kv.K.Value {
		case "domain":
			f.domainSeen = true
			if s, ok := p.str(kv.V, "domain"); ok {
				p.d.Name = s
				if s == "" {
					p.Errorf(kv.V, "config file cannot have empty domain")
				}
			}
		case "descriptors":
			f.descs = kv.V
		case "capacity":
			f.capacity = kv.V
		case "failure_policy":
			p.failurePolicy(kv.V)
		case "all_or_nothing":
			if b, ok := p.boolean(kv.V, "all_or_nothing"); ok {
				p.d.AllOrNothing = &b
			}
		case "consistency":
			// The default of every limit of the domain; read with
			// each limit (compile.go).
			p.consistency = kv.V
		case "max_overshoot":
			p.overshoot = kv.V
		case "http":
			// The section of the HTTP front doors (sluice proxy), which
			// read it themselves (package httpconf): not rules.
		default:
			p.unknown(kv.K, "the file's top level", rootKeys, true)
		}
	}
	return f
}

// crossCheck reports, once the whole file is read, what refers to another
// part of it: an elastic_ceiling without a domain capacity, and a
// replaces that names no rate_limit of the domain.
func (p *parser) crossCheck() {
	if p.d.Capacity == nil {
		for _, e := range p.elastic {
			p.Errorf(e, "elastic_ceiling needs a domain capacity (a top-level capacity: block)")
		}
	}
	for _, r := range p.replaces {
		if !p.d.names[r.Value] {
			p.Warnf(r, "replaces names %q, which no rate_limit of domain %q has", r.Value, p.d.Name)
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
		p.Errorf(p.Deref(n), "%v", err)
		return
	}
	p.d.FailurePolicy = fp
}

func (p *parser) capacity(n *yaml.Node) {
	pairs, ok := p.Mapping(n, "capacity")
	if !ok {
		return
	}
	var spec limitSpec
	var shadow bool
	for _, kv := range pairs {
		if kv.K.Value == "shadow_mode" {
			shadow, _ = p.boolean(kv.V, "shadow_mode")
			continue
		}
		if !p.limitKey(&spec, kv) {
			p.unknown(kv.K, "capacity", capacityKeys, false)
		}
	}
	if spec.calendar != nil {
		p.Errorf(p.Deref(spec.calendar), "calendar is not supported in capacity (a domain's capacity counts Envoy's fixed units)")
		return
	}
	l, ok := p.compile(p.Deref(n), &spec, "capacity")
	if !ok {
		return
	}
	l.Name = p.d.Name + ".capacity"
	l.Shadow = shadow
	p.d.Capacity = l
}

func (p *parser) descriptors(parent *Rule, n *yaml.Node) {
	n = p.Deref(n)
	if n == nil {
		return
	}
	if parent.depth >= maxDepth {
		p.Errorf(n, "descriptors nested deeper than %d levels", maxDepth)
		return
	}
	if yamlwalk.IsNull(n) {
		return
	}
	if n.Kind != yaml.SequenceNode {
		p.Errorf(n, "descriptors must be a list, got %s", yamlwalk.Describe(n))
		return
	}
	for _, item := range n.Content {
		p.descriptor(parent, item)
	}
}

// descriptorNodes are the keys of a descriptor read later than its flags:
// its limits, children and value, and whether it has a key.
type descriptorNodes struct {
	rl, rls, children, value, schedules, conc *yaml.Node
	keySeen                                   bool
}

// descriptorFields reads a descriptor's keys into r, and returns those
// read later.
func (p *parser) descriptorFields(r *Rule, pairs []yamlwalk.Pair) descriptorNodes {
	var f descriptorNodes
	for _, kv := range pairs {
		switch kv.K.Value {
		case "key":
			f.keySeen = true
			r.Key, _ = p.str(kv.V, "key")
		case "value":
			r.Value, _ = p.str(kv.V, "value")
			f.value = kv.V
		case "rate_limit":
			f.rl = kv.V
		case "rate_limits":
			f.rls = kv.V
		case "schedules":
			f.schedules = kv.V
		case "concurrency":
			f.conc = kv.V
		case "descriptors":
			f.children = kv.V
		case "shadow_mode":
			r.ShadowMode, _ = p.boolean(kv.V, "shadow_mode")
		case "detailed_metric":
			r.DetailedMetric, _ = p.boolean(kv.V, "detailed_metric")
		case "value_to_metric":
			r.ValueToMetric, _ = p.boolean(kv.V, "value_to_metric")
		case "share_threshold":
			r.ShareThreshold, _ = p.boolean(kv.V, "share_threshold")
		case "quota_mode":
			r.QuotaMode, _ = p.boolean(kv.V, "quota_mode")
		case "metadata":
			r.Metadata = p.metadata(kv.V)
		default:
			p.unknown(kv.K, "a descriptor", descriptorKeys, true)
		}
	}
	return f
}

func (p *parser) descriptor(parent *Rule, n *yaml.Node) {
	pairs, ok := p.Mapping(n, "a descriptor")
	if !ok {
		return
	}
	n = p.Deref(n)
	r := &Rule{File: p.file, Line: n.Line, Column: n.Column, depth: parent.depth + 1}
	if parent != &p.d.root {
		r.Parent = parent
	}
	f := p.descriptorFields(r, pairs)
	rl, rls, children, valueNode, keySeen := f.rl, f.rls, f.children, f.value, f.keySeen
	// A descriptor in error is still checked through, nested descriptors
	// included, so that every problem of the file is reported; it is not
	// added to the tree.
	valid := true
	if r.Key == "" {
		if keySeen {
			p.Errorf(n, "descriptor has empty key")
		} else {
			p.Errorf(n, "descriptor has empty key (every descriptor needs a key:)")
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
		p.Errorf(n, "duplicate descriptor composite key '%s' (first at line %d)", r.StatKey, first.Line)
		valid = false
	}
	r.glob = compileGlob(r.Key, r.Value)
	if r.ShareThreshold && r.glob == nil {
		at := valueNode
		if at == nil {
			at = n
		}
		p.Errorf(at, "share_threshold can only be used with wildcard values (containing '*'), but found key '%s'", r.composite)
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
		p.Errorf(rls, "rate_limits and rate_limit cannot both be set; put every limit in rate_limits")
	case rl != nil:
		p.rateLimit(r, rl)
	case rls != nil:
		p.rateLimits(r, rls)
	}
	if f.conc != nil {
		p.concurrency(r, f.conc)
	}
	if f.schedules != nil {
		p.schedules(r, f.schedules)
		p.checkSchedules(r, f.schedules)
	}
	p.checkDebits(r, f.conc)
	if children != nil {
		p.descriptors(r, children)
	}
}

func (p *parser) rateLimit(r *Rule, n *yaml.Node) {
	n = p.Deref(n)
	if n == nil {
		return
	}
	if yamlwalk.IsNull(n) {
		p.Warnf(n, "rate_limit is empty: the descriptor has no limit (as in Envoy)")
		return
	}
	pairs, ok := p.Mapping(n, "rate_limit")
	if !ok {
		return
	}
	var spec limitSpec
	var unlimited bool
	unlimitedOK := true
	for _, kv := range pairs {
		switch kv.K.Value {
		case "unlimited":
			unlimited, unlimitedOK = p.boolean(kv.V, "unlimited")
		case "name":
			p.name(r, kv.V)
		case "replaces":
			p.replacesList(r, kv.V)
		case "elastic_ceiling":
			spec.elastic = kv.V
		default:
			if !p.limitKey(&spec, kv) {
				p.unknown(kv.K, "rate_limit", rateLimitKeys, true)
			}
		}
	}
	r.limited = true
	if !unlimitedOK {
		return
	}
	if unlimited {
		r.Unlimited, r.set.unlimited = true, true
		if spec.unit != nil {
			if s, ok := p.str(spec.unit, "unit"); ok {
				if _, err := ParseUnit(s); err == nil {
					p.Errorf(spec.unit, "should not specify rate limit unit when unlimited")
				}
			}
		}
		if e := spec.extension(); e != nil {
			p.Errorf(e, "an unlimited rate_limit takes no other settings")
		}
		if spec.rpu != nil {
			p.Warnf(spec.rpu, "requests_per_unit is ignored when unlimited")
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
	n = p.Deref(n)
	if n == nil {
		return
	}
	if n.Kind != yaml.SequenceNode {
		p.Errorf(n, "rate_limits must be a list of limits, got %s", yamlwalk.Describe(n))
		return
	}
	if len(n.Content) == 0 {
		p.Errorf(n, "rate_limits is empty")
		return
	}
	r.limited = true
	var limits []*sluice.Limit
	var specs []*limitSpec
	okAll := true
	for _, item := range n.Content {
		pairs, ok := p.Mapping(item, "a rate_limits entry")
		if !ok {
			okAll = false
			continue
		}
		spec := &limitSpec{}
		for _, kv := range pairs {
			switch kv.K.Value {
			case "name":
				p.name(r, kv.V)
			case "replaces":
				p.replacesList(r, kv.V)
			case "elastic_ceiling":
				spec.elastic = kv.V
			case "unlimited":
				p.Errorf(kv.K, "unlimited is not allowed in rate_limits; use rate_limit: {unlimited: true}")
			default:
				if !p.limitKey(spec, kv) {
					p.unknown(kv.K, "a rate_limits entry", listItemKeys, false)
				}
			}
		}
		l, ok := p.compile(p.Deref(item), spec, "this limit")
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
		r.set.tags = append(r.set.tags, fmt.Sprintf("#%d/%s/%d/%d", i, l.Algorithm, int64(l.Period), int64(l.RefillInterval)))
		if specs[i].cal != nil {
			if r.set.cals == nil {
				r.set.cals = make([]*calLimit, len(limits))
			}
			r.set.cals[i] = specs[i].cal
		}
	}
	r.Limits, r.set.limits = limits, limits
}

func (p *parser) name(r *Rule, n *yaml.Node) {
	s, ok := p.str(n, "name")
	if !ok || s == "" {
		return
	}
	if r.Name != "" && r.Name != s {
		p.Errorf(n, "the limits of one descriptor share one name: %q and %q differ", r.Name, s)
		return
	}
	r.Name = s
	p.d.names[s] = true
	for _, rep := range r.Replaces {
		if rep == s {
			p.Errorf(n, "replaces should not contain name of same descriptor")
		}
	}
}

func (p *parser) replacesList(r *Rule, n *yaml.Node) {
	n = p.Deref(n)
	if n == nil || (yamlwalk.IsNull(n)) {
		return
	}
	if n.Kind != yaml.SequenceNode {
		p.Errorf(n, "replaces must be a list like [{name: other}], got %s", yamlwalk.Describe(n))
		return
	}
	for _, item := range n.Content {
		it := p.Deref(item)
		if it == nil {
			return
		}
		if it.Kind != yaml.MappingNode {
			p.Errorf(it, "replaces entries must be mappings like {name: other}, got %s", yamlwalk.Describe(it))
			continue
		}
		pairs, _ := p.Mapping(it, "a replaces entry")
		var name string
		var nameNode *yaml.Node
		for _, kv := range pairs {
			if kv.K.Value == "name" {
				name, _ = p.str(kv.V, "name")
				nameNode = p.Deref(kv.V)
				continue
			}
			p.unknown(kv.K, "a replaces entry", replacesKeys, true)
		}
		if name == "" {
			p.Errorf(it, "should not have an empty replaces entry")
			continue
		}
		if name == r.Name {
			p.Errorf(nameNode, "replaces should not contain name of same descriptor")
			continue
		}
		if !slices.Contains(r.Replaces, name) {
			r.Replaces = append(r.Replaces, name)
		}
		p.replaces = append(p.replaces, nameNode)
	}
}

// field encodes s length-prefixed, so that concatenated fields are never
// ambiguous whatever bytes s holds.
func field(s string) string {
	return strconv.Itoa(len(s)) + ":" + s
}

// metadata reads a descriptor's metadata: a mapping whose values may be
// anything JSON holds, as envoyproxy/ratelimit turns it into a protobuf
// Struct (keys as their text, whole and decimal numbers as float64).
func (p *parser) metadata(n *yaml.Node) map[string]any {
	n = p.Deref(n)
	if n == nil || yamlwalk.IsNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		p.Errorf(n, "metadata must be a mapping, got %s", yamlwalk.Describe(n))
		return nil
	}
	v, _ := p.value(n, 0).(map[string]any)
	return v
}

// value reads any YAML node as a JSON-like Go value (see metadata).
func (p *parser) value(n *yaml.Node, depth int) any {
	n = p.Deref(n)
	if n == nil {
		return nil
	}
	if depth > maxDepth {
		p.Errorf(n, "metadata nested deeper than %d levels", maxDepth)
		return nil
	}
	switch n.Kind {
	case yaml.MappingNode:
		pairs, _ := p.Mapping(n, "metadata")
		m := make(map[string]any, len(pairs))
		for _, kv := range pairs {
			m[kv.K.Value] = p.value(kv.V, depth+1)
		}
		return m
	case yaml.SequenceNode:
		l := make([]any, 0, len(n.Content))
		for _, item := range n.Content {
			l = append(l, p.value(item, depth+1))
		}
		return l
	}
	switch n.ShortTag() {
	case "!!null":
		return nil
	case "!!bool":
		b, _ := p.boolean(n, "a metadata value")
		return b
	case "!!int", "!!float":
		if f, err := strconv.ParseFloat(strings.ReplaceAll(n.Value, "_", ""), 64); err == nil {
			return f
		}
		if i, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64); err == nil {
			return float64(i)
		}
	}
	return n.Value
}
