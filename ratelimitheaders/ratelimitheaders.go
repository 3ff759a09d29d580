// Package ratelimitheaders formats the rate limit response header values of
// a decide.Outcome: the IETF RateLimit-Policy and RateLimit fields
// (draft-ietf-httpapi-ratelimit-headers, -08 and later), X-RateLimit-* and
// Retry-After. It owns the choice of the deciding limit and the rounding of
// seconds, so that every front door (the server's response_headers_to_add,
// httplimit's http.Header) tells clients the same thing, and the one
// HeaderMode with which each front door is told which families to send.
// It only formats: it imports the root package and decide, never a
// transport or a store.
package ratelimitheaders

import (
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
)

// MaxSeconds caps every number of seconds in a header (ten years).
const MaxSeconds = 10 * 366 * 24 * 3600

// Seconds is d in whole seconds, rounded up, as a header value. A duration
// of sluice.Never (a request that no wait can admit under the limit: a
// cost above the burst, a zero limit) becomes the limit's period, after
// which the limit may have been changed.
func Seconds(d, period time.Duration) int64 {
	if d >= sluice.Never {
		d = period
	}
	if d <= 0 {
		return 0
	}
	s := int64((d + time.Second - 1) / time.Second)
	return min(s, MaxSeconds)
}

// Deciding returns the index in o.Limits of the limit the headers describe,
// or -1 when there is none: the limit that denied, else the enforced limit
// with the least quota left (the later reset on a tie). Shadow-mode
// limits, which never deny, are not advertised.
func Deciding(o *decide.Outcome) int {
	deciding := -1
	if !o.Overall.Allowed && o.Overall.Index >= 0 && o.Overall.Index < len(o.Limits) && !o.Limits[o.Overall.Index].Limit.Shadow {
		return o.Overall.Index
	}
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
	return deciding
}

// Reset is the X-RateLimit-Reset and RateLimit t value of the deciding
// limit dl: seconds until it resets, rounded up.
func Reset(dl *decide.LimitOutcome) int64 {
	return Seconds(dl.Decision.ResetAfter, dl.Limit.Period)
}

// RetryAfter is the Retry-After of a denied request whose deciding limit
// is dl: the overall decision's wait, never shorter than the deciding
// limit's, rounded up, and at least 1.
func RetryAfter(o *decide.Outcome, dl *decide.LimitOutcome) int64 {
	wait := Seconds(o.Overall.RetryAfter, dl.Limit.Period)
	return max(wait, Seconds(dl.Decision.RetryAfter, dl.Limit.Period), 1)
}

// AppendPolicy appends the RateLimit-Policy value of ls: every enforced
// limit once (by name), with its quota q and window w in seconds:
//
//	"name";q=100;w=60, "other";q=1000;w=86400
func AppendPolicy(b []byte, ls []decide.LimitOutcome) []byte {
	first := true
	for i := range ls {
		l := ls[i].Limit
		if l.Shadow || listed(ls[:i], l) {
			continue
		}
		if !first {
			b = append(b, ", "...)
		}
		first = false
		b = AppendSFString(b, l.Name)
		b = append(b, ";q="...)
		b = strconv.AppendInt(b, l.Nominal(), 10)
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, Seconds(l.Period, l.Period), 10)
	}
	return b
}

// AppendRateLimit appends the RateLimit value of the deciding limit dl:
// its remaining quota r and the seconds until it resets t:
//
//	"name";r=50;t=30
func AppendRateLimit(b []byte, dl *decide.LimitOutcome) []byte {
	b = AppendSFString(b, dl.Limit.Name)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, dl.Decision.Remaining, 10)
	b = append(b, ";t="...)
	return strconv.AppendInt(b, Reset(dl), 10)
}

// listed reports whether a limit of the same name as l, an enforced one,
// is in ls: the policy names each limit once.
func listed(ls []decide.LimitOutcome, l *sluice.Limit) bool {
	for i := range ls {
		if x := ls[i].Limit; !x.Shadow && (x == l || x.Name == l.Name) {
			return true
		}
	}
	return false
}

// AppendSFString appends s as a structured field string (RFC 8941): in
// quotes, with quotes and backslashes escaped, and bytes outside printable
// ASCII, which it cannot hold, replaced by '?'.
func AppendSFString(b []byte, s string) []byte {
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
