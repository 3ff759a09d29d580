package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// The forwarding headers ClientIP can read, in their canonical form.
const (
	HeaderXForwardedFor = "X-Forwarded-For"
	HeaderForwarded     = "Forwarded"
	HeaderXRealIP       = "X-Real-Ip" // the canonical form of X-Real-IP
)

// Bounds on the work done for one request, whatever its headers hold.
const (
	// MaxHops is how many list elements (X-Forwarded-For entries or
	// Forwarded elements, empty ones included, across all header lines)
	// Resolve looks at, from the right, before it stops.
	MaxHops = 32

	// maxEntryLen is the longest X-Forwarded-For entry or X-Real-IP value,
	// optional whitespace included. The longest address with a port,
	// "[ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255%zone]:65535", is
	// about 60 bytes plus the zone.
	maxEntryLen = 128

	// maxElementLen is the longest Forwarded element, which may also carry
	// by=, proto= and host= parameters.
	maxElementLen = 512
)

// ErrPeerAddress is returned (wrapped) by [ClientIP.Resolve] when the
// request's RemoteAddr is not an IP address, with or without a port: a Unix
// socket listener, or a handler called with a hand-made request.
var ErrPeerAddress = errors.New("httplimit: peer address is not an IP address")

// ErrConfig is returned (wrapped) by [ClientIP.Validate], and by
// [ClientIP.Resolve] when a prefix length is out of range.
var ErrConfig = errors.New("httplimit: invalid ClientIP configuration")

// ClientIP says which proxies are trusted, which forwarding headers they set,
// and how client addresses are grouped. The zero value trusts no proxy and
// groups IPv6 clients by /64. A ClientIP must not be changed once in use; it
// is safe for concurrent use by many requests.
//
// # Which address is the client's
//
// Forwarding headers are honoured only when the immediate peer (the
// request's RemoteAddr) is in TrustedProxies; otherwise the peer's own
// address is the client's, whatever the request's headers say.
//
// When the peer is trusted, the first header in Headers that the request
// carries decides; later headers are not consulted even if the first yields
// nothing usable. X-Forwarded-For and Forwarded are lists, one element per
// hop, appended to by each proxy; all lines of the header are read as one
// list, in order. Resolve walks the list from the right, skipping addresses
// in TrustedProxies, and returns the first address that is not trusted: the
// right-most untrusted address, the first hop not under our control.
// Everything to the left of it may have been written by the client and is
// never read.
//
// The walk also stops, before it finds an untrusted address, when
//   - it reaches an element that is not an address: an invalid IP, garbage,
//     control characters, an element longer than 128 bytes (512 for
//     Forwarded), a Forwarded element without exactly one for= parameter, or
//     a Forwarded for= of "unknown" or an obfuscated identifier ("_hidden");
//   - it has looked at [MaxHops] elements;
//   - the list is exhausted (every address in it is trusted).
//
// In all three cases the client is the left-most address the walk accepted,
// that is the trusted hop furthest from us, whose view of its own client we
// cannot read; if the walk accepted none, it is the peer. So an unusable
// entry where the client's address should be makes the client "whoever is
// behind that trusted hop": a request can lose its precise identity this
// way, but it can never pick someone else's, because every address the walk
// accepts before stopping is in TrustedProxies. Empty list elements
// ("a,,b", a blank header line) are skipped but count towards MaxHops.
// Forwarded elements are split at every comma, even one inside a quoted
// value, so such an element fails to parse and stops the walk: the safe
// side again, and the price of reading a 1 MB header from its end alone.
//
// X-Real-IP is one address (with an optional port) set by the trusted proxy,
// taken as the client whether it is trusted or not; only its last line is
// read. If that is not a valid address the client is the peer.
//
// Addresses may carry ports ("192.0.2.1:5678", "[2001:db8::1]:443"); ports
// and IPv6 zones are dropped, and IPv4-mapped IPv6 addresses
// ("::ffff:192.0.2.1") are treated as IPv4, both when matching
// TrustedProxies and in the result.
type ClientIP struct {
	// TrustedProxies are the peers allowed to set forwarding headers, and
	// the addresses skipped when walking them. Empty means trust none: the
	// client is always the peer. Use IPv4 prefixes for IPv4 proxies (an
	// IPv4-mapped IPv6 prefix matches nothing); ParseTrustedProxies
	// converts them. Checked in order, so a long list costs a little per
	// request.
	TrustedProxies []netip.Prefix

	// Headers are the forwarding headers to read, in order of preference:
	// "X-Forwarded-For", "Forwarded" and "X-Real-IP" (any case); Resolve
	// ignores other names, Validate reports them. Empty means
	// X-Forwarded-For alone.
	//
	// List a header only if every trusted proxy sets it or appends to it:
	// one that a proxy passes through untouched is written by the client.
	// For that reason the default is the single header that
	// httputil.ReverseProxy, nginx, Envoy, HAProxy and the cloud load
	// balancers all append to, rather than a fallback chain, which a client
	// could use to supply the header its proxy does not set.
	Headers []string

	// IPv6Prefix groups IPv6 clients by this prefix length: every address
	// in one /64 is one client by default. 0 means 64; 128 disables
	// grouping.
	IPv6Prefix int

	// IPv4Prefix groups IPv4 clients by this prefix length. 0 means 32, no
	// grouping.
	IPv4Prefix int
}

// headerKind is a forwarding header Resolve knows how to read.
type headerKind uint8

const (
	unknownHeader headerKind = iota
	xForwardedFor
	forwarded
	xRealIP
)

func kindOf(name string) headerKind {
	switch {
	case strings.EqualFold(name, HeaderXForwardedFor):
		return xForwardedFor
	case strings.EqualFold(name, HeaderForwarded):
		return forwarded
	case strings.EqualFold(name, HeaderXRealIP):
		return xRealIP
	}
	return unknownHeader
}

// Validate reports an unknown header name, a prefix length out of range or
// an invalid trusted prefix. Resolve works without it, but a middleware
// should call it once when it is configured.
func (c *ClientIP) Validate() error {
	for _, h := range c.Headers {
		if kindOf(h) == unknownHeader {
			return fmt.Errorf("%w: header %q is not X-Forwarded-For, Forwarded or X-Real-IP", ErrConfig, h)
		}
	}
	for _, p := range c.TrustedProxies {
		if !p.IsValid() {
			return fmt.Errorf("%w: invalid trusted proxy prefix", ErrConfig)
		}
		if p.Addr().Is4In6() {
			return fmt.Errorf("%w: trusted proxy %s is IPv4-mapped; use the IPv4 form", ErrConfig, p)
		}
	}
	if _, _, err := c.prefixLens(); err != nil {
		return err
	}
	return nil
}

func (c *ClientIP) prefixLens() (v4, v6 int, err error) {
	v4, v6 = c.IPv4Prefix, c.IPv6Prefix
	if v4 == 0 {
		v4 = 32
	}
	if v6 == 0 {
		v6 = 64
	}
	if v4 < 0 || v4 > 32 {
		return 0, 0, fmt.Errorf("%w: IPv4Prefix %d is not between 0 and 32", ErrConfig, c.IPv4Prefix)
	}
	if v6 < 0 || v6 > 128 {
		return 0, 0, fmt.Errorf("%w: IPv6Prefix %d is not between 0 and 128", ErrConfig, c.IPv6Prefix)
	}
	return v4, v6, nil
}

// Resolve returns the client's address, masked to IPv4Prefix or IPv6Prefix
// (a /32 for an ungrouped IPv4 client), following the rules in the
// [ClientIP] documentation. It fails only when the peer address is unusable
// ([ErrPeerAddress]) or a prefix length is out of range ([ErrConfig]);
// forwarding headers, however malformed, never cause an error.
//
// Resolve reads at most [MaxHops] list elements of bounded length from the
// end of a header, so its cost does not grow with the header's size (a
// 1 MB X-Forwarded-For costs about as much as a short one), and it does not
// allocate unless it fails.
func (c *ClientIP) Resolve(r *http.Request) (netip.Prefix, error) {
	a, bits, err := c.resolve(r)
	if err != nil {
		return netip.Prefix{}, err
	}
	return a.Prefix(bits)
}

// resolve returns the client's address, ungrouped, and the prefix length
// that groups it.
func (c *ClientIP) resolve(r *http.Request) (netip.Addr, int, error) {
	v4, v6, err := c.prefixLens()
	if err != nil {
		return netip.Addr{}, 0, err
	}
	peer, ok := parsePeer(r.RemoteAddr)
	if !ok {
		return netip.Addr{}, 0, fmt.Errorf("%w: %q", ErrPeerAddress, r.RemoteAddr)
	}
	client := peer
	if c.trusted(peer) {
		client = c.fromHeaders(r.Header, peer)
	}
	if client.Is4() {
		return client, v4, nil
	}
	return client, v6, nil
}

// fromHeaders returns the client as the first configured header present
// tells it, or the peer when none is present.
func (c *ClientIP) fromHeaders(h http.Header, peer netip.Addr) netip.Addr {
	if len(c.Headers) == 0 {
		if lines := h[HeaderXForwardedFor]; len(lines) > 0 {
			return c.walk(lines, xForwardedFor, peer)
		}
		return peer
	}
	for _, name := range c.Headers {
		k := kindOf(name)
		var lines []string
		switch k {
		case xForwardedFor:
			lines = h[HeaderXForwardedFor]
		case forwarded:
			lines = h[HeaderForwarded]
		case xRealIP:
			lines = h[HeaderXRealIP]
		}
		if len(lines) == 0 {
			continue
		}
		if k == xRealIP {
			if a, ok := parseEntry(lines[len(lines)-1]); ok {
				return a
			}
			return peer
		}
		return c.walk(lines, k, peer)
	}
	return peer
}

// walk reads a list header (X-Forwarded-For or Forwarded) from the right and
// returns the right-most untrusted address, or else the left-most address it
// accepted, or else the peer. See ClientIP for when it stops.
func (c *ClientIP) walk(lines []string, k headerKind, peer netip.Addr) netip.Addr {
	maxLen := maxEntryLen
	if k == forwarded {
		maxLen = maxElementLen
	}
	client := peer
	hops := 0
	for i := len(lines) - 1; i >= 0; i-- {
		s := lines[i]
		for {
			if hops == MaxHops {
				return client
			}
			hops++
			// The last element of s starts after the last comma, which
			// must be within maxLen bytes of the end.
			start := max(0, len(s)-maxLen-1)
			comma := strings.LastIndexByte(s[start:], ',')
			if comma >= 0 {
				comma += start
			} else if start > 0 {
				return client // element too long
			}
			elem := s[comma+1:]
			if len(elem) > maxLen {
				return client
			}
			if trimOWS(elem) != "" {
				var a netip.Addr
				var ok bool
				if k == forwarded {
					a, ok = parseForwardedElement(elem)
				} else {
					a, ok = parseEntry(elem)
				}
				if !ok {
					return client
				}
				if !c.trusted(a) {
					return a
				}
				client = a
			}
			if comma < 0 {
				break
			}
			s = s[:comma]
		}
	}
	return client
}

func (c *ClientIP) trusted(a netip.Addr) bool {
	for _, p := range c.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// parsePeer parses a RemoteAddr: "ip:port", "[ipv6]:port" or a bare IP.
func parsePeer(s string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return normalize(ap.Addr()), true
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return normalize(a), true
	}
	return netip.Addr{}, false
}

// normalize drops the zone and unmaps IPv4-mapped IPv6 addresses.
func normalize(a netip.Addr) netip.Addr {
	return a.WithZone("").Unmap()
}

// parseEntry parses one X-Forwarded-For entry or X-Real-IP value, with
// optional surrounding whitespace: "192.0.2.1", "192.0.2.1:5678",
// "2001:db8::1", "[2001:db8::1]" or "[2001:db8::1]:443".
func parseEntry(s string) (netip.Addr, bool) {
	if len(s) > maxEntryLen {
		return netip.Addr{}, false
	}
	return parseNode(trimOWS(s), false)
}

// parseNode parses an address with an optional port. With obfPort, the port
// may also be an RFC 7239 obfuscated port ("_abc").
func parseNode(s string, obfPort bool) (netip.Addr, bool) {
	host := s
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return netip.Addr{}, false
		}
		host = s[1:end]
		if rest := s[end+1:]; rest != "" && (rest[0] != ':' || !validPort(rest[1:], obfPort)) {
			return netip.Addr{}, false
		}
	} else if i := strings.IndexByte(s, ':'); i >= 0 && strings.IndexByte(s[i+1:], ':') < 0 {
		// One colon: IPv4 with a port. More than one: bare IPv6.
		host = s[:i]
		if !validPort(s[i+1:], obfPort) {
			return netip.Addr{}, false
		}
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	if strings.HasPrefix(s, "[") && !a.Is6() {
		return netip.Addr{}, false // "[192.0.2.1]"
	}
	return normalize(a), true
}

// validPort reports whether s is a decimal port (0 to 65535) or, with
// obf, an obfuscated port: "_" followed by letters, digits, "." "_" "-".
func validPort(s string, obf bool) bool {
	if obf && len(s) > 1 && s[0] == '_' {
		return isObfChars(s[1:])
	}
	if len(s) == 0 || len(s) > 5 {
		return false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
		n = n*10 + int(s[i]-'0')
	}
	return n <= 65535
}

func isObfChars(s string) bool {
	for i := 0; i < len(s); i++ {
		b := s[i]
		if !('a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '.' || b == '_' || b == '-') {
			return false
		}
	}
	return true
}

// trimOWS trims HTTP optional whitespace (spaces and tabs) from both ends.
func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// parseForwardedElement returns the address in the for= parameter of one
// RFC 7239 forwarded-element: pairs separated by ";", each token=value where
// value is a token or a quoted-string. It fails on a malformed element, on
// a missing or repeated for=, and on a node that is not an address
// ("unknown", "_hidden").
func parseForwardedElement(s string) (netip.Addr, bool) {
	var node string
	seen := false
	for {
		s = trimOWS(s)
		eq := strings.IndexByte(s, '=')
		if eq <= 0 || !isToken(s[:eq]) {
			return netip.Addr{}, false
		}
		name := s[:eq]
		s = s[eq+1:]
		var value string
		if strings.HasPrefix(s, `"`) {
			var ok bool
			value, s, ok = cutQuoted(s)
			if !ok {
				return netip.Addr{}, false
			}
		} else {
			end := strings.IndexByte(s, ';')
			if end < 0 {
				end = len(s)
			}
			value, s = trimOWS(s[:end]), s[end:]
			if !isNodeChars(value) {
				return netip.Addr{}, false
			}
		}
		if strings.EqualFold(name, "for") {
			if seen {
				return netip.Addr{}, false
			}
			seen, node = true, value
		}
		s = trimOWS(s)
		if s == "" {
			break
		}
		if s[0] != ';' {
			return netip.Addr{}, false
		}
		s = s[1:]
	}
	if !seen {
		return netip.Addr{}, false
	}
	return parseNode(node, true)
}

// cutQuoted splits a leading quoted-string off s, returning its content.
// Quoted pairs ("\x") are only accepted where they cannot be part of an
// address, so a content with a backslash is returned as is and fails to
// parse as a node.
func cutQuoted(s string) (content, rest string, ok bool) {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return s[1:i], s[i+1:], true
		}
	}
	return "", "", false
}

// isToken reports whether s is a non-empty RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(b)) {
			return false
		}
	}
	return true
}

// isNodeChars reports whether an unquoted value holds only the bytes of a
// token, plus ":" "[" "]" which some proxies leave unquoted around IPv6.
func isNodeChars(s string) bool {
	for i := 0; i < len(s); i++ {
		if b := s[i]; b != ':' && b != '[' && b != ']' && !isToken(s[i:i+1]) {
			return false
		}
	}
	return true
}

// ParseTrustedProxies parses a comma-separated list of CIDR prefixes and
// single IP addresses, such as "10.0.0.0/8, 192.168.1.1, ::1", for
// [ClientIP.TrustedProxies]. A single address becomes a /32 or /128; a
// prefix with host bits set ("10.1.2.3/8") is masked; zones are dropped and
// IPv4-mapped IPv6 addresses and prefixes become IPv4. An empty or blank
// string gives none; an empty element between commas is an error.
func ParseTrustedProxies(s string) ([]netip.Prefix, error) {
	if trimOWS(s) == "" {
		return nil, nil
	}
	var out []netip.Prefix
	for elem := range strings.SplitSeq(s, ",") {
		elem = strings.TrimSpace(elem)
		p, err := parseTrusted(elem)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

func parseTrusted(s string) (netip.Prefix, error) {
	if s == "" {
		return netip.Prefix{}, errors.New("httplimit: empty trusted proxy in list")
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("httplimit: trusted proxy %q: %w", s, err)
		}
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("httplimit: trusted proxy %q: %w", s, err)
	}
	a = normalize(a)
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// Key returns the form of a resolved client address used as a limit key and
// as the value of Envoy's remote_address descriptor: the bare address for a
// single host ("192.0.2.1", "2001:db8::1" with IPv6Prefix 128), and the
// masked prefix in CIDR form for a group ("2001:db8:1:2::/64",
// "192.0.2.0/24"). The form is that of netip's String methods (RFC 5952 for
// IPv6) and is stable. The zero Prefix gives "".
func Key(p netip.Prefix) string {
	var buf [64]byte // the longest, "ffff:…:ffff/128", is 43 bytes
	return string(appendKey(buf[:0], p))
}

// appendKey appends [Key] of p to b, for callers that build a key without
// allocating.
func appendKey(b []byte, p netip.Prefix) []byte {
	if !p.IsValid() {
		return b
	}
	if p.IsSingleIP() {
		return p.Addr().AppendTo(b)
	}
	return p.Masked().AppendTo(b)
}
