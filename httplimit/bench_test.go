package httplimit_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/httplimit"
)

func BenchmarkResolve(b *testing.B) {
	trusted := mustProxies(b, "10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, fd00::/8, fe80::1")
	all := []string{"X-Forwarded-For", "Forwarded", "X-Real-IP"}
	cases := []struct {
		name    string
		headers []string
		peer    string
		lines   []string
	}{
		{name: "untrusted peer", peer: "203.0.113.5:4000", lines: []string{"X-Forwarded-For: 192.0.2.66"}},
		{name: "untrusted IPv6 peer", peer: "[2001:db8:1:2::5]:4000"},
		{name: "XFF one hop", peer: "10.0.0.1:4000", lines: []string{"X-Forwarded-For: 198.51.100.1"}},
		{name: "XFF three hops", peer: "10.0.0.1:4000",
			lines: []string{"X-Forwarded-For: 192.0.2.66, 198.51.100.1, 172.16.0.2, 10.0.0.3"}},
		{name: "XFF zoned IPv6", peer: "[fe80::1%eth0]:4000", lines: []string{"X-Forwarded-For: fe80::2%eth0"}},
		{name: "XFF IPv6", peer: "[fd00::1]:4000", lines: []string{"X-Forwarded-For: [2001:db8:1:2::77]:443"}},
		{name: "Forwarded", headers: all[1:], peer: "10.0.0.1:4000",
			lines: []string{`Forwarded: for=192.0.2.66, for="[2001:db8:cafe::17]:4711";proto=https, for=10.0.0.2`}},
		{name: "X-Real-IP", headers: all[2:], peer: "10.0.0.1:4000", lines: []string{"X-Real-IP: 198.51.100.1"}},
		{name: "XFF 1MB", peer: "10.0.0.1:4000",
			lines: []string{"X-Forwarded-For: " + strings.Repeat("192.0.2.66, ", 1<<20/12) + "198.51.100.1, 10.0.0.2"}},
		{name: "XFF 1MB garbage", peer: "10.0.0.1:4000", lines: []string{"X-Forwarded-For: " + strings.Repeat("x", 1<<20)}},
	}
	for _, bc := range cases {
		c := &httplimit.ClientIP{TrustedProxies: trusted, Headers: bc.headers}
		r := request(bc.peer, bc.lines...)
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Resolve(r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("XFF three hops parallel", func(b *testing.B) {
		c := &httplimit.ClientIP{TrustedProxies: trusted}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			r := request("10.0.0.1:4000", "X-Forwarded-For: 192.0.2.66, 198.51.100.1, 172.16.0.2, 10.0.0.3")
			for pb.Next() {
				if _, err := c.Resolve(r); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

var keySink string

// BenchmarkKey measures the descriptor value: Key allocates the string,
// AppendKey into a reused buffer does not.
func BenchmarkKey(b *testing.B) {
	c := &httplimit.ClientIP{}
	for _, peer := range []string{"203.0.113.5:4000", "[2001:db8:1:2::5]:4000"} {
		p, err := c.Resolve(&http.Request{RemoteAddr: peer})
		if err != nil {
			b.Fatal(err)
		}
		b.Run("Key "+httplimit.Key(p), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				keySink = httplimit.Key(p)
			}
		})
		b.Run("AppendKey "+httplimit.Key(p), func(b *testing.B) {
			b.ReportAllocs()
			buf := make([]byte, 0, 64)
			for b.Loop() {
				buf = httplimit.AppendKey(buf[:0], p)
			}
		})
	}
}
