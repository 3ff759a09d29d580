package main

import (
	"io"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/oschwald/maxminddb-golang/v2"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	if err := run([]string{"-dir", dir, "81.2.69.0/24=GB", "2a02:db0::/32=GB", "81.2.69.0/24=AS20712"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	country, err := maxminddb.Open(filepath.Join(dir, "GeoLite2-Country.mmdb"))
	if err != nil {
		t.Fatal(err)
	}
	defer country.Close()
	var rec struct {
		Country struct {
			ISOCode string `maxminddb:"iso_code"`
		} `maxminddb:"country"`
	}
	for _, addr := range []string{"81.2.69.142", "2a02:db0::1"} {
		if err := country.Lookup(netip.MustParseAddr(addr)).Decode(&rec); err != nil || rec.Country.ISOCode != "GB" {
			t.Errorf("%s: %q, %v", addr, rec.Country.ISOCode, err)
		}
	}
	if country.Metadata.DatabaseType != "GeoLite2-Country" {
		t.Errorf("type %q", country.Metadata.DatabaseType)
	}
	asn, err := maxminddb.Open(filepath.Join(dir, "GeoLite2-ASN.mmdb"))
	if err != nil {
		t.Fatal(err)
	}
	defer asn.Close()
	var as struct {
		N uint32 `maxminddb:"autonomous_system_number"`
	}
	if err := asn.Lookup(netip.MustParseAddr("81.2.69.1")).Decode(&as); err != nil || as.N != 20712 {
		t.Errorf("ASN: %d, %v", as.N, err)
	}
}

func TestBadArguments(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"81.2.69.0/24"},
		{"81.2.69.0/33=GB"},
		{"81.2.69.0/24=gb"},
		{"81.2.69.0/24=GBR"},
		{"81.2.69.0/24=AS"},
		{"81.2.69.0/24=AS0"},
		{"81.2.69.0/24=AS99999999999"},
	} {
		dir := t.TempDir()
		if err := run(append([]string{"-dir", dir}, args...), io.Discard); err == nil {
			t.Errorf("%q: no error", args)
		}
		if m, _ := filepath.Glob(filepath.Join(dir, "*")); len(m) != 0 {
			t.Errorf("%q: wrote %v", args, m)
		}
	}
}
