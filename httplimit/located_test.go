package httplimit_test

import (
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/edges/geoip"
	"github.com/sluicehq/sluice/internal/testsupport/geoiptest"
)

// geoRules limit GB to 2 requests a minute and SE to 3; the autonomous
// system 29518 to 4.
const geoRules = `
domain: api
descriptors:
  - key: country
    value: GB
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: country
    value: SE
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: asn
    value: "29518"
    rate_limit: {unit: minute, requests_per_unit: 4}
`

// geoDBs opens a country and an ASN database built for the test.
func geoDBs(t *testing.T) (country, asn *geoip.DB) {
	t.Helper()
	dir := t.TempDir()
	open := func(name, dbType string, nets []geoiptest.Network, f geoip.Field) *geoip.DB {
		path := filepath.Join(dir, name)
		if err := geoiptest.Write(path, dbType, nets); err != nil {
			t.Fatal(err)
		}
		db, err := geoip.Open(path, f, geoip.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return db
	}
	return open("country.mmdb", "GeoLite2-Country", geoiptest.Countries, geoip.Country),
		open("asn.mmdb", "GeoLite2-ASN", geoiptest.ASNs, geoip.ASN)
}

// The country comes from the client's address as the trusted proxies
// resolve it: a trusted peer's X-Forwarded-For chooses it, an untrusted
// peer's changes nothing, and a loopback client has none (not limited).
func TestLocatedCountryThroughTrustedProxy(t *testing.T) {
	country, _ := geoDBs(t)
	srv := limited(t, httplimit.Config{
		Decider:     decider(t, geoRules),
		Domain:      "api",
		ClientIP:    httplimit.ClientIP{TrustedProxies: mustProxies(t, "127.0.0.3")},
		Descriptors: []httplimit.Descriptor{{{Key: "country", Source: httplimit.Located(country.Locator(geoip.Country))}}},
	})
	trusted := clientFrom(t, "127.0.0.3")
	untrusted := clientFrom(t, "127.0.0.2")
	xff := func(v string) http.Header { return http.Header{"X-Forwarded-For": {v}} }

	var got []string
	// An untrusted peer poses as a Swedish client: it is its own
	// (loopback) address, in no country, never limited.
	for range 4 {
		got = append(got, do(t, untrusted, "GET", srv.URL, xff("89.160.20.112")).String())
	}
	// A British client through the trusted proxy, the left entry forged
	// by the client: the right-most untrusted entry decides.
	for range 3 {
		got = append(got, do(t, trusted, "GET", srv.URL, xff("89.160.20.112, 81.2.69.142")).String())
	}
	// A Swedish client over IPv6 through the trusted proxy.
	for range 4 {
		got = append(got, do(t, trusted, "GET", srv.URL, xff("2a01:4f8:c0c:1234::1")).String())
	}
	// Private and unknown addresses: no country.
	got = append(got, do(t, trusted, "GET", srv.URL, xff("10.0.0.1")).String())
	got = append(got, do(t, trusted, "GET", srv.URL, xff("8.8.8.8")).String())
	want := "200 ,200 ,200 ,200 ," + "200 1,200 0,429 0," + "200 2,200 1,200 0,429 0," + "200 ,200 "
	if strings.Join(got, ",") != want {
		t.Errorf("got  %s\nwant %s", strings.Join(got, ","), want)
	}
}

// The address located is the client's own, not the group IPv6Prefix
// makes of it: a /16 group would fall outside the database's /32.
func TestLocatedUngroupedAddress(t *testing.T) {
	country, asn := geoDBs(t)
	srv := limited(t, httplimit.Config{
		Decider:  decider(t, geoRules),
		Domain:   "api",
		ClientIP: httplimit.ClientIP{TrustedProxies: mustProxies(t, "127.0.0.0/8"), IPv6Prefix: 16, IPv4Prefix: 8},
		Descriptors: []httplimit.Descriptor{
			{{Key: "country", Source: httplimit.Located(country.Locator(geoip.Country))}},
			{{Key: "asn", Source: httplimit.Located(asn.Locator(geoip.ASN))}},
		},
	})
	var got []string
	for range 4 {
		// SE allows 3, AS29518 4: all-or-nothing, the fourth is denied by
		// SE and costs AS29518 nothing.
		got = append(got, do(t, srv.Client(), "GET", srv.URL, http.Header{"X-Forwarded-For": {"2a01:4f8::1"}}).String())
	}
	if want := "200 2,200 1,200 0,429 0"; strings.Join(got, ",") != want {
		t.Errorf("got %v, want %s", got, want)
	}
}

// A Locator's empty or unusable value skips the descriptor; a nil one is
// a configuration error.
func TestLocatedValues(t *testing.T) {
	loc := locatorFunc(func(a netip.Addr) string {
		switch a.String() {
		case "81.2.69.1":
			return "GB"
		case "81.2.69.2":
			return "G\x00"
		case "81.2.69.3":
			return strings.Repeat("x", httplimit.MaxHeaderValueLen+1)
		}
		return ""
	})
	srv := limited(t, httplimit.Config{
		Decider:     decider(t, geoRules),
		Domain:      "api",
		ClientIP:    httplimit.ClientIP{TrustedProxies: mustProxies(t, "127.0.0.0/8")},
		Descriptors: []httplimit.Descriptor{{{Key: "country", Source: httplimit.Located(loc)}}},
	})
	var got []string
	for _, a := range []string{"81.2.69.1", "81.2.69.2", "81.2.69.3", "81.2.69.4"} {
		got = append(got, do(t, srv.Client(), "GET", srv.URL, http.Header{"X-Forwarded-For": {a}}).String())
	}
	if want := "200 1,200 ,200 ,200 "; strings.Join(got, ",") != want {
		t.Errorf("got %v, want %s", got, want)
	}
	_, err := httplimit.New(httplimit.Config{
		Decider:     decider(t, geoRules),
		Domain:      "api",
		Descriptors: []httplimit.Descriptor{{{Source: httplimit.Located(nil)}}},
	})
	if err == nil || !strings.Contains(err.Error(), "nil Locator") {
		t.Errorf("Located(nil): %v", err)
	}
}

type locatorFunc func(netip.Addr) string

func (f locatorFunc) Locate(a netip.Addr) string { return f(a) }
