package httplimit_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/httplimit"
)

// request builds a request from peer with the given header lines, each
// "Name: value", added in order.
func request(peer string, lines ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = peer
	for _, l := range lines {
		name, value, _ := strings.Cut(l, ": ")
		r.Header.Add(name, value)
	}
	return r
}

func mustProxies(t testing.TB, s string) []netip.Prefix {
	t.Helper()
	p, err := httplimit.ParseTrustedProxies(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func resolveKey(t testing.TB, c *httplimit.ClientIP, r *http.Request) string {
	t.Helper()
	p, err := c.Resolve(r)
	if err != nil {
		t.Fatalf("Resolve(%q): %v", r.RemoteAddr, err)
	}
	return httplimit.Key(p)
}

const proxies = "10.0.0.0/8, fd00::/8, fe80::/10"

func TestResolve(t *testing.T) {
	const (
		trustedPeer   = "10.0.0.1:4000"
		untrustedPeer = "203.0.113.5:4000"
		xff           = "X-Forwarded-For: "
		fwd           = "Forwarded: "
		xri           = "X-Real-IP: "
	)
	both := []string{"Forwarded", "X-Forwarded-For"}
	tests := []struct {
		name    string
		trust   string // TrustedProxies; proxies when empty, none when "-"
		headers []string
		v4, v6  int
		peer    string
		lines   []string
		want    string
	}{
		// Untrusted peers: headers are never read.
		{name: "no proxies configured, spoofed XFF", trust: "-", peer: untrustedPeer,
			lines: []string{xff + "198.51.100.1"}, want: "203.0.113.5"},
		{name: "untrusted peer, spoofed XFF", peer: untrustedPeer,
			lines: []string{xff + "198.51.100.1, 10.0.0.2"}, want: "203.0.113.5"},
		{name: "untrusted peer, spoofed every header", headers: []string{"X-Real-IP", "Forwarded", "X-Forwarded-For"},
			peer: untrustedPeer, lines: []string{xff + "198.51.100.1", fwd + "for=198.51.100.2", xri + "198.51.100.3"},
			want: "203.0.113.5"},
		{name: "untrusted IPv6 peer grouped", peer: "[2001:db8:1:2::5]:4000",
			lines: []string{xff + "198.51.100.1"}, want: "2001:db8:1:2::/64"},
		{name: "peer without port", peer: "203.0.113.5", want: "203.0.113.5"},
		{name: "trusted peer, no header", peer: trustedPeer, want: "10.0.0.1"},

		// X-Forwarded-For from a trusted peer.
		{name: "XFF one hop", peer: trustedPeer, lines: []string{xff + "198.51.100.1"}, want: "198.51.100.1"},
		{name: "XFF spoof to the left", peer: trustedPeer,
			lines: []string{xff + "192.0.2.66, 198.51.100.1"}, want: "198.51.100.1"},
		{name: "XFF several trusted hops", peer: trustedPeer,
			lines: []string{xff + "192.0.2.66, 198.51.100.1, 10.0.0.2, fd00::3"}, want: "198.51.100.1"},
		{name: "XFF all trusted: left-most", peer: trustedPeer,
			lines: []string{xff + "10.0.0.9, 10.0.0.2, 10.0.0.3"}, want: "10.0.0.9"},
		{name: "XFF multiple lines", peer: trustedPeer,
			lines: []string{xff + "192.0.2.66, 198.51.100.1", xff + "10.0.0.2"}, want: "198.51.100.1"},
		{name: "XFF multiple lines, client on the last", peer: trustedPeer,
			lines: []string{xff + "192.0.2.66", xff + "10.0.0.7, 198.51.100.1, 10.0.0.2"}, want: "198.51.100.1"},
		{name: "XFF multiple lines all trusted", peer: trustedPeer,
			lines: []string{xff + "10.0.0.9", xff + "10.0.0.2"}, want: "10.0.0.9"},
		{name: "XFF empty elements skipped", peer: trustedPeer,
			lines: []string{xff + "192.0.2.66, 198.51.100.1,, 10.0.0.2 , ", xff + ""}, want: "198.51.100.1"},
		{name: "XFF tabs and spaces", peer: trustedPeer, lines: []string{xff + "\t198.51.100.1 \t"}, want: "198.51.100.1"},
		{name: "XFF IPv4 with port", peer: trustedPeer, lines: []string{xff + "198.51.100.1:5678"}, want: "198.51.100.1"},
		{name: "XFF bracketed IPv6 with port", peer: trustedPeer,
			lines: []string{xff + "[2001:db8:1:2::1]:443"}, want: "2001:db8:1:2::/64"},
		{name: "XFF bracketed IPv6", peer: trustedPeer, lines: []string{xff + "[2001:db8::1]"}, want: "2001:db8::/64"},
		{name: "XFF bare IPv6", peer: trustedPeer, lines: []string{xff + "2001:db8:1:2:3:4:5:6"}, want: "2001:db8:1:2::/64"},
		{name: "XFF IPv4-mapped is IPv4", peer: trustedPeer, lines: []string{xff + "::ffff:198.51.100.1"}, want: "198.51.100.1"},
		{name: "XFF IPv4-mapped trusted hop skipped", peer: trustedPeer,
			lines: []string{xff + "198.51.100.1, [::ffff:10.0.0.2]:80"}, want: "198.51.100.1"},
		{name: "XFF zone dropped", peer: trustedPeer, lines: []string{xff + "2001:db8::1%eth0"}, want: "2001:db8::/64"},
		{name: "XFF zoned trusted hop skipped", peer: trustedPeer,
			lines: []string{xff + "198.51.100.1, [fe80::1%eth0]:80"}, want: "198.51.100.1"},
		{name: "IPv4-mapped trusted peer", peer: "[::ffff:10.0.0.1]:4000",
			lines: []string{xff + "198.51.100.1"}, want: "198.51.100.1"},
		{name: "zoned trusted peer", peer: "[fe80::1%eth0]:4000",
			lines: []string{xff + "198.51.100.1"}, want: "198.51.100.1"},
		{name: "untrusted IPv4-mapped peer is IPv4", peer: "[::ffff:203.0.113.5]:4000",
			lines: []string{xff + "198.51.100.1"}, want: "203.0.113.5"},

		// The invalid-entry rule: stop, keep the last trusted hop's view.
		{name: "XFF invalid right-most: peer", peer: trustedPeer,
			lines: []string{xff + "198.51.100.1, garbage"}, want: "10.0.0.1"},
		{name: "XFF invalid after trusted hops: last trusted", peer: trustedPeer,
			lines: []string{xff + "198.51.100.1, not-an-ip, 10.0.0.3, 10.0.0.2"}, want: "10.0.0.3"},
		{name: "XFF invalid left of the client is never read", peer: trustedPeer,
			lines: []string{xff + "garbage, 198.51.100.1, 10.0.0.2"}, want: "198.51.100.1"},
		{name: "XFF IPv4 in brackets", peer: trustedPeer, lines: []string{xff + "[198.51.100.1]"}, want: "10.0.0.1"},
		{name: "XFF port out of range", peer: trustedPeer, lines: []string{xff + "198.51.100.1:65536"}, want: "10.0.0.1"},
		{name: "XFF hostname", peer: trustedPeer, lines: []string{xff + "example.com"}, want: "10.0.0.1"},
		{name: "XFF unknown", peer: trustedPeer, lines: []string{xff + "unknown"}, want: "10.0.0.1"},
		{name: "XFF control character", peer: trustedPeer,
			lines: []string{xff + "198.51.100.1\x00"}, want: "10.0.0.1"},
		{name: "XFF header injection", peer: trustedPeer,
			lines: []string{xff + "198.51.100.1\r\nX-Forwarded-For: 192.0.2.66"}, want: "10.0.0.1"},
		{name: "XFF element too long", peer: trustedPeer,
			lines: []string{xff + "198.51.100.1," + strings.Repeat(" ", 200) + "10.0.0.2"}, want: "10.0.0.1"},

		// Forwarded (RFC 7239).
		{name: "Forwarded simple", headers: both, peer: trustedPeer,
			lines: []string{fwd + "for=192.0.2.60;proto=http;by=203.0.113.43"}, want: "192.0.2.60"},
		{name: "Forwarded quoted IPv6 with port", headers: both, peer: trustedPeer,
			lines: []string{fwd + `for="[2001:db8:cafe::17]:4711"`}, want: "2001:db8:cafe::/64"},
		{name: "Forwarded quoted IPv4 with port", headers: both, peer: trustedPeer,
			lines: []string{fwd + `For="198.51.100.1:80"`}, want: "198.51.100.1"},
		{name: "Forwarded obfuscated port", headers: both, peer: trustedPeer,
			lines: []string{fwd + `for="198.51.100.1:_p0rt"`}, want: "198.51.100.1"},
		{name: "Forwarded spoof to the left, trusted hops", headers: both, peer: trustedPeer,
			lines: []string{fwd + `for=192.0.2.66, for=198.51.100.1;proto=https, for="[fd00::2]";by=_lb, For=10.0.0.2`},
			want:  "198.51.100.1"},
		{name: "Forwarded multiple lines", headers: both, peer: trustedPeer,
			lines: []string{fwd + "for=192.0.2.66, for=198.51.100.1", fwd + "for=10.0.0.2"}, want: "198.51.100.1"},
		{name: "Forwarded all trusted: left-most", headers: both, peer: trustedPeer,
			lines: []string{fwd + "for=10.0.0.9, for=10.0.0.2"}, want: "10.0.0.9"},
		{name: "Forwarded unknown right-most: peer", headers: both, peer: trustedPeer,
			lines: []string{fwd + "for=198.51.100.1, for=unknown"}, want: "10.0.0.1"},
		{name: "Forwarded obfuscated after trusted hop", headers: both, peer: trustedPeer,
			lines: []string{fwd + `for=198.51.100.1, for="_hidden", for=10.0.0.2`}, want: "10.0.0.2"},
		{name: "Forwarded obfuscated left of client", headers: both, peer: trustedPeer,
			lines: []string{fwd + "for=_hidden, for=198.51.100.1"}, want: "198.51.100.1"},
		{name: "Forwarded without for", headers: both, peer: trustedPeer,
			lines: []string{fwd + "for=198.51.100.1, proto=https;by=10.0.0.1"}, want: "10.0.0.1"},
		{name: "Forwarded repeated for", headers: both, peer: trustedPeer,
			lines: []string{fwd + "for=198.51.100.1;for=192.0.2.66"}, want: "10.0.0.1"},
		{name: "Forwarded unterminated quote", headers: both, peer: trustedPeer,
			lines: []string{fwd + `for="198.51.100.1`}, want: "10.0.0.1"},
		{name: "Forwarded quoted semicolon in another parameter", headers: both, peer: trustedPeer,
			lines: []string{fwd + `for=198.51.100.1;ext="a;b"`}, want: "198.51.100.1"},
		{name: "Forwarded quoted comma splits conservatively", headers: both, peer: trustedPeer,
			lines: []string{fwd + `for=198.51.100.1;ext="a,b"`}, want: "10.0.0.1"},
		{name: "Forwarded unquoted bracketed IPv6", headers: both, peer: trustedPeer,
			lines: []string{fwd + "for=[2001:db8::1]"}, want: "2001:db8::/64"},
		{name: "Forwarded garbage", headers: both, peer: trustedPeer,
			lines: []string{fwd + "\x7f;;=="}, want: "10.0.0.1"},

		// X-Real-IP.
		{name: "X-Real-IP", headers: []string{"X-Real-IP"}, peer: trustedPeer,
			lines: []string{xri + "198.51.100.1"}, want: "198.51.100.1"},
		{name: "X-Real-IP with port", headers: []string{"x-real-ip"}, peer: trustedPeer,
			lines: []string{xri + "[2001:db8::1]:443"}, want: "2001:db8::/64"},
		{name: "X-Real-IP last line", headers: []string{"X-Real-IP"}, peer: trustedPeer,
			lines: []string{xri + "192.0.2.66", xri + "198.51.100.1"}, want: "198.51.100.1"},
		{name: "X-Real-IP list is invalid", headers: []string{"X-Real-IP"}, peer: trustedPeer,
			lines: []string{xri + "192.0.2.66, 198.51.100.1"}, want: "10.0.0.1"},
		{name: "X-Real-IP garbage", headers: []string{"X-Real-IP"}, peer: trustedPeer,
			lines: []string{xri + "nope"}, want: "10.0.0.1"},
		{name: "empty Headers is the default", headers: []string{}, peer: trustedPeer,
			lines: []string{xff + "198.51.100.1", xri + "192.0.2.66"}, want: "198.51.100.1"},
		{name: "X-Real-IP not read by default", peer: trustedPeer,
			lines: []string{xri + "198.51.100.1"}, want: "10.0.0.1"},
		{name: "Forwarded not read by default", peer: trustedPeer,
			lines: []string{fwd + "for=198.51.100.1"}, want: "10.0.0.1"},

		// Preference between headers: the first present decides.
		{name: "first listed header wins", headers: both, peer: trustedPeer,
			lines: []string{xff + "198.51.100.2", fwd + "for=198.51.100.1"}, want: "198.51.100.1"},
		{name: "second header when the first is absent", headers: both, peer: trustedPeer,
			lines: []string{xff + "198.51.100.2"}, want: "198.51.100.2"},
		{name: "unusable first header does not fall through", headers: both, peer: trustedPeer,
			lines: []string{xff + "198.51.100.2", fwd + "for=unknown"}, want: "10.0.0.1"},
		{name: "unknown header name ignored", headers: []string{"X-Client-IP", "X-Forwarded-For"}, peer: trustedPeer,
			lines: []string{"X-Client-Ip: 192.0.2.66", xff + "198.51.100.1"}, want: "198.51.100.1"},

		// Grouping.
		{name: "IPv6 /128 disables grouping", v6: 128, peer: "[2001:db8::1]:4000", want: "2001:db8::1"},
		{name: "IPv6 /48", v6: 48, peer: "[2001:db8:1:2::1]:4000", want: "2001:db8:1::/48"},
		{name: "IPv4 /24", v4: 24, peer: trustedPeer, lines: []string{xff + "198.51.100.77"}, want: "198.51.100.0/24"},
		{name: "IPv4-mapped grouped as IPv4", v4: 24, v6: 128, peer: "[::ffff:198.51.100.77]:4000", want: "198.51.100.0/24"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &httplimit.ClientIP{Headers: tt.headers, IPv4Prefix: tt.v4, IPv6Prefix: tt.v6}
			switch tt.trust {
			case "":
				c.TrustedProxies = mustProxies(t, proxies)
			case "-":
			default:
				c.TrustedProxies = mustProxies(t, tt.trust)
			}
			if err := c.Validate(); err != nil && !strings.Contains(tt.name, "unknown header") {
				t.Fatal(err)
			}
			if got := resolveKey(t, c, request(tt.peer, tt.lines...)); got != tt.want {
				t.Errorf("key = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestResolveErrors(t *testing.T) {
	for _, peer := range []string{"", "@", "pipe", "example.com:80", "10.0.0.1:port", "[10.0.0.1]:80"} {
		c := &httplimit.ClientIP{}
		_, err := c.Resolve(request(peer))
		if !errors.Is(err, httplimit.ErrPeerAddress) {
			t.Errorf("RemoteAddr %q: err = %v, want ErrPeerAddress", peer, err)
		}
	}
	for _, c := range []*httplimit.ClientIP{{IPv6Prefix: 129}, {IPv6Prefix: -1}, {IPv4Prefix: 33}, {IPv4Prefix: -8}} {
		if _, err := c.Resolve(request("192.0.2.1:1")); !errors.Is(err, httplimit.ErrConfig) {
			t.Errorf("%+v: Resolve err = %v, want ErrConfig", c, err)
		}
		if err := c.Validate(); !errors.Is(err, httplimit.ErrConfig) {
			t.Errorf("%+v: Validate err = %v, want ErrConfig", c, err)
		}
	}
}

func TestValidate(t *testing.T) {
	good := &httplimit.ClientIP{
		TrustedProxies: mustProxies(t, proxies),
		Headers:        []string{"x-forwarded-for", "FORWARDED", "X-Real-IP"},
		IPv6Prefix:     56,
		IPv4Prefix:     24,
	}
	if err := good.Validate(); err != nil {
		t.Errorf("Validate = %v", err)
	}
	if err := (&httplimit.ClientIP{}).Validate(); err != nil {
		t.Errorf("zero Validate = %v", err)
	}
	bad := []*httplimit.ClientIP{
		{Headers: []string{"X-Client-IP"}},
		{TrustedProxies: []netip.Prefix{{}}},
		{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}},
	}
	for _, c := range bad {
		if err := c.Validate(); !errors.Is(err, httplimit.ErrConfig) {
			t.Errorf("%+v: Validate = %v, want ErrConfig", c, err)
		}
	}
}

func TestParseTrustedProxies(t *testing.T) {
	got, err := httplimit.ParseTrustedProxies(" 10.0.0.0/8, 192.168.1.1,::1 ,10.1.2.3/16, ::ffff:172.16.0.0/108, ::ffff:192.0.2.9, fe80::1%eth0")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.0/8", "192.168.1.1/32", "::1/128", "10.1.0.0/16", "172.16.0.0/12", "192.0.2.9/32", "fe80::1/128"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i].String() != want[i] {
			t.Errorf("[%d] = %s, want %s", i, got[i], want[i])
		}
	}
	for _, s := range []string{"", "  "} {
		if got, err := httplimit.ParseTrustedProxies(s); err != nil || got != nil {
			t.Errorf("ParseTrustedProxies(%q) = %v, %v; want nil, nil", s, got, err)
		}
	}
	for _, s := range []string{"10.0.0.0/33", "example.com", "10.0.0.1,", "10.0.0.1,,::1", "10.0.0.0/8/8", "1.2.3.4:80"} {
		if _, err := httplimit.ParseTrustedProxies(s); err == nil {
			t.Errorf("ParseTrustedProxies(%q): no error", s)
		}
	}
}

func TestKey(t *testing.T) {
	tests := []struct {
		p    netip.Prefix
		want string
	}{
		{netip.MustParsePrefix("192.0.2.1/32"), "192.0.2.1"},
		{netip.MustParsePrefix("192.0.2.0/24"), "192.0.2.0/24"},
		{netip.MustParsePrefix("2001:db8::1/128"), "2001:db8::1"},
		{netip.MustParsePrefix("2001:db8:1:2::/64"), "2001:db8:1:2::/64"},
		{netip.MustParsePrefix("2001:db8:1:2::9/64"), "2001:db8:1:2::/64"},
		{netip.Prefix{}, ""},
	}
	for _, tt := range tests {
		if got := httplimit.Key(tt.p); got != tt.want {
			t.Errorf("Key(%v) = %q, want %q", tt.p, got, tt.want)
		}
	}
}

// An IPv6 client rotating through its /64, directly or behind a trusted
// proxy, is one key; a neighbouring /64 is another.
func TestIPv6RotationSharesKey(t *testing.T) {
	c := &httplimit.ClientIP{TrustedProxies: mustProxies(t, proxies)}
	base := netip.MustParseAddr("2001:db8:1:2::").As16()
	other := netip.MustParseAddr("2001:db8:1:3::").As16()
	keys := map[string]int{}
	for i := range 1000 {
		a, b := base, other
		// Vary every interface-identifier byte.
		for j := 8; j < 16; j++ {
			a[j] = byte(i*(j+7) + j)
			b[j] = byte(i*(j+3) + j)
		}
		for _, addr := range []netip.Addr{netip.AddrFrom16(a), netip.AddrFrom16(b)} {
			direct := request(netip.AddrPortFrom(addr, 443).String())
			viaProxy := request("10.0.0.1:4000", "X-Forwarded-For: "+addr.String())
			keys[resolveKey(t, c, direct)]++
			keys[resolveKey(t, c, viaProxy)]++
		}
	}
	want := map[string]int{"2001:db8:1:2::/64": 2000, "2001:db8:1:3::/64": 2000}
	if len(keys) != len(want) || keys["2001:db8:1:2::/64"] != 2000 || keys["2001:db8:1:3::/64"] != 2000 {
		t.Errorf("keys = %v, want %v", keys, want)
	}
}
