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
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/base/algo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/vocab/limits"
	"github.com/sluicehq/sluice/rules"
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
// or -1 when there is none: the limit that denied (or would have, in global
// shadow mode), else the enforced limit
// with the least quota left (on a tie, the one whose quota comes back
// later, by More). Shadow-mode limits, which never deny, are not
// advertised.
func Deciding(o *decide.Outcome) int {
	if (!o.Overall.Allowed || o.ShadowDenied) && o.Overall.Index >= 0 && o.Overall.Index < len(o.Limits) && !o.Limits[o.Overall.Index].Limit.Shadow {
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
	return limits.MoreAfter(dl.Limit, dl.Decision)
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
// (Window); a concurrency limit's with its quota unit and no window:
//
//	"name";q=100;w=60, "other";q=1000;w=86400, "slots";q=4;qu="concurrent-requests"
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
		b = strconv.AppendInt(b, algo.Nominal(algo.Kind(l.Algorithm), l.Rate, l.Burst), 10)
		if l.Algorithm == sluice.Concurrency {
			// A cap on what is in flight has no window: its quota unit
			// says so.
			b = append(b, `;qu="concurrent-requests"`...)
			continue
		}
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, Window(l), 10)
	}
	return b
}

// Window is the RateLimit-Policy w of l: the seconds over which it admits
// its quota q (sluice.Limit.Window), rounded up: the period of a window
// algorithm, the time a bucket takes to refill its whole burst.
func Window(l *sluice.Limit) int64 {
	return Seconds(limits.Window(l), l.Period)
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

// Field is one rate limit header field.
type Field uint8

// The fields, in the order Append writes them.
const (
	FieldPolicy     Field = iota // RateLimit-Policy
	FieldRateLimit               // RateLimit
	FieldLimit                   // X-RateLimit-Limit
	FieldRemaining               // X-RateLimit-Remaining
	FieldReset                   // X-RateLimit-Reset
	FieldRetryAfter              // Retry-After
	NumFields
)

// Names are the fields' names as sent in an Envoy response (Envoy keeps
// the case it is given); CanonicalNames as net/http's Header keys them.
var (
	Names          = [NumFields]string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Retry-After"}
	CanonicalNames = [NumFields]string{"Ratelimit-Policy", "Ratelimit", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Retry-After"}
)

// Values are the values of the rate limit headers of one answer, in one
// buffer: field Fields[i]'s value is Buf[start:Ends[i]], where start is
// the previous end (0 for the first).
type Values struct {
	Fields [NumFields]Field
	Ends   [NumFields]int
	N      int
	Buf    []byte
}

// Value returns the i-th value.
func (v *Values) Value(i int) []byte {
	start := 0
	if i > 0 {
		start = v.Ends[i-1]
	}
	return v.Buf[start:v.Ends[i]]
}

// Fill sets v, reusing its buffer, to the rate limit headers of mode for
// the answer o, denied or not: every front door's headers, written here
// once. The headers describe the deciding limit (Deciding); a denial adds
// Retry-After (RetryAfter), and a denial with no limit to describe (a
// remote's fail_closed answer) still says when to retry. A fail_open
// answer knows no quota to advertise: no headers.
func (v *Values) Fill(o *decide.Outcome, mode HeaderMode, denied bool) {
	b := v.Buf[:0]
	v.N = 0
	add := func(f Field) {
		v.Fields[v.N], v.Ends[v.N] = f, len(b)
		v.N++
	}
	defer func() { v.Buf = b }()
	if mode == 0 || o.Degraded == rules.FailOpen {
		return
	}
	deciding := Deciding(o)
	if deciding < 0 {
		if denied && mode&HeadersRetryAfter != 0 {
			b = strconv.AppendInt(b, max(Seconds(o.Overall.RetryAfter, time.Minute), 1), 10)
			add(FieldRetryAfter)
		}
		return
	}
	dl := &o.Limits[deciding]
	if mode&HeadersIETF != 0 {
		b = AppendPolicy(b, o.Limits)
		add(FieldPolicy)
		b = AppendRateLimit(b, dl)
		add(FieldRateLimit)
	}
	if mode&HeadersXRateLimit != 0 {
		b = strconv.AppendInt(b, dl.Decision.Limit, 10)
		add(FieldLimit)
		b = strconv.AppendInt(b, dl.Decision.Remaining, 10)
		add(FieldRemaining)
		b = strconv.AppendInt(b, Reset(dl), 10)
		add(FieldReset)
	}
	if denied && mode&HeadersRetryAfter != 0 {
		b = strconv.AppendInt(b, RetryAfter(o, dl), 10)
		add(FieldRetryAfter)
	}
}

// Hook returns the decide.Hook that adds the rate limit headers of mode to
// every answer (decide.Outcome.AddHeader), for the front doors that send
// an outcome's headers as they are: sluice serve's response_headers_to_add
// and the simulator. Register it after decide.GlobalShadow: a request let
// through is not told to retry.
func Hook(mode HeaderMode) decide.Hook {
	pool := sync.Pool{New: func() any { return new(Values) }}
	return func(_ context.Context, _ *decide.Request, o *decide.Outcome, err error) {
		if err != nil {
			return
		}
		v := pool.Get().(*Values)
		v.Fill(o, mode, o.OverLimit())
		for i := range v.N {
			o.AddHeader(Names[v.Fields[i]], v.Value(i))
		}
		pool.Put(v)
	}
}
