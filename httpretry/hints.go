package httpretry

import (
	"net/http"
	"strings"
	"time"
)

// maxHintSeconds is the longest wait, in seconds, that a server's hint may
// name (ten years, the most sluice's own servers ever send). A longer one is
// absurd and ignored. It is also the line between the two readings of
// X-RateLimit-Reset: a larger value is a Unix time.
const maxHintSeconds = 10 * 366 * 24 * 3600

// Source says where a wait came from.
type Source uint8

const (
	// SourceBackoff: exponential backoff with full jitter, for a refused
	// response without a usable hint.
	SourceBackoff Source = iota
	// SourceRetryAfter: the response's Retry-After (RFC 9110 §10.2.3).
	SourceRetryAfter
	// SourceRateLimit: the t parameter of an exhausted (r=0) limit in the
	// IETF RateLimit field, or its policy's window w when t is absent.
	SourceRateLimit
	// SourceXRateLimitReset: X-RateLimit-Reset.
	SourceXRateLimitReset
	// SourceQuota: self-throttling; the host said earlier that its quota
	// is spent until a known time.
	SourceQuota
	// SourcePacing: the client-side pacing limiter (Config.Pace).
	SourcePacing
)

var sourceNames = [...]string{
	SourceBackoff:         "backoff",
	SourceRetryAfter:      "Retry-After",
	SourceRateLimit:       "RateLimit",
	SourceXRateLimitReset: "X-RateLimit-Reset",
	SourceQuota:           "quota",
	SourcePacing:          "pacing",
}

// String returns the header name of a hint, or "backoff", "quota",
// "pacing".
func (s Source) String() string {
	if int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return "unknown"
}

// retryHint returns the server's word on how long to wait before retrying
// a refused request, reading the fields in this order and taking the first
// that is present and valid:
//
//  1. Retry-After: delay-seconds, or an HTTP-date measured from the
//     response's Date (the local clock now when Date is absent or invalid).
//  2. RateLimit: the largest t among the limits whose r is 0; a limit
//     without t takes the window w of the RateLimit-Policy of the same name.
//  3. X-RateLimit-Reset, when X-RateLimit-Remaining is absent or 0.
//
// A hint that is negative, malformed, in the past or longer than ten years
// is ignored, and the next field is read. The wait is never negative and
// is not capped here: the caller caps it and compares it with the request's
// deadline.
func retryHint(h http.Header, now time.Time) (time.Duration, Source, bool) {
	if d, ok := retryAfter(h, now); ok {
		return d, SourceRetryAfter, true
	}
	if d, ok := rateLimitReset(h); ok {
		return d, SourceRateLimit, true
	}
	if rem, ok := headerInt(h, "X-Ratelimit-Remaining"); !ok || rem == 0 {
		if d, ok := xRateLimitReset(h, now); ok {
			return d, SourceXRateLimitReset, true
		}
	}
	return 0, SourceBackoff, false
}

// quotaHint returns how long a host's quota stays spent, when a response
// says that none is left: a RateLimit limit with r=0 (its t, or its
// policy's w), else X-RateLimit-Remaining: 0 with a valid
// X-RateLimit-Reset. It reads any response, a 200 as well as a 429.
func quotaHint(h http.Header, now time.Time) (time.Duration, Source, bool) {
	if d, ok := rateLimitReset(h); ok {
		return d, SourceRateLimit, true
	}
	if rem, ok := headerInt(h, "X-Ratelimit-Remaining"); ok && rem == 0 {
		if d, ok := xRateLimitReset(h, now); ok {
			return d, SourceXRateLimitReset, true
		}
	}
	return 0, SourceQuota, false
}

// hasQuotaFields reports whether h holds any field quotaHint reads, so
// that the common response without them costs two map lookups.
func hasQuotaFields(h http.Header) bool {
	return len(h["Ratelimit"]) > 0 || len(h["X-Ratelimit-Remaining"]) > 0
}

// retryAfter reads Retry-After: 1*DIGIT seconds, or an HTTP-date (any of
// the three formats of RFC 9110 §5.6.7) relative to the response's Date.
func retryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		n, ok := parseSeconds(v)
		if !ok || n > maxHintSeconds {
			return 0, false
		}
		return time.Duration(n) * time.Second, true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return until(at, reference(h, now))
}

// xRateLimitReset reads X-RateLimit-Reset: whole seconds, a delay when at
// most ten years' worth, else a Unix time measured from the response's
// Date (the local clock when Date is absent or invalid).
func xRateLimitReset(h http.Header, now time.Time) (time.Duration, bool) {
	n, ok := headerInt(h, "X-Ratelimit-Reset")
	if !ok {
		return 0, false
	}
	if n <= maxHintSeconds {
		return time.Duration(n) * time.Second, true
	}
	return until(time.Unix(n, 0), reference(h, now))
}

// rateLimitReset reads the RateLimit field (draft-ietf-httpapi-ratelimit-
// headers, -08 and later): the longest reset among the limits it says are
// exhausted (r=0). A limit without t is reset after its policy's window w,
// from RateLimit-Policy. Either field is ignored entirely when malformed.
func rateLimitReset(h http.Header) (time.Duration, bool) {
	vals := h["Ratelimit"]
	if len(vals) == 0 {
		return 0, false
	}
	var buf [8]sfItem
	items, ok := parseList(strings.Join(vals, ","), buf[:0])
	if !ok {
		return 0, false
	}
	for i := range items {
		it := &items[i]
		r, t := it.params[paramR], it.params[paramT]
		if !it.isString || !validCount(r) || t.present && !validCount(t) {
			return 0, false
		}
	}
	var policies []sfItem
	policyRead := false
	best, found := int64(0), false
	for i := range items {
		it := &items[i]
		if it.params[paramR].v != 0 {
			continue
		}
		secs, ok := it.params[paramT].v, it.params[paramT].present
		if !ok {
			if !policyRead {
				policies, policyRead = rateLimitPolicy(h), true
			}
			secs, ok = policyWindow(policies, it.name)
		}
		if ok && (!found || secs > best) {
			best, found = secs, true
		}
	}
	return time.Duration(best) * time.Second, found
}

// rateLimitPolicy returns the items of RateLimit-Policy, or nil when it is
// absent or malformed: every item a String with an Integer q >= 0 and, if
// present, an Integer w >= 0.
func rateLimitPolicy(h http.Header) []sfItem {
	vals := h["Ratelimit-Policy"]
	if len(vals) == 0 {
		return nil
	}
	items, ok := parseList(strings.Join(vals, ","), nil)
	if !ok {
		return nil
	}
	for i := range items {
		it := &items[i]
		w := it.params[paramW]
		if !it.isString || !validCount(it.params[paramQ]) || w.present && !validCount(w) {
			return nil
		}
	}
	return items
}

// policyWindow returns the window w of the policy called name.
func policyWindow(policies []sfItem, name string) (int64, bool) {
	for i := range policies {
		if p := &policies[i]; p.name == name && p.params[paramW].present {
			return p.params[paramW].v, true
		}
	}
	return 0, false
}

// validCount reports whether a parameter is present, an Integer, and a
// number of seconds or units from 0 to ten years' worth.
func validCount(v sfInt) bool {
	return v.present && v.integer && v.v >= 0 && v.v <= maxHintSeconds
}

// reference is the time a server's dates are measured from: the
// response's Date, or now.
func reference(h http.Header, now time.Time) time.Time {
	if d := h.Get("Date"); d != "" {
		if t, err := http.ParseTime(d); err == nil {
			return t
		}
	}
	return now
}

// until returns the wait from ref to at, which must be in the future and
// at most ten years away.
func until(at, ref time.Time) (time.Duration, bool) {
	d := at.Sub(ref)
	if d <= 0 || d > maxHintSeconds*time.Second {
		return 0, false
	}
	return d, true
}

// headerInt reads a header as a non-negative decimal integer.
func headerInt(h http.Header, key string) (int64, bool) {
	v := h[key]
	if len(v) == 0 {
		return 0, false
	}
	return parseSeconds(strings.TrimSpace(v[0]))
}

// parseSeconds parses 1*DIGIT, at most 18 digits so that it cannot
// overflow; the callers bound the value.
func parseSeconds(s string) (int64, bool) {
	if s == "" || len(s) > 18 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}
