package httpconf_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/edges/httpconf"
	"github.com/sluicehq/sluice/internal/testsupport/geoiptest"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

// geoDir writes a country and an ASN database into a new directory.
func geoDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := geoiptest.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

const geoSection = `domain: api
http:
  client_ip: {trusted_proxies: [127.0.0.1]}
  geoip:
    country: GeoLite2-Country.mmdb
    asn: GeoLite2-ASN.mmdb
  routes:
    - pattern: /
      descriptors:
        - [{source: country}]
        - [{key: network, source: asn}, {source: method}]
descriptors:
  - {key: country, value: GB, rate_limit: {unit: minute, requests_per_unit: 1}}
`

// The databases are opened relative to the rules file; the entries'
// keys default to the field's name, and their values are the client's.
func TestGeoIPSources(t *testing.T) {
	dir := geoDir(t)
	path := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(path, []byte(geoSection), 0o644); err != nil {
		t.Fatal(err)
	}
	_, s, err := httpconf.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if s.GeoIP.Country == nil || s.GeoIP.ASN == nil || len(s.GeoIP.DBs()) != 2 {
		t.Fatalf("GeoIP = %+v", s.GeoIP)
	}
	if got := s.GeoIP.Country.Path(); got != filepath.Join(dir, "GeoLite2-Country.mmdb") {
		t.Errorf("country path %q", got)
	}
	ds := s.Routes[0].Descriptors
	if len(ds) != 2 || ds[0][0].Key != "country" || ds[1][0].Key != "network" || ds[1][1].Key != "" {
		t.Fatalf("descriptors %+v", ds)
	}
	// The sources answer through the middleware: one GB request a
	// minute from a client behind the trusted 127.0.0.1.
	lim := sluice.NewLimiter(memstore.New(memstore.Config{}))
	dec, err := decide.New(decide.Config{Limiter: lim, Rules: rulestest.Config(t, geoSection)})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httplimit.New(httplimit.Config{Decider: dec, Domain: "api", ClientIP: s.ClientIP, Descriptors: ds})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	var got []int
	for _, xff := range []string{"81.2.69.1", "81.2.69.2", "89.160.20.1"} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "127.0.0.1:5000"
		r.Header.Set("X-Forwarded-For", xff)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		got = append(got, w.Code)
	}
	if want := []int{200, 429, 200}; !slices.Equal(got, want) {
		t.Errorf("statuses %v, want %v", got, want)
	}
}

// One file named for both is opened once.
func TestGeoIPOneFileForBoth(t *testing.T) {
	dir := t.TempDir()
	var nets []geoiptest.Network
	for i, n := range geoiptest.Countries {
		n.ASN = geoiptest.ASNs[i].ASN
		nets = append(nets, n)
	}
	if err := geoiptest.Write(filepath.Join(dir, "all.mmdb"), "GeoIP2-Enterprise", nets); err != nil {
		t.Fatal(err)
	}
	s, err := httpconf.Parse(filepath.Join(dir, "rules.yaml"), []byte("http:\n  geoip: {country: all.mmdb, asn: all.mmdb}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.GeoIP.Country == nil || s.GeoIP.Country != s.GeoIP.ASN || len(s.GeoIP.DBs()) != 1 {
		t.Errorf("GeoIP = %+v", s.GeoIP)
	}
}

// Every problem of the geoip block is reported at its line, as sluice
// check shows it, and an entry whose database failed adds none.
func TestGeoIPErrors(t *testing.T) {
	dir := geoDir(t)
	if err := os.WriteFile(filepath.Join(dir, "junk.mmdb"), []byte("junk"), 0o644); err != nil {
		t.Fatal(err)
	}
	route := "  routes:\n    - pattern: /\n      descriptors: [[{source: country}], [{source: asn}]]\n"
	for _, tc := range []struct {
		name, src string
		want      []string
	}{
		{"missing", "http:\n  geoip:\n    country: nowhere.mmdb\n    asn: GeoLite2-ASN.mmdb\n" + route,
			[]string{`rules.yaml:4:14: geoip country: stat ` + filepath.Join(dir, "nowhere.mmdb") + `: no such file or directory`}},
		{"junk", "http:\n  geoip:\n    country: GeoLite2-Country.mmdb\n    asn: junk.mmdb\n" + route,
			[]string{`rules.yaml:5:10: geoip asn: ` + filepath.Join(dir, "junk.mmdb") + ` is not a MaxMind database`}},
		{"wrong kind", "http:\n  geoip:\n    country: GeoLite2-ASN.mmdb\n" + route,
			[]string{`rules.yaml:4:14: geoip country: ` + filepath.Join(dir, "GeoLite2-ASN.mmdb") + ` (GeoLite2-ASN) holds no country.iso_code`,
				`rules.yaml:7:52: source asn needs a database`}},
		{"no geoip", "http:\n" + route, []string{
			`rules.yaml:5:31: source country needs a database: name it in the http section's geoip block`,
			`rules.yaml:5:52: source asn needs a database`}},
		{"unknown key", "http:\n  geoip: {city: c.mmdb}\n", []string{`3:11: unknown key "city" in geoip (want one of country, asn)`}},
		{"empty path", "http:\n  geoip: {country: \"\"}\n", []string{`3:20: geoip country (a database file) must be a non-empty string`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, "rules.yaml")
			if err := os.WriteFile(path, []byte("domain: api\n"+tc.src), 0o644); err != nil {
				t.Fatal(err)
			}
			_, _, err := httpconf.LoadFile(path)
			var re *rules.Error
			if !errors.As(err, &re) {
				t.Fatalf("error %v, want a *rules.Error", err)
			}
			var msgs []string
			for _, p := range re.Problems {
				msgs = append(msgs, p.String())
			}
			if len(msgs) != len(tc.want) {
				t.Fatalf("%d problems, want %d:\n%s", len(msgs), len(tc.want), strings.Join(msgs, "\n"))
			}
			for i, w := range tc.want {
				if !strings.Contains(msgs[i], w) {
					t.Errorf("problem %d is\n\t%s\nwant it to contain\n\t%s", i, msgs[i], w)
				}
			}
		})
	}
}
