package server

import (
	"errors"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/sluicehq/sluice/internal/ratelimitheaders"
	"github.com/sluicehq/sluice/rls"
)

// HeaderMode selects the rate limit headers a response carries, in the
// RateLimitResponse's response_headers_to_add (which Envoy adds to the
// client's response) and on the HTTP /json response. It is a bit set; the
// zero value adds none, as Envoy's rate limit service by default.
type HeaderMode uint8

const (
	// HeadersIETF adds the RateLimit-Policy and RateLimit fields of the
	// IETF draft (draft-ietf-httpapi-ratelimit-headers, -08 and later):
	//	RateLimit-Policy: "name";q=100;w=60, "other";q=1000;w=86400
	//	RateLimit: "name";r=50;t=30
	// The policy lists every enforced limit of the request with its quota
	// q and window w in seconds; RateLimit gives the deciding limit's
	// remaining quota r and seconds until it resets t.
	HeadersIETF HeaderMode = 1 << iota
	// HeadersXRateLimit adds X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset (seconds until the deciding limit resets).
	HeadersXRateLimit
	// HeadersRetryAfter adds Retry-After (whole seconds, rounded up) to
	// OVER_LIMIT responses.
	HeadersRetryAfter

	// HeadersAll is every header.
	HeadersAll = HeadersIETF | HeadersXRateLimit | HeadersRetryAfter
)

var headerModeNames = []struct {
	name string
	mode HeaderMode
}{
	{"ietf", HeadersIETF},
	{"x-ratelimit", HeadersXRateLimit},
	{"retry-after", HeadersRetryAfter},
}

// ParseHeaderMode parses a comma-separated list of "ietf", "x-ratelimit"
// and "retry-after", or "all", or "off" (also the empty string). Case and
// spaces around names do not matter.
func ParseHeaderMode(s string) (HeaderMode, error) {
	s = strings.TrimSpace(s)
	switch strings.ToLower(s) {
	case "", "off", "none":
		return 0, nil
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

// String spells m as ParseHeaderMode reads it.
func (m HeaderMode) String() string {
	switch m {
	case 0:
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

// headerValues builds the rate limit headers of o (see the
// ratelimitheaders package). over is the response's overall code;
// shadow-mode limits, which never deny, are not advertised.
func (s *Server) headerValues(o *rls.Outcome, over bool) []*corev3.HeaderValue {
	deciding := ratelimitheaders.Deciding(&o.Outcome)
	if deciding < 0 {
		return nil
	}
	dl := &o.Limits[deciding]

	n := 0
	if s.headers&HeadersIETF != 0 {
		n += 2
	}
	if s.headers&HeadersXRateLimit != 0 {
		n += 3
	}
	retry := over && s.headers&HeadersRetryAfter != 0
	if retry {
		n++
	}
	hvs := make([]corev3.HeaderValue, n)
	out := make([]*corev3.HeaderValue, 0, n)
	add := func(k, v string) {
		h := &hvs[len(out)]
		h.Key, h.Value = k, v
		out = append(out, h)
	}
	if s.headers&HeadersIETF != 0 {
		b := ratelimitheaders.AppendPolicy(make([]byte, 0, 64), o.Limits)
		add("RateLimit-Policy", string(b))
		add("RateLimit", string(ratelimitheaders.AppendRateLimit(b[:0], dl)))
	}
	if s.headers&HeadersXRateLimit != 0 {
		add("X-RateLimit-Limit", strconv.FormatInt(dl.Decision.Limit, 10))
		add("X-RateLimit-Remaining", strconv.FormatInt(dl.Decision.Remaining, 10))
		add("X-RateLimit-Reset", strconv.FormatInt(ratelimitheaders.Reset(dl), 10))
	}
	if retry {
		add("Retry-After", strconv.FormatInt(ratelimitheaders.RetryAfter(&o.Outcome, dl), 10))
	}
	return out
}
