package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/edges/httpconf"
	"github.com/sluicehq/sluice/internal/edges/proxy"
	"github.com/sluicehq/sluice/internal/testsupport/geoiptest"
	"github.com/sluicehq/sluice/internal/testsupport/logtest"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
)

// A route limited by {source: country}: clients behind the trusted
// loopback proxy are limited by their own country; the database swapped
// under the proxy is picked up, and a corrupt one is logged and ignored.
func TestGeoIPCountry(t *testing.T) {
	dir := t.TempDir()
	country := filepath.Join(dir, "country.mmdb")
	if err := geoiptest.Write(country, "GeoLite2-Country", geoiptest.Countries); err != nil {
		t.Fatal(err)
	}
	src := `domain: api
http:
  client_ip: {trusted_proxies: [127.0.0.1]}
  geoip: {country: country.mmdb}
  routes:
    - pattern: /
      descriptors: [[{source: country}]]
descriptors:
  - {key: country, value: GB, rate_limit: {unit: hour, requests_per_unit: 2}}
  - {key: country, value: SE, rate_limit: {unit: hour, requests_per_unit: 3}}
`
	section, err := httpconf.Parse(filepath.Join(dir, "rules.yaml"), []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	store := memstore.New(memstore.Config{})
	t.Cleanup(func() { store.Close() })
	up := newUpstream(t, nil)
	u, _ := url.Parse(up.URL)
	var logs logtest.Buffer
	p, err := proxy.New(proxy.Config{
		Upstream: u,
		Decider:  mustDecider(sluice.NewLimiter(store), rulestest.Config(t, src)),
		Domain:   "api",
		HTTP:     section,
		Logger:   logs.Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	get := func(c *http.Client, xff string) string {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+"/", nil)
		req.Header.Set("X-Forwarded-For", xff)
		if c == nil {
			c = srv.Client()
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.Status[:3] + " " + resp.Header.Get("X-RateLimit-Remaining")
	}
	var got []string
	for range 3 {
		got = append(got, get(nil, "81.2.69.142"))
	}
	for range 4 {
		got = append(got, get(nil, "2a01:4f8::1"))
	}
	// Another peer, not trusted, claims to be British: it is its own
	// loopback address, in no country.
	got = append(got, get(clientFrom(t, "127.0.0.2"), "81.2.69.142"))
	if want := "200 1,200 0,429 0,200 2,200 1,200 0,429 0,200 "; strings.Join(got, ",") != want {
		t.Errorf("got  %s\nwant %s", strings.Join(got, ","), want)
	}

	db := section.GeoIP.Country
	// A corrupt file in its place: refused, logged, GB still denied.
	if err := geoiptest.Replace(country, []byte("\xab\xcd\xefMaxMind.com broken")); err != nil {
		t.Fatal(err)
	}
	if ok, err := db.Check(); ok || err == nil {
		t.Fatalf("Check of a corrupt file = %v, %v", ok, err)
	}
	if !strings.Contains(logs.String(), "component=geoip") || !strings.Contains(logs.String(), "refused") {
		t.Errorf("the refused file is not logged:\n%s", logs.String())
	}
	if g := get(nil, "81.2.69.142"); g != "429 0" {
		t.Errorf("with a corrupt file GB got %s, want 429 0", g)
	}
	// A good file where 81.2.69.0/24 is in Ireland: no longer limited.
	if err := geoiptest.Write(country, "GeoLite2-Country", []geoiptest.Network{{Prefix: "81.2.69.0/24", Country: "IE"}}); err != nil {
		t.Fatal(err)
	}
	if ok, err := db.Check(); !ok || err != nil {
		t.Fatalf("Check of a good file = %v, %v", ok, err)
	}
	if g := get(nil, "81.2.69.142"); g != "200 " {
		t.Errorf("after the new file the client got %s, want 200 unlimited", g)
	}
}
