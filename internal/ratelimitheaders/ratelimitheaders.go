// Package ratelimitheaders formats the rate limit response header values of
// a decide.Outcome: the IETF RateLimit-Policy and RateLimit fields
// (draft-ietf-httpapi-ratelimit-headers, -08 and later syntax),
// X-RateLimit-* and Retry-After. It owns the choice of the deciding limit
// and the rounding of seconds, so that every front door (the server's
// response_headers_to_add, httplimit's http.Header) tells clients the same
// thing, and the one HeaderMode (and its parser) with which each front door
// is told which families to send.
//
// The fields agree: the RateLimit field's t and X-RateLimit-Reset are the
// same number, the seconds until the deciding limit has more quota (More,
// as drafts -10 and -11 define t), and a denial's Retry-After is never
// earlier; for a denial, t is when the request would be admitted.
//
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
// with the least quota left (on a tie, the one whose quota comes back
// later, by More). Shadow-mode limits, which never deny, are not
// advertised.
func Deciding(o *decide.Outcome) int {
	if !o.Overall.Allowed && o.Overall.Index >= 0 && o.Overall.Index < len(o.Limits) && !o.Limits[o.Overall.Index].Limit.Shadow {
		return o.Overall.Index
	}
	deciding := -1
	var more time.Duration // More of the deciding limit once a tie needs it; -1 before
	for i := range o.Limits {
		l := &o.Limits[i]
		switch {
		case l.Limit.Shadow:
		case deciding < 0 || l.Decision.Remaining < o.Limits[deciding].Decision.Remaining:
			deciding, more = i, -1
		case l.Decision.Remaining == o.Limits[deciding].Decision.Remaining:
			if more < 0 {
				more = More(&o.Limits[deciding])
			}
			if m := More(l); m > more {
				deciding, more = i, m
			}
		}
	}
	return deciding
}

// More is the time until the limit dl has more quota than it has now
// left, the RateLimit field's t (sluice.Limit.MoreAfter): on a denial by
// dl, the time until the request would be admitted; otherwise the time
// until it has one more than Decision.Remaining, which for a sliding
// window, a sliding log and a sketch is a time by which it surely has.
func More(dl *decide.LimitOutcome) time.Duration {
	return dl.Limit.MoreAfter(dl.Decision)
}

// Reset is the RateLimit t and X-RateLimit-Reset value of the deciding
// limit dl: More in seconds, rounded up.
func Reset(dl *decide.LimitOutcome) int64 {
	return Seconds(More(dl), dl.Limit.Period)
}

// RetryAfter is the Retry-After of a denied request whose deciding limit
// is dl: the overall decision's wait, never shorter than the deciding
// limit's nor than Reset (t), rounded up, and at least 1.
func RetryAfter(o *decide.Outcome, dl *decide.LimitOutcome) int64 {
	wait := Seconds(o.Overall.RetryAfter, dl.Limit.Period)
	return max(wait, Seconds(dl.Decision.RetryAfter, dl.Limit.Period), Reset(dl), 1)
}

// AppendPolicy appends the RateLimit-Policy value of ls: every enforced
// limit once (by name), with its quota q and window w in seconds
// (Window):
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
		b = strconv.AppendInt(b, Window(l), 10)
	}
	return b
}

// Window is the RateLimit-Policy w of l: the seconds over which it admits
// its quota q (sluice.Limit.Window), rounded up: the period of a window
// algorithm, the time a bucket takes to refill its whole burst.
func Window(l *sluice.Limit) int64 {
	return Seconds(l.Window(), l.Period)
}

// AppendRateLimit appends the RateLimit value of the deciding limit dl:
// its remaining quota r and the seconds t until more is available
// (Reset):
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
