package httpconf

import (
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/edges/geoip"
)

// GeoIP is the geoip block: the MaxMind-format databases that the
// entries {source: country} and {source: asn} look the client address up
// in. Parse opens them (a file that is missing or not such a database is
// a problem at its line); each is then reloaded when its file changes
// (see package geoip).
//
//	geoip:
//	  country: /var/lib/GeoIP/GeoLite2-Country.mmdb   # or a City database
//	  asn: /var/lib/GeoIP/GeoLite2-ASN.mmdb
type GeoIP struct {
	// Country is the database of country, nil when not named.
	Country *geoip.DB

	// ASN is the database of asn, nil when not named. The same *DB as
	// Country when both name one file.
	ASN *geoip.DB
}

// DBs are the distinct databases of g.
func (g GeoIP) DBs() []*geoip.DB {
	var out []*geoip.DB
	if g.Country != nil {
		out = append(out, g.Country)
	}
	if g.ASN != nil && g.ASN != g.Country {
		out = append(out, g.ASN)
	}
	return out
}

var geoipKeys = []string{"country", "asn"}

// geoip reads the geoip block and opens its databases; a path relative to
// the rules file is taken from the file's directory.
func (p *parser) geoip(g *GeoIP, n *yaml.Node) {
	paths := map[geoip.Field]string{}
	lines := map[geoip.Field]*yaml.Node{}
	p.fields(n, "geoip", geoipKeys, func(key string, k, v *yaml.Node) {
		f := geoip.Country
		if key == "asn" {
			f = geoip.ASN
		}
		p.geoNamed |= f
		if s, ok := p.str(v, "geoip "+key+" (a database file)"); ok {
			if !filepath.IsAbs(s) {
				s = filepath.Join(filepath.Dir(p.file), s)
			}
			paths[f], lines[f] = s, p.node(v)
		}
	})
	if len(p.Errs) > 0 {
		return
	}
	open := func(f geoip.Field) *geoip.DB {
		db, err := geoip.Open(paths[f], f, geoip.Options{})
		if err != nil {
			p.Errorf(lines[f], "geoip %s: %s", f, strings.TrimPrefix(err.Error(), "geoip: "))
		}
		return db
	}
	cp, ap := paths[geoip.Country], paths[geoip.ASN]
	switch {
	case cp != "" && cp == ap:
		db, err := geoip.Open(cp, geoip.Country|geoip.ASN, geoip.Options{})
		if err != nil {
			p.Errorf(lines[geoip.Country], "geoip country and asn: %s", strings.TrimPrefix(err.Error(), "geoip: "))
		}
		g.Country, g.ASN = db, db
	default:
		if cp != "" {
			g.Country = open(geoip.Country)
		}
		if ap != "" {
			g.ASN = open(geoip.ASN)
		}
	}
}
