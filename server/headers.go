package server

import (
	"errors"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/sluicehq/sluice"
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

// maxHeaderSeconds caps every number of seconds in a header (ten years).
const maxHeaderSeconds = 10 * 366 * 24 * 3600

// seconds is d in whole seconds, rounded up, as a header value. A duration
// of sluice.Never (a request that no wait can admit under the limit: a
// cost above the burst, a zero limit) becomes the limit's period, after
// which the limit may have been changed.
func seconds(d, period time.Duration) int64 {
	if d >= sluice.Never {
		d = period
	}
	if d <= 0 {
		return 0
	}
	s := int64((d + time.Second - 1) / time.Second)
	return min(s, maxHeaderSeconds)
}

// headerValues builds the rate limit headers of o. over is the response's
// overall code; shadow-mode limits, which never deny, are not advertised.
func (s *Server) headerValues(o *rls.Outcome, over bool) []*corev3.HeaderValue {
	// The deciding limit: the one that denied, else the enforced limit
	// with the least quota left (the later reset on a tie).
	deciding := -1
	if !o.Overall.Allowed && o.Overall.Index >= 0 && o.Overall.Index < len(o.Limits) && !o.Limits[o.Overall.Index].Limit.Shadow {
		deciding = o.Overall.Index
	} else {
		for i := range o.Limits {
			l := &o.Limits[i]
			if l.Limit.Shadow {
				continue
			}
			if deciding < 0 {
				deciding = i
				continue
			}
			b := &o.Limits[deciding].Decision
			if l.Decision.Remaining < b.Remaining || (l.Decision.Remaining == b.Remaining && l.Decision.ResetAfter > b.ResetAfter) {
				deciding = i
			}
		}
	}
	if deciding < 0 {
		return nil
	}
	dl := &o.Limits[deciding]
	reset := seconds(dl.Decision.ResetAfter, dl.Limit.Period)

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
	var b []byte
	if s.headers&HeadersIETF != 0 {
		b = make([]byte, 0, 64)
		first := true
		for i := range o.Limits {
			l := o.Limits[i].Limit
			if l.Shadow || listed(o.Limits[:i], l) {
				continue
			}
			if !first {
				b = append(b, ", "...)
			}
			first = false
			b = appendSFString(b, l.Name)
			b = append(b, ";q="...)
			b = strconv.AppendInt(b, l.Nominal(), 10)
			b = append(b, ";w="...)
			b = strconv.AppendInt(b, seconds(l.Period, l.Period), 10)
		}
		add("RateLimit-Policy", string(b))
		b = appendSFString(b[:0], dl.Limit.Name)
		b = append(b, ";r="...)
		b = strconv.AppendInt(b, dl.Decision.Remaining, 10)
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, reset, 10)
		add("RateLimit", string(b))
	}
	if s.headers&HeadersXRateLimit != 0 {
		add("X-RateLimit-Limit", strconv.FormatInt(dl.Decision.Limit, 10))
		add("X-RateLimit-Remaining", strconv.FormatInt(dl.Decision.Remaining, 10))
		add("X-RateLimit-Reset", strconv.FormatInt(reset, 10))
	}
	if retry {
		// The overall decision's wait, never shorter than the deciding
		// limit's.
		wait := seconds(o.Overall.RetryAfter, dl.Limit.Period)
		wait = max(wait, seconds(dl.Decision.RetryAfter, dl.Limit.Period), 1)
		add("Retry-After", strconv.FormatInt(wait, 10))
	}
	return out
}

// listed reports whether a limit of the same name as l, an enforced one,
// is in ls: the policy names each limit once.
func listed(ls []rls.LimitOutcome, l *sluice.Limit) bool {
	for i := range ls {
		if x := ls[i].Limit; !x.Shadow && (x == l || x.Name == l.Name) {
			return true
		}
	}
	return false
}

// appendSFString appends s as a structured field string (RFC 8941): in
// quotes, with quotes and backslashes escaped, and bytes outside printable
// ASCII, which it cannot hold, replaced by '?'.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '?')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
