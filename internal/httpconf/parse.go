package httpconf

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
	"golang.org/x/net/http/httpguts"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/ratelimitheaders"
	"github.com/sluicehq/sluice/internal/yamlwalk"
	"github.com/sluicehq/sluice/rules"
)

// The keys each mapping of the section takes.
var (
	sectionKeys  = []string{"client_ip", "headers", "shadow_mode", "routes"}
	clientIPKeys = []string{"trusted_proxies", "headers", "ipv6_prefix", "ipv4_prefix"}
	routeKeys    = []string{"pattern", "name", "descriptors", "shaping", "failures", "concurrency"}
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
	s, herr := Parse(path, data)
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
	c, err := rules.NewConfig(d)
	if err != nil {
		return nil, nil, err
	}
	return c, s, nil
}

// Parse reads the http section of the rules file data; name is the file's
// name in problems. A file without one gives Default(). An invalid section
// gives a *rules.Error listing every problem. Parse reads nothing but the
// section: a file whose rules are invalid, or that is not a mapping, has a
// valid section as long as the section is.
func Parse(name string, data []byte) (*Section, error) {
	doc, err := yamlwalk.Load(data)
	if err != nil {
		return nil, &rules.Error{Problems: []rules.Problem{rules.SyntaxProblem(name, err)}}
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
		return Default(), nil
	}
	p := &parser{Walker: yamlwalk.New(yamlwalk.DefaultBudget), file: name}
	p.Describe = kind
	s := p.section(section)
	if p.Failed() {
		return nil, &rules.Error{Problems: p.problems()}
	}
	return s, nil
}

// parser reads the section with the walker rules files are read with
// (positions, alias budget, strict keys); the section's scalars are
// sluice's own and read strictly (YAML 1.2), not as Envoy's yaml.v2.
type parser struct {
	*yamlwalk.Walker
	file string
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

func (p *parser) routes(s *Section, n *yaml.Node) {
	items, ok := p.List(n, "routes", MaxRoutes)
	if !ok {
		return
	}
	if len(items) == 0 {
		p.Errorf(p.node(n), "routes is empty (leave it out for one route \"/\" limited by the client address)")
		return
	}
	names := map[string]int{}
	for _, item := range items {
		r := Route{Line: p.node(item).Line}
		var nameNode *yaml.Node
		patternSeen := false
		p.fields(item, "a route", routeKeys, func(key string, k, v *yaml.Node) {
			switch key {
			case "pattern":
				patternSeen = true
				if pat, ok := p.str(v, "pattern"); ok && p.pattern(v, pat) {
					r.Pattern = pat
				}
			case "name":
				nameNode = p.node(v)
				r.Name, _ = p.str(v, "name")
			case "descriptors":
				r.Descriptors = p.descriptors(v)
			case "shaping":
				r.Shaping = p.shaping(v)
			case "failures":
				r.Failures = p.failures(v)
			case "concurrency":
				r.Concurrency = p.concurrency(v)
			}
		})
		if !patternSeen {
			p.Errorf(p.node(item), "a route needs a pattern")
		}
		if nameNode == nil {
			nameNode = p.node(item)
			r.Name = r.Pattern
		} else if r.Name != "" && !validName(r.Name) {
			p.Errorf(nameNode, "route name %q must be printable, at most %d bytes, and not start with _", r.Name, MaxNameLen)
		}
		if r.Name != "" {
			if first, dup := names[r.Name]; dup {
				p.Errorf(nameNode, "route name %q repeated (first at line %d); name the routes apart", r.Name, first)
			}
			names[r.Name] = nameNode.Line
		}
		s.Routes = append(s.Routes, r)
	}
}

// pattern reports a pattern that ServeMux takes but that can match no
// request as written: a method in lower case, or a space in the host or
// path.
func (p *parser) pattern(n *yaml.Node, pat string) bool {
	method, rest, found := strings.Cut(pat, " ")
	if !found {
		return true
	}
	rest = strings.TrimLeft(rest, " \t")
	switch {
	case !httpguts.ValidHeaderFieldName(method) || strings.ToUpper(method) != method:
		p.Errorf(p.node(n), "pattern %q: the method must be upper case, as requests send it (%q)", pat, strings.ToUpper(method))
		return false
	case strings.ContainsAny(rest, " \t"):
		p.Errorf(p.node(n), "pattern %q: a pattern is [METHOD ][HOST]/PATH, without spaces in the host or path", pat)
		return false
	}
	return true
}

// shaping reads a route's shaping: max_delay (a Go duration, required)
// and max_queue.
func (p *parser) shaping(n *yaml.Node) *httplimit.Shaping {
	sh := &httplimit.Shaping{}
	delay := false
	isMap := p.fields(n, "shaping", shapingKeys, func(key string, k, v *yaml.Node) {
		switch key {
		case "max_delay":
			delay = true
			sh.MaxDelay = p.duration(v, "max_delay", time.Millisecond, time.Hour)
		case "max_queue":
			sh.MaxQueue = p.integer(v, "max_queue", 1, 1<<20)
		}
	})
	if isMap && !delay {
		p.Errorf(p.node(n), "shaping needs max_delay (how long a request may wait, such as 500ms)")
	}
	return sh
}

// failures reads a route's failures: descriptors (as a route's) and
// statuses, both required.
func (p *parser) failures(n *yaml.Node) *httplimit.Failures {
	f := &httplimit.Failures{}
	var descs, statuses bool
	if !p.fields(n, "failures", failureKeys, func(key string, k, v *yaml.Node) {
		switch key {
		case "descriptors":
			descs = true
			f.Descriptors = p.descriptors(v)
		case "statuses":
			statuses = true
			items, ok := p.List(v, "statuses", 100)
			if !ok {
				return
			}
			if len(items) == 0 {
				p.Errorf(p.node(v), "statuses is empty: name the statuses that count as failures, such as [401, 403]")
			}
			for _, it := range items {
				f.Statuses = append(f.Statuses, p.integer(it, "a status", 100, 599))
			}
		}
	}) {
		return f
	}
	if !descs {
		p.Errorf(p.node(n), "failures needs descriptors: the descriptors whose limits count the failures")
	}
	if !statuses {
		p.Errorf(p.node(n), "failures needs statuses: the response statuses that count as failures, such as [401, 403]")
	}
	return f
}

// concurrency reads a route's concurrency: max (required) and descriptor,
// one descriptor's list of entries (default: the client address).
func (p *parser) concurrency(n *yaml.Node) *httplimit.Concurrency {
	c := &httplimit.Concurrency{}
	hasMax := false
	isMap := p.fields(n, "concurrency", concKeys, func(key string, k, v *yaml.Node) {
		switch key {
		case "max":
			hasMax = true
			c.Max = p.integer(v, "max", 1, 1<<30)
		case "descriptor":
			entries, ok := p.List(v, "descriptor (a list of entries)", httplimit.MaxEntries)
			if !ok {
				return
			}
			if len(entries) == 0 {
				p.Errorf(p.node(v), "descriptor is empty (leave it out for the client address)")
				return
			}
			for _, e := range entries {
				if en, ok := p.entry(e); ok {
					c.Descriptor = append(c.Descriptor, en)
				}
			}
		}
	})
	if isMap && !hasMax {
		p.Errorf(p.node(n), "concurrency needs max: the most requests in flight per key")
	}
	return c
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

func validName(s string) bool {
	if len(s) > MaxNameLen || strings.HasPrefix(s, "_") || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

func (p *parser) descriptors(n *yaml.Node) []httplimit.Descriptor {
	items, ok := p.List(n, "descriptors", httplimit.MaxDescriptors)
	if !ok {
		return nil
	}
	if len(items) == 0 {
		p.Errorf(p.node(n), "descriptors is empty (leave it out for the client address)")
		return nil
	}
	out := make([]httplimit.Descriptor, 0, len(items))
	for _, item := range items {
		entries, ok := p.List(item, "a descriptor (a list of entries)", httplimit.MaxEntries)
		if !ok {
			continue
		}
		if len(entries) == 0 {
			p.Errorf(p.node(item), "a descriptor needs at least one entry")
			continue
		}
		d := make(httplimit.Descriptor, 0, len(entries))
		for _, e := range entries {
			if en, ok := p.entry(e); ok {
				d = append(d, en)
			}
		}
		out = append(out, d)
	}
	return out
}

// entry reads one descriptor entry: a key and exactly one source.
func (p *parser) entry(n *yaml.Node) (httplimit.Entry, bool) {
	er := entryReader{p: p, ok: true}
	before := len(p.Errs)
	isMap := p.fields(n, "an entry", entryKeys, er.field)
	if !isMap || len(p.Errs) > before {
		return er.e, false
	}
	if er.src == nil && er.ok {
		if er.e.Key != "remote_address" {
			p.Errorf(p.node(n), "an entry needs a source: source (remote_address, method, path), header, api_key, country or value; only key remote_address implies its source")
			return er.e, false
		}
		er.e.Source = httplimit.RemoteAddress()
	}
	return er.e, er.ok
}

// entryReader reads the fields of one descriptor entry.
type entryReader struct {
	p   *parser
	e   httplimit.Entry
	src *yaml.Node // the source key, once one is read
	ok  bool
}

// field reads one field of the entry.
func (er *entryReader) field(key string, k, v *yaml.Node) {
	p := er.p
	switch key {
	case "key":
		s, kok := p.str(v, "key")
		if kok && len(s) > rules.MaxEntryLen {
			p.Errorf(p.node(v), "key longer than %d bytes", rules.MaxEntryLen)
			kok = false
		}
		er.ok = er.ok && kok
		er.e.Key = s
	case "source":
		er.source(k, v)
	case "header":
		if h, hok := er.header(v, "header"); hok {
			er.setSource(k, httplimit.Header(h))
		}
	case "api_key":
		if h, hok := er.header(v, "api_key"); hok {
			er.setSource(k, httplimit.APIKey(h))
		}
	case "country":
		if h, hok := er.header(v, "country"); hok {
			er.setSource(k, httplimit.Country(h))
		}
	case "value":
		s, vok := p.str(v, "value")
		if vok && (len(s) > rules.MaxEntryLen || !printable(s)) {
			p.Errorf(p.node(v), "value must be printable and at most %d bytes", rules.MaxEntryLen)
			vok = false
		}
		if vok {
			er.setSource(k, httplimit.Const(s))
		}
		er.ok = er.ok && vok
	}
}

// source reads the source field: remote_address, method or path.
func (er *entryReader) source(k, v *yaml.Node) {
	s, sok := er.p.str(v, "source")
	switch s {
	case "remote_address":
		er.setSource(k, httplimit.RemoteAddress())
	case "method":
		er.setSource(k, httplimit.Method())
	case "path":
		er.setSource(k, httplimit.Path())
	default:
		if sok {
			er.p.Errorf(er.p.node(v), "unknown source %q (want remote_address, method or path; or header, api_key, country or value instead of source)", s)
		}
		er.ok = false
	}
}

// setSource sets the entry's source from key k; a second one is a problem.
func (er *entryReader) setSource(k *yaml.Node, s httplimit.Source) {
	if er.src != nil {
		er.p.Errorf(k, "%q is a second source in one entry (give each entry one of source, header, api_key, country, value)", k.Value)
		er.ok = false
		return
	}
	er.src, er.e.Source = k, s
}

// header reads a header name given as what.
func (er *entryReader) header(v *yaml.Node, what string) (string, bool) {
	h, hok := er.p.str(v, what)
	if hok && !httpguts.ValidHeaderFieldName(h) {
		er.p.Errorf(er.p.node(v), "%q is not a header name", h)
		hok = false
	}
	er.ok = er.ok && hok
	return h, hok
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f {
			return false
		}
	}
	return utf8.ValidString(s)
}

// conflict finds the other pattern in a ServeMux conflict panic.
var conflict = regexp.MustCompile(`conflicts with pattern ("(?:[^"\\]|\\.)*")`)

// check registers the routes on a ServeMux, as a front door will, and
// builds their middleware, reporting at the route's line what either
// refuses: an invalid pattern, two patterns that conflict (both match some
// request and neither is more specific), a configuration httplimit
// rejects. Nothing that passes can fail when a front door is built.
func (p *parser) check(s *Section) {
	mux := http.NewServeMux()
	lines := map[string]int{}
	for _, r := range s.Routes {
		if msg := register(mux, r.Pattern); msg != "" {
			if m := conflict.FindStringSubmatch(msg); m != nil {
				other, _ := strconv.Unquote(m[1])
				p.Errs = append(p.Errs, yamlwalk.Note{Line: r.Line, Msg: fmt.Sprintf(
					"pattern %q conflicts with the pattern %q of the route at line %d: both match some requests and neither is more specific",
					r.Pattern, other, lines[other])})
			} else {
				p.Errs = append(p.Errs, yamlwalk.Note{Line: r.Line, Msg: fmt.Sprintf("pattern %q: %s", r.Pattern, msg)})
			}
			continue
		}
		lines[r.Pattern] = r.Line
		_, err := httplimit.New(httplimit.Config{
			Decider:     new(decide.Decider), // never asked: the middleware is only checked
			Domain:      "check",
			ClientIP:    s.ClientIP,
			Descriptors: r.Descriptors,
			Headers:     s.Headers,
			Shaping:     r.Shaping,
			Failures:    r.Failures,
			Concurrency: r.Concurrency,
		})
		if err != nil {
			p.Errs = append(p.Errs, yamlwalk.Note{Line: r.Line, Msg: err.Error()})
		}
	}
}

// register adds pattern to mux and returns why ServeMux refused it, which
// it says only by panicking.
func register(mux *http.ServeMux, pattern string) (msg string) {
	defer func() {
		if e := recover(); e != nil {
			msg = fmt.Sprint(e)
		}
	}()
	mux.Handle(pattern, http.NotFoundHandler())
	return ""
}
