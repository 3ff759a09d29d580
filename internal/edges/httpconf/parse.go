package httpconf

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/base/yamlwalk"
	"github.com/sluicehq/sluice/internal/decision/ratelimitheaders"
	"github.com/sluicehq/sluice/internal/edges/geoip"
	"github.com/sluicehq/sluice/rules"
)

// The keys each mapping of the section takes.
var (
	sectionKeys  = []string{"client_ip", "headers", "shadow_mode", "geoip", "routes"}
	clientIPKeys = []string{"trusted_proxies", "headers", "ipv6_prefix", "ipv4_prefix"}
	routeKeys    = []string{"pattern", "name", "descriptors", "shaping", "failures", "concurrency", "tokens"}
	shapingKeys  = []string{"max_delay", "max_queue"}
	failureKeys  = []string{"descriptors", "statuses"}
	concKeys     = []string{"max", "descriptor"}
	entryKeys    = []string{"key", "source", "header", "api_key", "country", "value"}
)

// maxHeaderItems bounds the items of headers: the three families, all
// and none.
const maxHeaderItems = 5

// LoadFile reads the rules file at path and returns both its rules (as
// rules.LoadFile does) and its http section, from one read of the file, so
// that the two always agree. An invalid file gives a *rules.Error listing
// the problems of both.
func LoadFile(path string) (*rules.Config, *Section, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	d, rerr := rules.Parse(path, data)
	s, p, herr := parse(path, data)
	var probs, warns []rules.Problem
	seen := map[rules.Problem]bool{}
	for _, err := range []error{rerr, herr} {
		var re *rules.Error
		if errors.As(err, &re) {
			for _, p := range re.Problems {
				if !seen[p] { // a YAML syntax error is reported by both
					seen[p] = true
					probs = append(probs, p)
				}
			}
			warns = append(warns, re.Warnings...)
		}
	}
	if len(probs) > 0 {
		if d != nil {
			warns = append(warns, d.Warnings...)
		}
		return nil, nil, &rules.Error{Problems: probs, Warnings: warns}
	}
	if probs := p.checkFailureRules(s, d); len(probs) > 0 {
		return nil, nil, &rules.Error{Problems: probs, Warnings: append(warns, d.Warnings...)}
	}
	c, err := rules.NewConfig(d)
	if err != nil {
		return nil, nil, err
	}
	return c, s, nil
}

// Parse reads the http section of the rules file data; name is the file's
// name in problems. A file without one gives Default(). An invalid section
// gives a *rules.Error listing every problem. Parse reads nothing but the
// section, and the databases its geoip block names (a relative path is
// taken from the directory of name): a file whose rules are invalid, or
// that is not a mapping, has a valid section as long as the section is.
func Parse(name string, data []byte) (*Section, error) {
	s, _, err := parse(name, data)
	return s, err
}

// parse is Parse, with the parser that read the section (nil when there
// is none): what it learnt of the descriptors, for LoadFile's checks
// against the rules.
func parse(name string, data []byte) (*Section, *parser, error) {
	doc, err := yamlwalk.Load(data)
	if err != nil {
		line, msg := yamlwalk.SyntaxMessage(err)
		return nil, nil, &rules.Error{Problems: []rules.Problem{{File: name, Line: line, Msg: msg}}}
	}
	root := doc.Root
	var section *yaml.Node
	if root != nil && root.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(root.Content); i += 2 {
			if k := root.Content[i]; k.Kind == yaml.ScalarNode && k.Value == "http" {
				section = root.Content[i+1]
			}
		}
	}
	if section == nil {
		return Default(), &parser{file: name}, nil
	}
	p := &parser{Walker: yamlwalk.New(yamlwalk.DefaultBudget), file: name, failureShapes: map[*httplimit.Failures][]shape{}}
	p.Describe = kind
	s := p.section(section)
	if p.Failed() {
		return nil, nil, &rules.Error{Problems: p.problems()}
	}
	return s, p, nil
}

// parser reads the section with the walker rules files are read with
// (positions, alias budget, strict keys); the section's scalars are
// sluice's own and read strictly (YAML 1.2), not as Envoy's yaml.v2.
type parser struct {
	*yamlwalk.Walker
	file     string
	geo      GeoIP       // the databases of the geoip block, once opened
	geoNamed geoip.Field // the fields the geoip block names, opened or not

	failureShapes map[*httplimit.Failures][]shape // of each route's failures descriptors
}

// problems gives the walk's problems as the file's.
func (p *parser) problems() []rules.Problem {
	out := make([]rules.Problem, len(p.Errs))
	for i, n := range p.Errs {
		out[i] = rules.Problem{File: p.file, Line: n.Line, Column: n.Column, Msg: n.Msg}
	}
	return out
}

// spent stands in for a node once the walk's budget is spent (the walk
// has recorded why, and records nothing more).
var spent = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null"}

// node follows n's aliases, charging the walk's budget.
func (p *parser) node(n *yaml.Node) *yaml.Node {
	if d := p.Deref(n); d != nil {
		return d
	}
	return spent
}

func kind(n *yaml.Node) string {
	if n.Kind == yaml.ScalarNode && !yamlwalk.IsNull(n) {
		return strconv.Quote(n.Value)
	}
	return yamlwalk.Describe(n)
}

// fields calls f with each key and value of the mapping n, described as
// what, reporting keys that are repeated, not strings, or not in allowed.
func (p *parser) fields(n *yaml.Node, what string, allowed []string, f func(key string, k, v *yaml.Node)) bool {
	return p.Fields(n, what, allowed, func(kv yamlwalk.Pair) { f(kv.K.Value, kv.K, kv.V) })
}

// str returns a non-empty string scalar.
func (p *parser) str(n *yaml.Node, what string) (string, bool) {
	n = p.node(n)
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" || n.Value == "" {
		p.Errorf(n, "%s must be a non-empty string, got %s", what, kind(n))
		return "", false
	}
	return n.Value, true
}

func (p *parser) boolean(n *yaml.Node, what string) bool {
	n = p.node(n)
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!bool" {
		v, err := strconv.ParseBool(n.Value)
		if err == nil {
			return v
		}
	}
	p.Errorf(n, "%s must be true or false, got %s", what, kind(n))
	return false
}

func (p *parser) integer(n *yaml.Node, what string, lo, hi int) int {
	n = p.node(n)
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!int" {
		if v, err := strconv.Atoi(n.Value); err == nil && v >= lo && v <= hi {
			return v
		}
	}
	p.Errorf(n, "%s must be a whole number from %d to %d, got %s", what, lo, hi, kind(n))
	return 0
}

// duration reads a Go duration string ("500ms", "2s") from lo to hi.
func (p *parser) duration(n *yaml.Node, what string, lo, hi time.Duration) time.Duration {
	n = p.node(n)
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str" {
		if d, err := time.ParseDuration(n.Value); err == nil && d >= lo && d <= hi {
			return d
		}
	}
	p.Errorf(n, "%s must be a duration from %v to %v (such as 500ms or 2s), got %s", what, lo, hi, kind(n))
	return 0
}

func (p *parser) section(n *yaml.Node) *Section {
	s := &Section{}
	var routes *yaml.Node
	p.fields(n, "the http section", sectionKeys, func(key string, k, v *yaml.Node) {
		switch key {
		case "client_ip":
			p.clientIP(&s.ClientIP, v)
		case "headers":
			s.Headers = p.headers(v)
		case "shadow_mode":
			s.ShadowMode = p.boolean(v, "shadow_mode")
		case "geoip":
			p.geoip(&p.geo, v)
			s.GeoIP = p.geo
		case "routes":
			routes = v
		}
	})
	if routes == nil || p.node(routes).ShortTag() == "!!null" {
		s.Routes = Default().Routes
	} else {
		p.routes(s, routes)
	}
	if len(p.Errs) == 0 {
		p.check(s)
	}
	return s
}

func (p *parser) clientIP(c *httplimit.ClientIP, n *yaml.Node) {
	p.fields(n, "client_ip", clientIPKeys, func(key string, k, v *yaml.Node) {
		switch key {
		case "trusted_proxies":
			items, _ := p.List(v, "trusted_proxies", 1<<16)
			for _, item := range items {
				s, ok := p.str(item, "a trusted proxy")
				if !ok {
					continue
				}
				pfx, err := httplimit.ParseTrustedProxies(s)
				if err != nil || strings.Contains(s, ",") {
					p.Errorf(p.node(item), "%q is not an IP address or a CIDR prefix", s)
					continue
				}
				c.TrustedProxies = append(c.TrustedProxies, pfx...)
			}
		case "headers":
			items, _ := p.List(v, "client_ip headers", 3)
			for _, item := range items {
				h, ok := p.str(item, "a forwarding header")
				if !ok {
					continue
				}
				if (&httplimit.ClientIP{Headers: []string{h}}).Validate() != nil {
					p.Errorf(p.node(item), "forwarding header %q is not X-Forwarded-For, Forwarded or X-Real-IP", h)
					continue
				}
				c.Headers = append(c.Headers, h)
			}
			if len(items) == 0 && len(p.Errs) == 0 {
				p.Errorf(p.node(v), "client_ip headers is empty (leave it out for X-Forwarded-For)")
			}
		case "ipv6_prefix":
			c.IPv6Prefix = p.integer(v, "ipv6_prefix", 1, 128)
		case "ipv4_prefix":
			c.IPv4Prefix = p.integer(v, "ipv4_prefix", 1, 32)
		}
	})
}

func (p *parser) headers(n *yaml.Node) ratelimitheaders.HeaderMode {
	items, ok := p.List(n, "headers", maxHeaderItems)
	if !ok {
		return 0
	}
	if len(items) == 0 {
		p.Errorf(p.node(n), "headers is empty (use [none] to send no rate limit header)")
		return 0
	}
	var mode ratelimitheaders.HeaderMode
	for _, item := range items {
		s, ok := p.str(item, "a header family")
		if !ok {
			continue
		}
		m, known := ratelimitheaders.ParseHeaderFamily(s)
		switch {
		case !known:
			p.Errorf(p.node(item), "unknown header family %q (want ietf, x-ratelimit, retry-after, all, or none alone)", s)
		case m == ratelimitheaders.HeadersNone && len(items) > 1:
			p.Errorf(p.node(item), "none must be alone in headers")
		default:
			mode |= m
		}
	}
	return mode
}
