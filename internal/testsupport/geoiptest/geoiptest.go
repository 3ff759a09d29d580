// Package geoiptest writes small MaxMind-format databases for tests, with
// MaxMind's own writer: a few networks with a country, an autonomous
// system number, or both, as GeoLite2-Country and GeoLite2-ASN lay out
// their records. Tests build their databases with it; none is downloaded.
//
// It imports mmdbwriter and the standard library, and is imported by
// tests only.
package geoiptest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/maxmind/mmdbwriter"
	"github.com/maxmind/mmdbwriter/mmdbtype"
)

// Network is one network of a test database and its values; a zero
// Country or ASN leaves the field out of its record.
type Network struct {
	Prefix  string // "81.2.69.0/24", "2a02:1234::/32"
	Country string // "GB"
	ASN     uint32 // 64500
}

// Bytes returns a database of type dbType ("GeoLite2-Country",
// "GeoLite2-ASN") holding nets, IPv6 with IPv4 aliased, as geoipupdate
// delivers them.
func Bytes(dbType string, nets []Network) ([]byte, error) {
	tree, err := mmdbwriter.New(mmdbwriter.Options{
		DatabaseType: dbType,
		Description:  map[string]string{"en": "sluice test database"},
		RecordSize:   24,
	})
	if err != nil {
		return nil, err
	}
	for _, n := range nets {
		_, ipnet, err := net.ParseCIDR(n.Prefix)
		if err != nil {
			return nil, err
		}
		rec := mmdbtype.Map{}
		if n.Country != "" {
			rec["country"] = mmdbtype.Map{"iso_code": mmdbtype.String(n.Country)}
		}
		if n.ASN != 0 {
			rec["autonomous_system_number"] = mmdbtype.Uint32(n.ASN)
			rec["autonomous_system_organization"] = mmdbtype.String(fmt.Sprintf("AS%d Example", n.ASN))
		}
		if err := tree.Insert(ipnet, rec); err != nil {
			return nil, fmt.Errorf("%s: %w", n.Prefix, err)
		}
	}
	f := new(bufferWriter)
	if _, err := tree.WriteTo(f); err != nil {
		return nil, err
	}
	return f.b, nil
}

type bufferWriter struct{ b []byte }

func (w *bufferWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

// Write writes the database of Bytes to path, replacing it atomically (a
// new file renamed over it, as geoipupdate does).
func Write(path, dbType string, nets []Network) error {
	data, err := Bytes(dbType, nets)
	if err != nil {
		return err
	}
	return Replace(path, data)
}

// Replace puts data at path by writing a new file beside it and renaming
// it over path.
func Replace(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".geoiptest-*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// The networks of the databases the tests share: two countries and two
// autonomous systems, each over IPv4 and IPv6.
var (
	Countries = []Network{
		{Prefix: "81.2.69.0/24", Country: "GB"},
		{Prefix: "2a02:db0::/32", Country: "GB"},
		{Prefix: "89.160.20.0/24", Country: "SE"},
		{Prefix: "2a01:4f8::/32", Country: "SE"},
	}
	ASNs = []Network{
		{Prefix: "81.2.69.0/24", ASN: 20712},
		{Prefix: "2a02:db0::/32", ASN: 20712},
		{Prefix: "89.160.20.0/24", ASN: 29518},
		{Prefix: "2a01:4f8::/32", ASN: 29518},
	}
)

// The file names WriteDir gives its databases.
const (
	CountryFile = "GeoLite2-Country.mmdb"
	ASNFile     = "GeoLite2-ASN.mmdb"
)

// WriteDir writes a country database of Countries and an ASN database of
// ASNs into dir, as CountryFile and ASNFile.
func WriteDir(dir string) error {
	if err := Write(filepath.Join(dir, CountryFile), "GeoLite2-Country", Countries); err != nil {
		return err
	}
	return Write(filepath.Join(dir, ASNFile), "GeoLite2-ASN", ASNs)
}
