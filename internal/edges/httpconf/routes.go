package httpconf

import (
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
	"golang.org/x/net/http/httpguts"

	"github.com/sluicehq/sluice/httplimit"
)

// routes reads the routes into s, each with its pattern, name, descriptors,
// shaping, failures and concurrency, and reports a route without a
// pattern, and a name that is invalid or repeated.
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
				if pat, ok := p.str(v, "pattern"); ok {
					r.Pattern = p.pattern(v, pat)
				}
			case "name":
				nameNode = p.node(v)
				r.Name, _ = p.str(v, "name")
			case "descriptors":
				r.Descriptors, _ = p.descriptors(v)
			case "shaping":
				r.Shaping = p.shaping(v)
			case "failures":
				r.Failures = p.failures(v)
			case "concurrency":
				r.Concurrency = p.concurrency(v)
			case "tokens":
				r.Tokens = p.tokens(v)
			}
		})
		if r.Tokens != nil && (r.Shaping != nil || r.Failures != nil) {
			p.Errorf(p.node(item), "a route with tokens cannot have shaping or failures")
		}
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

// pattern returns pat with its host as requests are matched (Host). It
// reports, and returns "" for, a pattern that ServeMux takes but that can
// match no request as written, or that a request could miss by spelling
// its host otherwise: a method in lower case, a space in the host or
// path, a host Host refuses, a port (a request's host is matched without
// its port), an IPv6 address (ServeMux matches "[::1]" and "[::1]:80"
// apart). The method and host are split from the path as ServeMux splits
// them.
func (p *parser) pattern(n *yaml.Node, pat string) string {
	rest := pat
	if i := strings.IndexAny(pat, " \t"); i >= 0 {
		method := pat[:i]
		rest = strings.TrimLeft(pat[i+1:], " \t")
		switch {
		case !httpguts.ValidHeaderFieldName(method) || strings.ToUpper(method) != method:
			p.Errorf(p.node(n), "pattern %q: the method must be upper case, as requests send it (%q)", pat, strings.ToUpper(method))
			return ""
		case strings.ContainsAny(rest, " \t"):
			p.Errorf(p.node(n), "pattern %q: a pattern is [METHOD ][HOST]/PATH, without spaces in the host or path", pat)
			return ""
		}
	}
	slash := strings.IndexByte(rest, '/')
	if slash <= 0 { // no host, or no path: ServeMux judges it
		return pat
	}
	host, err := Host(rest[:slash])
	switch {
	case err != nil:
		p.Errorf(p.node(n), "pattern %q: the host: %v", pat, err)
	case strings.HasPrefix(host, "["):
		p.Errorf(p.node(n), "pattern %q: an IPv6 address cannot be a pattern's host (ServeMux matches [::1] and [::1]:PORT apart)", pat)
	case strings.IndexByte(host, ':') >= 0:
		p.Errorf(p.node(n), "pattern %q: a pattern's host has no port (a request's host is matched without its port)", pat)
	default:
		return pat[:len(pat)-len(rest)] + host + rest[slash:]
	}
	return ""
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
			var shapes []shape
			f.Descriptors, shapes = p.descriptors(v)
			p.failureShapes[f] = shapes
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
			c.Descriptor = p.entries(v, "descriptor (a list of entries)", "descriptor is empty (leave it out for the client address)")
		}
	})
	if isMap && !hasMax {
		p.Errorf(p.node(n), "concurrency needs max: the most requests in flight per key")
	}
	return c
}

// validName reports whether s may name a route: printable, at most
// MaxNameLen bytes, and not starting with "_".
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
