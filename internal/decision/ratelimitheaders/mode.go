package ratelimitheaders

import (
	"errors"
	"strconv"
	"strings"
)

// HeaderMode selects the families of rate limit headers a front door sends:
// a bit set of HeadersIETF, HeadersXRateLimit and HeadersRetryAfter, or
// HeadersNone. Its zero value means the front door's default, which each
// documents (httplimit and sluice proxy: HeadersAll; the rate limit
// service: none, as Envoy's by default); With reads it.
type HeaderMode uint8

const (
	// HeadersIETF is the RateLimit-Policy and RateLimit fields of the IETF
	// draft (draft-ietf-httpapi-ratelimit-headers, -08 and later syntax):
	//	RateLimit-Policy: "name";q=100;w=60, "other";q=1000;w=86400
	//	RateLimit: "name";r=50;t=30
	// The policy lists every enforced limit of the request with its quota
	// q and window w in seconds (Window); RateLimit gives the deciding
	// limit's remaining quota r and the seconds t until more is available
	// (Reset), as drafts -10 and -11 define t.
	HeadersIETF HeaderMode = 1 << iota
	// HeadersXRateLimit is X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset (the same seconds as the RateLimit field's t).
	HeadersXRateLimit
	// HeadersRetryAfter is Retry-After (whole seconds, rounded up) on
	// denials, never earlier than the RateLimit field's t.
	HeadersRetryAfter
	// HeadersNone is no rate limit header at all, whatever the default.
	HeadersNone

	// HeadersAll is every family.
	HeadersAll = HeadersIETF | HeadersXRateLimit | HeadersRetryAfter
)

// With returns the families m selects: def when m is zero, none (0) for
// HeadersNone, else m.
func (m HeaderMode) With(def HeaderMode) HeaderMode {
	switch m {
	case 0:
		return def
	case HeadersNone:
		return 0
	}
	return m
}

// Validate reports a mode that is neither a combination of the families
// nor HeadersNone alone.
func (m HeaderMode) Validate() error {
	if m&^(HeadersAll|HeadersNone) != 0 || m&HeadersNone != 0 && m != HeadersNone {
		return errors.New("rate limit headers " + strconv.Itoa(int(m)) + " are not a combination of HeadersIETF, HeadersXRateLimit and HeadersRetryAfter, or HeadersNone")
	}
	return nil
}

var headerModeNames = []struct {
	name string
	mode HeaderMode
}{
	{"ietf", HeadersIETF},
	{"x-ratelimit", HeadersXRateLimit},
	{"retry-after", HeadersRetryAfter},
}

// ParseHeaderMode parses a comma-separated list of the names
// ParseHeaderFamily reads ("ietf", "x-ratelimit", "retry-after", "all"),
// or "off" or "none" alone (HeadersNone; also the empty string). Case and
// spaces around names do not matter.
func ParseHeaderMode(s string) (HeaderMode, error) {
	if strings.TrimSpace(s) == "" {
		return HeadersNone, nil
	}
	parts := strings.Split(s, ",")
	var m HeaderMode
	for _, part := range parts {
		f, ok := ParseHeaderFamily(part)
		switch {
		case !ok:
			return 0, errors.New("unknown rate limit headers " + strconv.Quote(strings.TrimSpace(part)) + ": want off, all, or a comma-separated list of ietf, x-ratelimit, retry-after")
		case f == HeadersNone && len(parts) > 1:
			return 0, errors.New("rate limit headers " + strconv.Quote(strings.TrimSpace(part)) + " must be alone")
		}
		m |= f
	}
	return m, nil
}

// ParseHeaderFamily parses one item of a list of header families, as a
// rules file's http headers holds them: "ietf", "x-ratelimit",
// "retry-after", "all", or "none" or "off" (HeadersNone, which a list
// must hold alone). Case and spaces around the name do not matter.
func ParseHeaderFamily(name string) (HeaderMode, bool) {
	switch strings.ToLower(strings.TrimSpace(name)) {
	case "none", "off":
		return HeadersNone, true
	case "all":
		return HeadersAll, true
	}
	return family(name)
}

// family returns the one family name spells.
func family(name string) (HeaderMode, bool) {
	name = strings.ToLower(strings.TrimSpace(name))
	for _, n := range headerModeNames {
		if n.name == name {
			return n.mode, true
		}
	}
	return 0, false
}

// String spells m as ParseHeaderMode reads it ("default" for zero).
func (m HeaderMode) String() string {
	switch m {
	case 0:
		return "default"
	case HeadersNone:
		return "off"
	case HeadersAll:
		return "all"
	}
	var b strings.Builder
	for _, n := range headerModeNames {
		if m&n.mode != 0 {
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			b.WriteString(n.name)
		}
	}
	if rest := m &^ HeadersAll; rest != 0 {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString("HeaderMode(" + strconv.Itoa(int(rest)) + ")")
	}
	return b.String()
}

// Set parses s into m, for the flag package.
func (m *HeaderMode) Set(s string) error {
	v, err := ParseHeaderMode(s)
	if err != nil {
		return err
	}
	*m = v
	return nil
}
