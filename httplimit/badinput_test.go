package httplimit_test

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/httplimit"
)

// Garbage and enormous headers never panic, never become the key, and cost
// a bounded amount of work: Resolve allocates nothing even for 1 MB.
func TestResolveBadInput(t *testing.T) {
	const mb = 1 << 20
	c := &httplimit.ClientIP{
		TrustedProxies: mustProxies(t, proxies),
		Headers:        []string{"X-Forwarded-For", "Forwarded", "X-Real-IP"},
	}
	manyLines := make([]string, 5000)
	for i := range manyLines {
		manyLines[i] = "192.0.2.66"
	}
	trustedLines := make([]string, 5000)
	for i := range trustedLines {
		trustedLines[i] = "10.0.0.7"
	}
	junk := string([]byte{0, 1, 2, '\r', '\n', 0x7f, 0x80, 0xff, '"', '\\', '[', ']', ';', '=', ':', '%'})
	tests := []struct {
		name   string
		header http.Header
		want   string
	}{
		{"1 MB single entry", http.Header{"X-Forwarded-For": {strings.Repeat("1", mb)}}, "10.0.0.1"},
		{"1 MB of spaces", http.Header{"X-Forwarded-For": {strings.Repeat(" ", mb)}}, "10.0.0.1"},
		{"1 MB of commas", http.Header{"X-Forwarded-For": {strings.Repeat(",", mb)}}, "10.0.0.1"},
		{"1 MB then the client", http.Header{"X-Forwarded-For": {strings.Repeat("x", mb) + ", 198.51.100.1"}}, "198.51.100.1"},
		{"1 MB, client, trusted hops", http.Header{"X-Forwarded-For": {
			strings.Repeat("192.0.2.66,", mb/11) + "198.51.100.1, 10.0.0.2, 10.0.0.3"}}, "198.51.100.1"},
		{"thousands of trusted entries", http.Header{"X-Forwarded-For": {
			"198.51.100.1" + strings.Repeat(", 10.0.0.7", 5000)}}, "10.0.0.7"},
		{"thousands of header lines", http.Header{"X-Forwarded-For": manyLines}, "192.0.2.66"},
		{"thousands of trusted header lines", http.Header{"X-Forwarded-For": trustedLines}, "10.0.0.7"},
		{"junk bytes", http.Header{"X-Forwarded-For": {junk}}, "10.0.0.1"},
		{"junk between client and proxy", http.Header{"X-Forwarded-For": {"198.51.100.1, " + junk}}, "10.0.0.1"},
		{"1 MB Forwarded", http.Header{"Forwarded": {"for=" + strings.Repeat("1", mb)}}, "10.0.0.1"},
		{"1 MB quoted Forwarded", http.Header{"Forwarded": {`for="` + strings.Repeat(`\"`, mb/2)}}, "10.0.0.1"},
		{"junk Forwarded", http.Header{"Forwarded": {"for=" + junk}}, "10.0.0.1"},
		{"1 MB X-Real-IP", http.Header{"X-Real-Ip": {strings.Repeat(" ", mb) + "198.51.100.1"}}, "10.0.0.1"},
		{"injected X-Real-IP", http.Header{"X-Real-Ip": {"198.51.100.1\r\nX-Real-IP: 192.0.2.66"}}, "10.0.0.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := request("10.0.0.1:4000")
			r.Header = tt.header
			if got := resolveKey(t, c, r); got != tt.want {
				t.Errorf("key = %q, want %q", got, tt.want)
			}
			// The same request from an untrusted peer is the peer.
			r.RemoteAddr = "203.0.113.5:4000"
			if got := resolveKey(t, c, r); got != "203.0.113.5" {
				t.Errorf("untrusted peer: key = %q, want 203.0.113.5", got)
			}
			r.RemoteAddr = "10.0.0.1:4000"
			if n := testing.AllocsPerRun(10, func() { c.Resolve(r) }); n != 0 {
				t.Errorf("Resolve allocates %v times, want 0", n)
			}
		})
	}
}

// The client never chooses its key by what it writes to the left of the
// address the trusted proxy appends.
func TestResolveLeftPartIgnored(t *testing.T) {
	c := &httplimit.ClientIP{
		TrustedProxies: mustProxies(t, proxies),
		Headers:        []string{"Forwarded", "X-Forwarded-For"},
	}
	for _, left := range spoofs {
		xff := request("10.0.0.1:4000", "X-Forwarded-For: "+left+", 198.51.100.1")
		if got := resolveKey(t, c, xff); got != "198.51.100.1" {
			t.Errorf("XFF %q: key = %q", left, got)
		}
		fwd := request("10.0.0.1:4000", "Forwarded: "+left+", for=198.51.100.1")
		if got := resolveKey(t, c, fwd); got != "198.51.100.1" {
			t.Errorf("Forwarded %q: key = %q", left, got)
		}
	}
}

var spoofs = []string{
	"", "192.0.2.66", "10.0.0.2", "unknown", "for=192.0.2.66", `for="`, `"`, `\`, "[", "]:",
	"\x00", "\r\nX-Forwarded-For: 192.0.2.66", strings.Repeat("a,", 1000),
}

// naiveResolve is the reference for X-Forwarded-For: split every line on
// commas, then walk from the right with the same bounds, parsing entries with
// netip's own functions.
func naiveResolve(c *httplimit.ClientIP, peer netip.Addr, lines []string) netip.Addr {
	if !naiveTrusted(c, peer) {
		return peer
	}
	var elems []string
	for _, l := range lines {
		elems = append(elems, strings.Split(l, ",")...)
	}
	client := peer
	for i, hops := len(elems)-1, 0; i >= 0 && hops < httplimit.MaxHops; i, hops = i-1, hops+1 {
		e := elems[i]
		if len(e) > 128 {
			break
		}
		e = strings.Trim(e, " \t")
		if e == "" {
			continue
		}
		a, ok := naiveParse(e)
		if !ok {
			break
		}
		if !naiveTrusted(c, a) {
			return a
		}
		client = a
	}
	return client
}

func naiveTrusted(c *httplimit.ClientIP, a netip.Addr) bool {
	for _, p := range c.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func naiveParse(s string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().WithZone("").Unmap(), true
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		s = s[1 : len(s)-1]
		if a, err := netip.ParseAddr(s); err == nil && a.Is6() {
			return a.WithZone("").Unmap(), true
		}
		return netip.Addr{}, false
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.WithZone("").Unmap(), true
	}
	return netip.Addr{}, false
}

func FuzzResolve(f *testing.F) {
	f.Add("10.0.0.1:4000", "192.0.2.66, 198.51.100.1, 10.0.0.2", "", "for=198.51.100.1", "198.51.100.1")
	f.Add("203.0.113.5:80", "198.51.100.1", "10.0.0.2", `for="[2001:db8::1]:80"`, "[::1]:1")
	f.Add("[fd00::1]:1", "::ffff:1.2.3.4, fe80::1%eth0", "[2001:db8::1]:443", "for=unknown, for=_x", "")
	f.Add("[::ffff:10.0.0.1]:1", "garbage, 10.0.0.3", ",,,", `for=1.2.3.4;proto="a;b", For=10.0.0.9`, "x")
	f.Add("10.0.0.1", "", "", "", "")
	for _, s := range spoofs {
		f.Add("10.0.0.1:1", s, s, s, s)
	}
	trusted := mustProxies(f, proxies)
	f.Fuzz(func(t *testing.T, peer, xff1, xff2, fwd, realIP string) {
		r := &http.Request{RemoteAddr: peer, Header: http.Header{
			"X-Forwarded-For": {xff1, xff2},
			"Forwarded":       {fwd},
			"X-Real-Ip":       {realIP},
		}}
		for _, headers := range [][]string{nil, {"Forwarded"}, {"X-Real-IP"}} {
			c := &httplimit.ClientIP{TrustedProxies: trusted, Headers: headers, IPv6Prefix: 128}
			p, err := c.Resolve(r)
			if err != nil {
				if _, perr := netip.ParseAddrPort(peer); perr == nil {
					t.Fatalf("Resolve(%q): %v", peer, err)
				}
				return
			}
			if !p.IsValid() || !p.IsSingleIP() {
				t.Fatalf("Resolve = %v, want a single address", p)
			}
			if k := httplimit.Key(p); netip.MustParseAddr(k) != p.Addr() {
				t.Fatalf("Key(%v) = %q does not round-trip", p, k)
			}
			peerAddr, _ := netip.ParseAddrPort(peer)
			peerIP := peerAddr.Addr().WithZone("").Unmap()
			if !peerIP.IsValid() {
				peerIP = netip.MustParseAddr(peer).WithZone("").Unmap()
			}
			if !naiveTrusted(c, peerIP) && p.Addr() != peerIP {
				t.Fatalf("untrusted peer %q resolved to %v", peer, p.Addr())
			}
			if headers == nil {
				if want := naiveResolve(c, peerIP, []string{xff1, xff2}); p.Addr() != want {
					t.Fatalf("XFF %q %q from %q: got %v, reference %v", xff1, xff2, peer, p.Addr(), want)
				}
			}
		}
		// Whatever the client wrote, the address the trusted proxy appends
		// wins.
		c := &httplimit.ClientIP{TrustedProxies: trusted, Headers: []string{"Forwarded", "X-Forwarded-For"}}
		for _, r := range []*http.Request{
			request("10.0.0.1:1", "Forwarded: "+fwd+", for=198.51.100.1"),
			request("10.0.0.1:1", "X-Forwarded-For: "+xff1+", 198.51.100.1"),
		} {
			if got := resolveKey(t, c, r); got != "198.51.100.1" {
				t.Fatalf("%q: key = %q, want the appended 198.51.100.1", r.Header, got)
			}
		}
	})
}
