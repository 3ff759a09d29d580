package geoip_test

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/edges/geoip"
	"github.com/sluicehq/sluice/internal/testsupport/geoiptest"
	"github.com/sluicehq/sluice/internal/testsupport/logtest"
)

// write writes a test database to a new file in t's directory.
func write(t *testing.T, name, dbType string, nets []geoiptest.Network) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := geoiptest.Write(path, dbType, nets); err != nil {
		t.Fatal(err)
	}
	return path
}

func open(t *testing.T, path string, f geoip.Field, opts geoip.Options) *geoip.DB {
	t.Helper()
	db, err := geoip.Open(path, f, opts)
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func TestLookup(t *testing.T) {
	cdb := open(t, write(t, "c.mmdb", "GeoLite2-Country", geoiptest.Countries), geoip.Country, geoip.Options{})
	adb := open(t, write(t, "a.mmdb", "GeoLite2-ASN", geoiptest.ASNs), geoip.ASN, geoip.Options{})
	for _, tc := range []struct{ addr, country, asn string }{
		{"81.2.69.142", "GB", "20712"},
		{"::ffff:81.2.69.142", "GB", "20712"}, // IPv4-mapped
		{"2a02:db0:1::5", "GB", "20712"},
		{"89.160.20.112", "SE", "29518"},
		{"2a01:4f8:c0c:1234::1", "SE", "29518"},
		{"fe80::1%eth0", "", ""}, // link-local, zoned
		{"8.8.8.8", "", ""},      // not in the database
		{"2001:4860:4860::8888", "", ""},
		{"10.1.2.3", "", ""}, // private
		{"192.168.0.1", "", ""},
		{"127.0.0.1", "", ""},
		{"::1", "", ""},
		{"fd00::1", "", ""},
	} {
		a := netip.MustParseAddr(tc.addr)
		if got := cdb.Country(a); got != tc.country {
			t.Errorf("Country(%s) = %q, want %q", tc.addr, got, tc.country)
		}
		if got := cdb.Locator(geoip.Country).Locate(a); got != tc.country {
			t.Errorf("Locate(%s) = %q, want %q", tc.addr, got, tc.country)
		}
		if got := adb.ASN(a); got != tc.asn {
			t.Errorf("ASN(%s) = %q, want %q", tc.addr, got, tc.asn)
		}
	}
	if got := cdb.Country(netip.Addr{}); got != "" {
		t.Errorf("Country(zero) = %q", got)
	}
	if got := cdb.ASN(netip.MustParseAddr("81.2.69.142")); got != "" {
		t.Errorf("ASN of a DB opened for Country = %q, want none", got)
	}
	if cdb.Type() != "GeoLite2-Country" {
		t.Errorf("Type = %q", cdb.Type())
	}
}

func TestLowerCaseCountry(t *testing.T) {
	db := open(t, write(t, "c.mmdb", "Test-Country", []geoiptest.Network{{Prefix: "81.2.69.0/24", Country: "gb"}}), geoip.Country, geoip.Options{})
	if got := db.Country(netip.MustParseAddr("81.2.69.1")); got != "GB" {
		t.Errorf("Country = %q, want GB", got)
	}
}

func TestBothFields(t *testing.T) {
	var nets []geoiptest.Network
	for i, n := range geoiptest.Countries {
		n.ASN = geoiptest.ASNs[i].ASN
		nets = append(nets, n)
	}
	db := open(t, write(t, "e.mmdb", "GeoIP2-Enterprise", nets), geoip.Country|geoip.ASN, geoip.Options{})
	a := netip.MustParseAddr("89.160.20.1")
	if db.Country(a) != "SE" || db.ASN(a) != "29518" {
		t.Errorf("Country, ASN = %q, %q", db.Country(a), db.ASN(a))
	}
}

func TestOpenRefuses(t *testing.T) {
	dir := t.TempDir()
	asn := write(t, "asn.mmdb", "GeoLite2-ASN", geoiptest.ASNs)
	country := write(t, "c.mmdb", "GeoLite2-Country", geoiptest.Countries)
	garbage := filepath.Join(dir, "garbage.mmdb")
	if err := os.WriteFile(garbage, []byte("not a database"), 0o644); err != nil {
		t.Fatal(err)
	}
	huge := filepath.Join(dir, "huge.mmdb") // sparse: no disk, no read
	if err := os.WriteFile(huge, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(huge, geoip.MaxFileSize+1); err != nil {
		t.Fatal(err)
	}
	corrupt := filepath.Join(dir, "corrupt.mmdb")
	if err := os.WriteFile(corrupt, corrupted(t), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		f    geoip.Field
		want string
	}{
		{filepath.Join(dir, "missing.mmdb"), geoip.Country, "no such file"},
		{dir, geoip.Country, "not a regular file"},
		{garbage, geoip.Country, "not a MaxMind database"},
		{huge, geoip.Country, "larger than"},
		{corrupt, geoip.Country, "corrupt"},
		{asn, geoip.Country, "not a country database"},
		{country, geoip.ASN, "not an ASN database"},
		{country, geoip.Country | geoip.ASN, "not an ASN database"},
		{country, 0, "invalid fields"},
	} {
		_, err := geoip.Open(tc.path, tc.f, geoip.Options{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%s, %v) = %v, want an error with %q", filepath.Base(tc.path), tc.f, err, tc.want)
		}
	}
}

// corrupted is a country database whose search tree is damaged: the
// metadata still parses, so only Verify finds it.
func corrupted(t *testing.T) []byte {
	t.Helper()
	data, err := geoiptest.Bytes("GeoLite2-Country", geoiptest.Countries)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 64 && i < len(data); i++ {
		data[i] = 0xff
	}
	return data
}

func TestCheckReplaced(t *testing.T) {
	path := write(t, "c.mmdb", "GeoLite2-Country", geoiptest.Countries)
	var logs logtest.Buffer
	db := open(t, path, geoip.Country, geoip.Options{CheckEvery: -1, Logger: logs.Logger()})
	gb := netip.MustParseAddr("81.2.69.142")
	if ok, err := db.Check(); ok || err != nil {
		t.Fatalf("Check of an unchanged file = %v, %v", ok, err)
	}

	// Renamed over, as geoipupdate does.
	if err := geoiptest.Write(path, "GeoLite2-Country", []geoiptest.Network{{Prefix: "81.2.69.0/24", Country: "IE"}}); err != nil {
		t.Fatal(err)
	}
	if ok, err := db.Check(); !ok || err != nil {
		t.Fatalf("Check of a replaced file = %v, %v", ok, err)
	}
	if got := db.Country(gb); got != "IE" {
		t.Errorf("after the replacement Country = %q, want IE", got)
	}

	// Rewritten in place.
	data, err := geoiptest.Bytes("GeoLite2-Country", []geoiptest.Network{{Prefix: "81.2.69.0/24", Country: "FR"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if ok, err := db.Check(); !ok || err != nil {
		t.Fatalf("Check of a rewritten file = %v, %v", ok, err)
	}
	if got := db.Country(gb); got != "FR" {
		t.Errorf("after the rewrite Country = %q, want FR", got)
	}

	// A corrupt replacement is refused, once logged, and FR stays.
	if err := geoiptest.Replace(path, corrupted(t)); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if ok, err := db.Check(); ok || !errors.Is(err, geoip.ErrRefused) {
			t.Fatalf("Check of a corrupt file = %v, %v; want ErrRefused", ok, err)
		}
		if got := db.Country(gb); got != "FR" {
			t.Fatalf("after a refused file Country = %q, want FR", got)
		}
	}
	if n := strings.Count(logs.String(), "refused"); n != 1 {
		t.Errorf("the refused file was logged %d times, want once:\n%s", n, logs.String())
	}

	// An ASN database in place of a country one: refused too.
	if err := geoiptest.Write(path, "GeoLite2-ASN", geoiptest.ASNs); err != nil {
		t.Fatal(err)
	}
	if ok, err := db.Check(); ok || err == nil || !strings.Contains(err.Error(), "not a country database") {
		t.Fatalf("Check of an ASN file = %v, %v", ok, err)
	}

	// The file removed: logged once, FR stays.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if ok, err := db.Check(); ok || !errors.Is(err, geoip.ErrRefused) {
			t.Fatalf("Check of a missing file = %v, %v", ok, err)
		}
	}
	if got := db.Country(gb); got != "FR" {
		t.Errorf("with the file gone Country = %q, want FR", got)
	}
	if n := strings.Count(logs.String(), "unreadable"); n != 1 {
		t.Errorf("the missing file was logged %d times, want once", n)
	}

	// A good file again is picked up.
	if err := geoiptest.Write(path, "GeoLite2-Country", geoiptest.Countries); err != nil {
		t.Fatal(err)
	}
	if ok, err := db.Check(); !ok || err != nil {
		t.Fatalf("Check of a good file = %v, %v", ok, err)
	}
	if got := db.Country(gb); got != "GB" {
		t.Errorf("Country = %q, want GB", got)
	}
	if !strings.Contains(logs.String(), "geoip database loaded") {
		t.Errorf("no reload logged:\n%s", logs.String())
	}
}

// waitFor calls cond until it holds, failing t after a generous deadline
// (the machine may be busy).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLookupsReload: the lookups themselves start the checks, in the
// background; a replaced file is picked up, a corrupt one is not.
func TestLookupsReload(t *testing.T) {
	path := write(t, "c.mmdb", "GeoLite2-Country", geoiptest.Countries)
	db := open(t, path, geoip.Country, geoip.Options{CheckEvery: time.Millisecond})
	gb := netip.MustParseAddr("81.2.69.142")
	if err := geoiptest.Write(path, "GeoLite2-Country", []geoiptest.Network{{Prefix: "81.2.69.0/24", Country: "IE"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the replaced file", func() bool { return db.Country(gb) == "IE" })

	if err := geoiptest.Replace(path, corrupted(t)); err != nil {
		t.Fatal(err)
	}
	// The corrupt file has been looked at once the next good one is in
	// force; until then IE must answer throughout.
	deadline := time.Now().Add(100 * time.Millisecond)
	for time.Now().Before(deadline) {
		if got := db.Country(gb); got != "IE" {
			t.Fatalf("with a corrupt file Country = %q, want IE", got)
		}
	}
	if err := geoiptest.Write(path, "GeoLite2-Country", geoiptest.Countries); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the good file", func() bool { return db.Country(gb) == "GB" })
}

// TestConcurrentReloads looks up from several goroutines while the file
// is replaced by good and corrupt versions; every answer is one of a good
// version's. Run with -race.
func TestConcurrentReloads(t *testing.T) {
	path := write(t, "c.mmdb", "GeoLite2-Country", geoiptest.Countries)
	db := open(t, path, geoip.Country, geoip.Options{CheckEvery: time.Microsecond})
	ie, err := geoiptest.Bytes("GeoLite2-Country", []geoiptest.Network{{Prefix: "81.2.69.0/24", Country: "IE"}, {Prefix: "2a02:db0::/32", Country: "IE"}})
	if err != nil {
		t.Fatal(err)
	}
	gbData, err := geoiptest.Bytes("GeoLite2-Country", geoiptest.Countries)
	if err != nil {
		t.Fatal(err)
	}
	bad := corrupted(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[string]int{}
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := netip.MustParseAddr("81.2.69.142")
			if i%2 == 1 {
				a = netip.MustParseAddr("2a02:db0::7")
			}
			local := map[string]int{}
			for {
				local[db.Country(a)]++
				select {
				case <-stop:
					mu.Lock()
					for k, v := range local {
						seen[k] += v
					}
					mu.Unlock()
					return
				default:
				}
			}
		}()
	}
	for i := range 60 {
		data := [...][]byte{ie, bad, gbData}[i%3]
		if err := geoiptest.Replace(path, data); err != nil {
			t.Fatal(err)
		}
		db.Check() // beside the lookups' own checks
	}
	close(stop)
	wg.Wait()
	for k := range seen {
		if k != "GB" && k != "IE" {
			t.Errorf("a lookup answered %q: %v", k, seen)
		}
	}
	if len(seen) == 0 {
		t.Errorf("no lookup answered")
	}
}
