// Command geoipdb writes small MaxMind-format databases, in the layout of
// GeoLite2-Country and GeoLite2-ASN, from networks given on the command
// line: to try sluice proxy's country and ASN limits without an account
// or a download, and to test rules against known addresses.
//
//	go run ./cmd/geoipdb -dir geo 81.2.69.0/24=GB 81.2.69.0/24=AS20712
//
// writes geo/GeoLite2-Country.mmdb (81.2.69.0/24 in GB) and
// geo/GeoLite2-ASN.mmdb (81.2.69.0/24 in AS20712). Each argument is a
// network (CIDR, IPv4 or IPv6) and a country's ISO code, or AS and a
// number; a database is written only when a network has its kind. Files
// are replaced atomically, as geoipupdate replaces them, so a running
// sluice proxy reloads them.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/internal/testsupport/geoiptest"
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "geoipdb:", err)
		os.Exit(1)
	}
}

func run(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("geoipdb", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", ".", "the `directory` to write "+geoiptest.CountryFile+" and "+geoiptest.ASNFile+" into")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: geoipdb [-dir DIR] NETWORK=CC|NETWORK=ASnnn ...")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errors.New("name at least one network")
	}
	countries, asns, err := parseNetworks(fs.Args())
	if err != nil {
		return err
	}
	if len(countries) > 0 {
		if err := geoiptest.Write(filepath.Join(*dir, geoiptest.CountryFile), "GeoLite2-Country", countries); err != nil {
			return err
		}
	}
	if len(asns) > 0 {
		return geoiptest.Write(filepath.Join(*dir, geoiptest.ASNFile), "GeoLite2-ASN", asns)
	}
	return nil
}

// parseNetworks reads NETWORK=CC and NETWORK=ASnnn arguments.
func parseNetworks(args []string) (countries, asns []geoiptest.Network, err error) {
	for _, a := range args {
		prefix, value, ok := strings.Cut(a, "=")
		if !ok {
			return nil, nil, fmt.Errorf("%q: want NETWORK=CC or NETWORK=ASnnn", a)
		}
		p, err := netip.ParsePrefix(prefix)
		if err != nil {
			return nil, nil, fmt.Errorf("%q: %w", a, err)
		}
		p = p.Masked()
		switch {
		case strings.HasPrefix(strings.ToUpper(value), "AS"):
			n, err := strconv.ParseUint(value[2:], 10, 32)
			if err != nil || n == 0 {
				return nil, nil, fmt.Errorf("%q: an AS number is 1 to 4294967295", a)
			}
			asns = append(asns, geoiptest.Network{Prefix: p.String(), ASN: uint32(n)})
		case len(value) == 2 && isUpperAlpha(value):
			countries = append(countries, geoiptest.Network{Prefix: p.String(), Country: value})
		default:
			return nil, nil, fmt.Errorf("%q: a country is an ISO 3166 code of two capital letters (GB), an AS number is AS and digits (AS20712)", a)
		}
	}
	return countries, asns, nil
}

func isUpperAlpha(s string) bool {
	for _, r := range s {
		if r < 'A' || r > 'Z' {
			return false
		}
	}
	return true
}
