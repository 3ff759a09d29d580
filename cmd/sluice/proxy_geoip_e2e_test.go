package main

// End-to-end test of sluice proxy's country and ASN sources: the real
// binary, a country and an ASN database built by the test, clients
// presented by a trusted loopback peer's X-Forwarded-For.

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/edges/geoip"
	"github.com/sluicehq/sluice/internal/testsupport/geoiptest"
	"github.com/sluicehq/sluice/internal/testsupport/loopback"
)

const geoipRules = `domain: api
http:
  client_ip: {trusted_proxies: [127.0.0.1]}
  geoip:
    country: GeoLite2-Country.mmdb
    asn: GeoLite2-ASN.mmdb
  routes:
    - pattern: /
      descriptors:
        - [{source: country}]
        - [{source: asn}]
descriptors:
  - key: country
    value: GB
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: sliding_log}
  - key: country
    value: SE
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: sliding_log}
  - key: asn
    value: "29518"
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: sliding_log}
`

// writeGeoIP writes the rules and both databases into a new directory
// and returns the rules file.
func writeGeoIP(t *testing.T, rules string) string {
	t.Helper()
	dir := t.TempDir()
	if err := geoiptest.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(file, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

func TestProxyGeoIPE2E(t *testing.T) {
	beside(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	defer up.Close()
	file := writeGeoIP(t, geoipRules)
	p := startProxy(t, "--config", file, "--upstream", up.URL)
	front := "http://" + p.addrs["proxy"]

	from := func(c *http.Client, xff string) string {
		t.Helper()
		req, err := http.NewRequest("GET", front+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Forwarded-For", xff)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		return resp.Status[:3]
	}
	trusted := http.DefaultClient // from 127.0.0.1
	var got []string
	// A British client: 2 an hour.
	for range 3 {
		got = append(got, from(trusted, "81.2.69.142"))
	}
	// Swedish clients, over IPv4 and IPv6, share their 3 an hour; the
	// British denial cost them nothing.
	for _, a := range []string{"89.160.20.112", "2a01:4f8::1", "89.160.20.7", "2a01:4f8::2"} {
		got = append(got, from(trusted, a))
	}
	// Unknown and private addresses have no country and no ASN.
	got = append(got, from(trusted, "8.8.8.8"), from(trusted, "10.1.2.3"))
	// A peer that is not trusted claims a Swedish address: it is its own
	// loopback address, limited by nothing.
	got = append(got, from(loopback.Client(t, "127.0.0.2"), "89.160.20.112"))
	if want := "200,200,429,200,200,200,429,200,200,200"; strings.Join(got, ",") != want {
		t.Errorf("got  %s\nwant %s\n%s", strings.Join(got, ","), want, p.log())
	}

	// The country database replaced by a corrupt file: refused, logged,
	// and the British client is still British. Requests start the checks,
	// at most one every 10 seconds.
	country := filepath.Join(filepath.Dir(file), geoiptest.CountryFile)
	if err := geoiptest.Replace(country, []byte("\xab\xcd\xefMaxMind.com broken")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * geoip.DefaultCheckEvery)
	for !strings.Contains(p.log(), "geoip database refused") {
		if time.Now().After(deadline) {
			t.Fatalf("the corrupt database was not refused:\n%s", p.log())
		}
		if got := from(trusted, "81.2.69.142"); got != "429" {
			t.Fatalf("with a corrupt database the British client got %s, want 429", got)
		}
	}
	// A good file in which the client is Irish, limited by nothing.
	if err := geoiptest.Write(country, "GeoLite2-Country", []geoiptest.Network{{Prefix: "81.2.69.0/24", Country: "IE"}}); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(3 * geoip.DefaultCheckEvery)
	for from(trusted, "81.2.69.142") != "200" {
		if time.Now().After(deadline) {
			t.Fatalf("the new database was not loaded:\n%s", p.log())
		}
	}
	if !strings.Contains(p.log(), "geoip database loaded") {
		t.Errorf("the reload is not logged:\n%s", p.log())
	}
}

// sluice check reports a database that is missing, or of the wrong kind,
// at its line in the rules file.
func TestCheckGeoIPE2E(t *testing.T) {
	beside(t)
	bin := sluiceBinary(t)
	file := writeGeoIP(t, geoipRules)
	if out, err := exec.Command(bin, "check", "--config", file).CombinedOutput(); err != nil {
		t.Fatalf("check of a good file: %v\n%s", err, out)
	}
	bad := strings.Replace(geoipRules, "asn: GeoLite2-ASN.mmdb", "asn: GeoLite2-Country.mmdb", 1)
	bad = strings.Replace(bad, "country: GeoLite2-Country.mmdb", "country: missing.mmdb", 1)
	file = writeGeoIP(t, bad)
	out, err := exec.Command(bin, "check", "--config", file).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("check of a bad file: %v\n%s", err, out)
	}
	for _, want := range []string{
		"rules.yaml:5:14: geoip country: stat ",
		"rules.yaml:6:10: geoip asn: ",
		"not an ASN database",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("check's output lacks %q:\n%s", want, out)
		}
	}
}
