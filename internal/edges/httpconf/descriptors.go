package httpconf

import (
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
	"golang.org/x/net/http/httpguts"

	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/edges/geoip"
	"github.com/sluicehq/sluice/rules"
)

// descriptors reads a list of descriptors, each a list of entries, and
// what the rules will match of each (shapes, in the same order).
func (p *parser) descriptors(n *yaml.Node) ([]httplimit.Descriptor, []shape) {
	items, ok := p.List(n, "descriptors", httplimit.MaxDescriptors)
	if !ok {
		return nil, nil
	}
	if len(items) == 0 {
		p.Errorf(p.node(n), "descriptors is empty (leave it out for the client address)")
		return nil, nil
	}
	out := make([]httplimit.Descriptor, 0, len(items))
	shapes := make([]shape, 0, len(items))
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
		sh := shape{line: p.node(item).Line, column: p.node(item).Column}
		for _, e := range entries {
			if en, ef, ok := p.entry(e); ok {
				d = append(d, en)
				sh.entries = append(sh.entries, ef)
			}
		}
		out = append(out, d)
		shapes = append(shapes, sh)
	}
	return out, shapes
}

// entry reads one descriptor entry: a key and exactly one source; and
// what the rules will match of it: its key (the source's default when it
// names none, as httplimit documents each), and its value when fixed.
func (p *parser) entry(n *yaml.Node) (httplimit.Entry, entryShape, bool) {
	er := entryReader{p: p, ok: true}
	before := len(p.Errs)
	isMap := p.fields(n, "an entry", entryKeys, er.field)
	if !isMap || len(p.Errs) > before {
		return er.e, er.shape, false
	}
	if er.e.Key == "" {
		er.e.Key = er.geoKey
	}
	if er.src == nil && er.ok {
		if er.e.Key != "remote_address" {
			p.Errorf(p.node(n), "an entry needs a source: source (remote_address, method, path, country, asn), header, api_key, country or value; only key remote_address implies its source")
			return er.e, er.shape, false
		}
		er.e.Source = httplimit.RemoteAddress()
	}
	if er.e.Key != "" {
		er.shape.key = er.e.Key
	}
	return er.e, er.shape, er.ok
}

// entryReader reads the fields of one descriptor entry.
type entryReader struct {
	p   *parser
	e   httplimit.Entry
	src *yaml.Node // the source key, once one is read
	ok  bool

	shape entryShape // its key is the source's default key until a key is read

	geoKey string // the default key of a geoip source
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
			er.shape.key = h
		}
	case "api_key":
		if h, hok := er.header(v, "api_key"); hok {
			er.setSource(k, httplimit.APIKey(h))
			er.shape.key = "api_key"
		}
	case "country":
		if h, hok := er.header(v, "country"); hok {
			er.setSource(k, httplimit.Country(h))
			er.shape.key = "country"
		}
	case "value":
		s, vok := p.str(v, "value")
		if vok && (len(s) > rules.MaxEntryLen || !printable(s)) {
			p.Errorf(p.node(v), "value must be printable and at most %d bytes", rules.MaxEntryLen)
			vok = false
		}
		if vok {
			er.setSource(k, httplimit.Const(s))
			er.shape = entryShape{key: "generic_key", value: s, fixed: true}
		}
		er.ok = er.ok && vok
	}
}

// source reads the source field: remote_address, method, path, or a
// database of the geoip block (country, asn).
func (er *entryReader) source(k, v *yaml.Node) {
	s, sok := er.p.str(v, "source")
	er.shape.key = s
	switch s {
	case "remote_address":
		er.setSource(k, httplimit.RemoteAddress())
	case "method":
		er.setSource(k, httplimit.Method())
	case "path":
		er.setSource(k, httplimit.Path())
	case "country":
		er.located(k, v, geoip.Country, er.p.geo.Country)
	case "asn":
		er.located(k, v, geoip.ASN, er.p.geo.ASN)
	default:
		if sok {
			er.p.Errorf(er.p.node(v), "unknown source %q (want remote_address, method, path, country or asn; or header, api_key, country or value instead of source)", s)
		}
		er.ok = false
	}
}

// located sets the source of field f, read from db, the database the
// geoip block names for it; the entry's key defaults to the field's name.
func (er *entryReader) located(k, v *yaml.Node, f geoip.Field, db *geoip.DB) {
	p := er.p
	if db == nil {
		if p.geoNamed&f == 0 { // else its problem is reported already
			p.Errorf(p.node(v), "source %s needs a database: name it in the http section's geoip block (geoip: {%s: path/to/file.mmdb})", f, f)
		}
		er.ok = false
		return
	}
	er.setSource(k, httplimit.Located(db.Locator(f)))
	er.geoKey = f.String()
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

// printable reports whether s is valid UTF-8 without ASCII control
// characters.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f {
			return false
		}
	}
	return utf8.ValidString(s)
}
