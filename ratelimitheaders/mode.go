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
	// draft (draft-ietf-httpapi-ratelimit-headers, -08 and later):
	//	RateLimit-Policy: "name";q=100;w=60, "other";q=1000;w=86400
	//	RateLimit: "name";r=50;t=30
	// The policy lists every enforced limit of the request with its quota
	// q and window w in seconds; RateLimit gives the deciding limit's
	// remaining quota r and the seconds t until it resets.
	HeadersIETF HeaderMode = 1 << iota
	// HeadersXRateLimit is X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset (seconds until the deciding limit resets).
	HeadersXRateLimit
	// HeadersRetryAfter is Retry-After (whole seconds, rounded up) on
	// denials.
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

// ParseHeaderMode parses a comma-separated list of "ietf", "x-ratelimit"
// and "retry-after", or "all", or "off" or "none" (HeadersNone; also the
// empty string). Case and spaces around names do not matter.
func ParseHeaderMode(s string) (HeaderMode, error) {
	s = strings.TrimSpace(s)
	switch strings.ToLower(s) {
	case "", "off", "none":
		return HeadersNone, nil
	case "all":
		return HeadersAll, nil
	}
	var m HeaderMode
	for part := range strings.SplitSeq(s, ",") {
		name := strings.ToLower(strings.TrimSpace(part))
		found := false
		for _, n := range headerModeNames {
			if n.name == name {
				m |= n.mode
				found = true
			}
		}
		if !found {
			return 0, errors.New("unknown rate limit headers " + strconv.Quote(strings.TrimSpace(part)) + ": want off, all, or a comma-separated list of ietf, x-ratelimit, retry-after")
		}
	}
	return m, nil
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
