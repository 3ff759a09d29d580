package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/textproto"
	"strings"
	"unicode/utf8"

	"github.com/sluicehq/sluice/rules"
)

// Bounds on the values a request contributes to its descriptors.
const (
	// MaxHeaderValueLen is the longest value that Header, APIKey or
	// Country take from a request header, in bytes. A longer value makes
	// the request invalid (see [Descriptor]).
	MaxHeaderValueLen = 256

	// MaxPathLen is the longest path (or method) that Path (or Method)
	// takes from a request, in bytes: the longest descriptor value the
	// rules accept ([rules.MaxEntryLen]).
	MaxPathLen = rules.MaxEntryLen

	// MaxDescriptors is the most descriptors a Config may list.
	MaxDescriptors = 16

	// MaxEntries is the most entries one Descriptor may have.
	MaxEntries = 8
)

// Descriptor is how one RLS descriptor is built from a request: its
// entries, in order. A rules file matches it as it matches the descriptor
// Envoy sends for the same rate limit actions.
//
// # Values taken from the request
//
// Values go into the descriptor as they are (the rules length-prefix them
// in counter keys, so no value can be mistaken for another), with these
// exceptions, decided per entry:
//
//   - absent: a [Header] or [APIKey] whose header the request does not
//     carry or carries empty, and a [Country] whose header is absent or
//     not two ASCII letters, and a [Located] value its Locator does not
//     know (an address missing from a GeoIP database, a private one),
//     skip the whole descriptor for that request,
//     as Envoy's request_headers action does: the request is not counted
//     against that descriptor's limits, and is still counted against the
//     other descriptors'.
//   - invalid: a Header or APIKey value longer than [MaxHeaderValueLen]
//     bytes, holding a control character (a byte below 0x20, or 0x7f) or
//     invalid UTF-8, or sent on more than one header line; and a Path or
//     Method longer than [MaxPathLen] bytes, with a control character or
//     invalid UTF-8. The request is answered 400 with a problem+json body
//     ([ProblemInvalidRequest]), the handler is not called and no limit
//     is charged. Rejecting, rather than skipping the descriptor, keeps a
//     client from escaping a per-key limit by sending garbage, and keeps
//     enormous values out of counter keys; refusing a repeated header
//     keeps a client from being counted under one line while the
//     application reads another.
type Descriptor []Entry

// Entry is one entry of a Descriptor: the descriptor key the rules match
// and the Source of its value. An empty Key means the default key of the
// Source (see each Source).
type Entry struct {
	Key    string
	Source Source
}

// Source produces the value of a descriptor entry from a request. Make one
// with RemoteAddress, Header, APIKey, Method, Path, Country, Const, KeyFunc
// or Located; the zero Source is invalid.
type Source struct {
	kind   sourceKind
	header string // canonical header name, or the Const value
	fn     func(*http.Request) (string, error)
	loc    Locator
}

type sourceKind uint8

const (
	noSource sourceKind = iota
	remoteAddress
	header
	apiKey
	country
	method
	path
	constant
	function
	located
)

var defaultKeys = [...]string{
	remoteAddress: "remote_address",
	header:        "", // the header name
	apiKey:        "api_key",
	country:       "country",
	method:        "method",
	path:          "path",
	constant:      "generic_key",
	function:      "key",
	located:       "location",
}

// RemoteAddress is the client's address as Config.ClientIP resolves it, in
// the form of [Key]: Envoy's remote_address action. Default key
// "remote_address".
func RemoteAddress() Source { return Source{kind: remoteAddress} }

// Header is the value of the request header name, as Envoy's
// request_headers action; see [Descriptor] for when it is absent or
// invalid. Default key: name as given.
func Header(name string) Source { return Source{kind: header, header: name} }

// APIKey is Header for a header carrying an API key or another client
// credential (Authorization, X-API-Key): one limit per key. The value is
// only counted, never checked: authenticate before, or limit by it only
// when a wrong key costs the client nothing but its own quota. Default key
// "api_key".
func APIKey(name string) Source { return Source{kind: apiKey, header: name} }

// credential is an API key header's value in one spelling of the many an
// API takes for it: an authorization scheme is read in any case and with
// any spacing (RFC 9110), so "bearer K" and "Bearer  K" are "Bearer K",
// one key, not a fresh quota for each spelling (Bearer, Basic, Token and
// Digest so spelled, any other scheme in lower case).
func credential(v string) string {
	// A value holds no tab or other control character: checkValue
	// refused it before.
	scheme, rest, ok := strings.Cut(v, " ")
	if !ok {
		return v
	}
	rest = strings.Trim(rest, " ")
	if rest == "" || strings.Contains(rest, " ") || !validScheme(scheme) {
		return v
	}
	canonical := strings.ToLower(scheme)
	for _, c := range [...]string{"Bearer", "Basic", "Token", "Digest"} {
		if strings.EqualFold(scheme, c) {
			canonical = c
		}
	}
	return canonical + " " + rest
}

// validScheme reports whether s is an authorization scheme: a token of
// letters, digits and -._~+.
func validScheme(s string) bool {
	for _, c := range []byte(s) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~+", c) >= 0) {
			return false
		}
	}
	return s != ""
}

// Method is the request method. Default key "method".
func Method() Source { return Source{kind: method} }

// Path is the request's URL path, decoded, without the query ("/" when
// empty): with Method, per-endpoint limits. Default key "path". Rules can
// match it exactly or with a wildcard ("/v1/users/*").
func Path() Source { return Source{kind: path} }

// Country is a country code from the header name set by a CDN or load
// balancer (CF-IPCountry, CloudFront-Viewer-Country, X-Country-Code): two
// ASCII letters, upper-cased. Any other value (Cloudflare's "T1" for Tor,
// an empty or garbage header) is absent: the descriptor is skipped. Only
// trust it when the proxy in front always sets it. Default key "country".
func Country(name string) Source { return Source{kind: country, header: name} }

// Const is the fixed value v, as Envoy's generic_key action: one limit
// shared by every request that reaches the descriptor. Default key
// "generic_key".
func Const(v string) Source { return Source{kind: constant, header: v} }

// KeyFunc is the value f returns for the request: any key the
// application knows (a user id from the session, a tenant from the path).
// An empty value is absent (the descriptor is skipped: not limited); an
// error, or a value that Header would refuse (longer than
// MaxHeaderValueLen bytes, a control character, invalid UTF-8), makes the
// request invalid (400, see [Descriptor]), with the error's text in the
// problem's detail. f must be safe for concurrent use. Default key "key".
func KeyFunc(f func(*http.Request) (string, error)) Source {
	return Source{kind: function, fn: f}
}

// Locator maps a client address to a value: its country from a GeoIP
// database, its autonomous system number, its network's name. Locate
// returns "" when it knows none. It is called on every request of a
// Located entry, so it must be fast, must not block (a database being
// reloaded keeps answering from the one in force), and must be safe for
// concurrent use.
type Locator interface {
	Locate(addr netip.Addr) string
}

// Located is the value l gives for the client's address as Config.ClientIP
// resolves it (trusted proxies and forwarding headers; never a header a
// client could set itself), before IPv4Prefix and IPv6Prefix group it,
// IPv4-mapped addresses as IPv4. An empty value, and one that Header would
// refuse (longer than MaxHeaderValueLen bytes, a control character,
// invalid UTF-8), is absent: the descriptor is skipped, as for Country,
// since the request did not choose it. Default key "location": name the
// key the rules match, such as "country" or "asn".
func Located(l Locator) Source { return Source{kind: located, loc: l} }

// entry is an Entry compiled by New.
type entry struct {
	key  string
	kind sourceKind
	arg  string // the canonical header name, or the Const value
	fn   func(*http.Request) (string, error)
	loc  Locator
}

// compile checks d and returns its compiled entries.
func compile(i int, d Descriptor) ([]entry, error) {
	if len(d) == 0 {
		return nil, fmt.Errorf("%w: descriptor %d has no entries", ErrConfig, i)
	}
	if len(d) > MaxEntries {
		return nil, fmt.Errorf("%w: descriptor %d has %d entries (at most %d)", ErrConfig, i, len(d), MaxEntries)
	}
	out := make([]entry, len(d))
	for j, e := range d {
		s := e.Source
		c := entry{key: e.Key, kind: s.kind, arg: s.header, fn: s.fn, loc: s.loc}
		switch s.kind {
		case noSource:
			return nil, fmt.Errorf("%w: descriptor %d entry %d has no Source", ErrConfig, i, j)
		case function:
			if s.fn == nil {
				return nil, fmt.Errorf("%w: descriptor %d entry %d: KeyFunc of a nil function", ErrConfig, i, j)
			}
		case located:
			if s.loc == nil {
				return nil, fmt.Errorf("%w: descriptor %d entry %d: Located by a nil Locator", ErrConfig, i, j)
			}
		case header, apiKey, country:
			if !isToken(s.header) {
				return nil, fmt.Errorf("%w: descriptor %d entry %d: %q is not a header name", ErrConfig, i, j, s.header)
			}
			c.arg = textproto.CanonicalMIMEHeaderKey(s.header)
		case constant:
			if err := checkValue(s.header, rules.MaxEntryLen); err != nil || s.header == "" {
				return nil, fmt.Errorf("%w: descriptor %d entry %d: Const value %q is empty, too long or not printable", ErrConfig, i, j, s.header)
			}
		}
		if c.key == "" {
			c.key = defaultKeys[s.kind]
			if s.kind == header {
				c.key = s.header
			}
		}
		if len(c.key) > rules.MaxEntryLen {
			return nil, fmt.Errorf("%w: descriptor %d entry %d: key longer than %d bytes", ErrConfig, i, j, rules.MaxEntryLen)
		}
		out[j] = c
	}
	return out, nil
}

// errValue is why a request value is invalid; it never leaves the package
// with the value in it.
var errValue = errors.New("invalid value")

// checkValue reports a value longer than maxLen, with a control character
// or invalid UTF-8.
func checkValue(v string, maxLen int) error {
	if len(v) > maxLen {
		return errValue
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c == 0x7f {
			return errValue
		}
	}
	if !utf8.ValidString(v) {
		return errValue
	}
	return nil
}

// needsClient reports whether e reads the resolved client address.
func (e *entry) needsClient() bool { return e.kind == remoteAddress || e.kind == located }

// value returns the value of e for r, with ok false when the descriptor is
// skipped (absent) and err set when the request is invalid. s holds the
// resolved client, for RemoteAddress and Located.
func (e *entry) value(r *http.Request, s *scratch) (v string, ok bool, err error) {
	switch e.kind {
	case remoteAddress:
		return s.client, true, nil
	case located:
		v := e.loc.Locate(s.addr)
		if v == "" || checkValue(v, MaxHeaderValueLen) != nil {
			return "", false, nil
		}
		return v, true, nil
	case header, apiKey:
		return e.headerValue(r)
	case country:
		lines := r.Header[e.arg]
		if len(lines) != 1 || !isCountry(lines[0]) {
			return "", false, nil
		}
		return strings.ToUpper(lines[0]), true, nil
	case method:
		if checkValue(r.Method, MaxPathLen) != nil {
			return "", false, errors.New("method: too long or not printable UTF-8")
		}
		return r.Method, true, nil
	case path:
		p := r.URL.Path
		if p == "" {
			p = "/"
		}
		if checkValue(p, MaxPathLen) != nil {
			return "", false, fmt.Errorf("path: longer than %d bytes, or not printable UTF-8", MaxPathLen)
		}
		return p, true, nil
	case function:
		return e.funcValue(r)
	}
	return e.arg, true, nil // constant
}

// headerValue is the value of the header e names: absent or empty, none;
// sent twice, or too long, an error.
func (e *entry) headerValue(r *http.Request) (v string, ok bool, err error) {
	lines := r.Header[e.arg]
	if len(lines) == 0 || len(lines) == 1 && lines[0] == "" {
		return "", false, nil
	}
	if len(lines) > 1 {
		return "", false, fmt.Errorf("header %s sent more than once", e.arg)
	}
	if checkValue(lines[0], MaxHeaderValueLen) != nil {
		return "", false, fmt.Errorf("header %s: longer than %d bytes, or not printable UTF-8", e.arg, MaxHeaderValueLen)
	}
	if e.kind == apiKey {
		return credential(lines[0]), true, nil
	}
	return lines[0], true, nil
}

// funcValue is the value of e's KeyFunc: empty, none.
func (e *entry) funcValue(r *http.Request) (v string, ok bool, err error) {
	v, err = e.fn(r)
	if err != nil {
		return "", false, fmt.Errorf("key: %w", err)
	}
	if v == "" {
		return "", false, nil
	}
	if checkValue(v, MaxHeaderValueLen) != nil {
		return "", false, fmt.Errorf("key: longer than %d bytes, or not printable UTF-8", MaxHeaderValueLen)
	}
	return v, true, nil
}

func isCountry(s string) bool {
	if len(s) != 2 {
		return false
	}
	for i := 0; i < 2; i++ {
		if c := s[i] | 0x20; c < 'a' || c > 'z' {
			return false
		}
	}
	return true
}
