package httpretry

import (
	"net/http"
	"strconv"
	"testing"
	"time"
)

var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func hdr(kv ...string) http.Header {
	h := make(http.Header)
	for i := 0; i < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// TestRetryHint is the table of hints, read at a fixed time.
func TestRetryHint(t *testing.T) {
	date := func(d time.Duration) string { return now.Add(d).Format(http.TimeFormat) }
	epoch := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).Unix(), 10) }
	skewed := now.Add(-time.Hour) // the server's clock, an hour behind
	cases := []struct {
		name string
		h    http.Header
		want time.Duration
		src  Source
		ok   bool
	}{
		{"none", hdr(), 0, SourceBackoff, false},
		{"seconds", hdr("Retry-After", "120"), 120 * time.Second, SourceRetryAfter, true},
		{"zero", hdr("Retry-After", "0"), 0, SourceRetryAfter, true},
		{"spaces", hdr("Retry-After", " 5 "), 5 * time.Second, SourceRetryAfter, true},
		{"ten years", hdr("Retry-After", strconv.Itoa(maxHintSeconds)), maxHintSeconds * time.Second, SourceRetryAfter, true},
		{"over ten years", hdr("Retry-After", strconv.Itoa(maxHintSeconds+1)), 0, SourceBackoff, false},
		{"negative", hdr("Retry-After", "-1"), 0, SourceBackoff, false},
		{"date, local clock", hdr("Retry-After", date(90*time.Second)), 90 * time.Second, SourceRetryAfter, true},
		{"date from Date", hdr("Date", skewed.Format(http.TimeFormat), "Retry-After", skewed.Add(30*time.Second).Format(http.TimeFormat)), 30 * time.Second, SourceRetryAfter, true},
		{"asctime date", hdr("Retry-After", now.Add(4*time.Second).Format(time.ANSIC)), 4 * time.Second, SourceRetryAfter, true},
		{"bad Date falls back to the clock", hdr("Date", "yesterday", "Retry-After", date(7*time.Second)), 7 * time.Second, SourceRetryAfter, true},
		{"date in the past", hdr("Retry-After", date(-time.Second)), 0, SourceBackoff, false},
		{"date now", hdr("Retry-After", date(0)), 0, SourceBackoff, false},
		{"date in 20 years", hdr("Retry-After", now.AddDate(20, 0, 0).Format(http.TimeFormat)), 0, SourceBackoff, false},
		{"bad Retry-After, next field", hdr("Retry-After", "later", "X-RateLimit-Reset", "4"), 4 * time.Second, SourceXRateLimitReset, true},
		{"RateLimit", hdr("RateLimit", `"a";r=0;t=10`), 10 * time.Second, SourceRateLimit, true},
		{"RateLimit two lines", hdr("RateLimit", `"a";r=5;t=10`, "RateLimit", `"b";r=0;t=40`), 40 * time.Second, SourceRateLimit, true},
		{"RateLimit none exhausted", hdr("RateLimit", `"a";r=1;t=10`), 0, SourceBackoff, false},
		{"RateLimit pk and unknown params", hdr("RateLimit", `"a";r=0;t=10;pk=:cGsx:;x=?1`), 10 * time.Second, SourceRateLimit, true},
		{"RateLimit later param wins", hdr("RateLimit", `"a";r=0;t=10;t=3`), 3 * time.Second, SourceRateLimit, true},
		{"RateLimit w from policy", hdr("RateLimit", `"a";r=0`, "RateLimit-Policy", `"b";q=1;w=9, "a";q=10;w=60`), 60 * time.Second, SourceRateLimit, true},
		{"RateLimit no t, no policy", hdr("RateLimit", `"a";r=0`), 0, SourceBackoff, false},
		{"RateLimit malformed policy", hdr("RateLimit", `"a";r=0`, "RateLimit-Policy", `"a";q=10;w=60,,`), 0, SourceBackoff, false},
		{"RateLimit one bad item spoils all", hdr("RateLimit", `"a";r=0;t=10, "b";r=0;t=x`), 0, SourceBackoff, false},
		{"RateLimit bad second line", hdr("RateLimit", `"a";r=0;t=10`, "RateLimit", `"b`), 0, SourceBackoff, false},
		{"RateLimit decimal", hdr("RateLimit", `"a";r=0;t=1.5`), 0, SourceBackoff, false},
		{"RateLimit token name", hdr("RateLimit", `a;r=0;t=1`), 0, SourceBackoff, false},
		{"X-RateLimit-Reset delta", hdr("X-RateLimit-Reset", "60"), 60 * time.Second, SourceXRateLimitReset, true},
		{"X-RateLimit-Reset epoch", hdr("X-RateLimit-Reset", epoch(45*time.Second)), 45 * time.Second, SourceXRateLimitReset, true},
		{"X-RateLimit-Reset epoch from Date", hdr("Date", skewed.Format(http.TimeFormat), "X-RateLimit-Reset", strconv.FormatInt(skewed.Add(8*time.Second).Unix(), 10)), 8 * time.Second, SourceXRateLimitReset, true},
		{"X-RateLimit-Reset epoch past", hdr("X-RateLimit-Reset", epoch(-time.Hour)), 0, SourceBackoff, false},
		{"X-RateLimit-Reset epoch far", hdr("X-RateLimit-Reset", epoch(11*366*24*time.Hour)), 0, SourceBackoff, false},
		{"X-RateLimit-Reset remaining 0", hdr("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "6"), 6 * time.Second, SourceXRateLimitReset, true},
		{"X-RateLimit-Reset remaining 2", hdr("X-RateLimit-Remaining", "2", "X-RateLimit-Reset", "6"), 0, SourceBackoff, false},
	}
	for _, c := range cases {
		d, src, ok := retryHint(c.h, now)
		if d != c.want || src != c.src || ok != c.ok {
			t.Errorf("%s: got %v %v %v, want %v %v %v", c.name, d, src, ok, c.want, c.src, c.ok)
		}
	}
}

// TestQuotaHint checks what says a host's quota is spent, on any response.
func TestQuotaHint(t *testing.T) {
	cases := []struct {
		name string
		h    http.Header
		want time.Duration
		ok   bool
	}{
		{"RateLimit r=0", hdr("RateLimit", `"a";r=0;t=30`), 30 * time.Second, true},
		{"RateLimit r=1", hdr("RateLimit", `"a";r=1;t=30`), 0, false},
		{"X-RateLimit-Remaining 0", hdr("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "12"), 12 * time.Second, true},
		{"X-RateLimit-Reset alone", hdr("X-RateLimit-Reset", "12"), 0, false},
		{"Retry-After alone", hdr("Retry-After", "12"), 0, false},
	}
	for _, c := range cases {
		if d, _, ok := quotaHint(c.h, now); d != c.want || ok != c.ok {
			t.Errorf("%s: got %v %v, want %v %v", c.name, d, ok, c.want, c.ok)
		}
		if hasQuotaFields(c.h) != c.ok && c.ok {
			t.Errorf("%s: hasQuotaFields false for a spent quota", c.name)
		}
	}
}

// TestParseList checks the Structured Field List parser on valid and
// invalid input (RFC 8941 §4.2).
func TestParseList(t *testing.T) {
	valid := []struct {
		in    string
		names []string
	}{
		{``, nil},
		{`"a"`, []string{"a"}},
		{`  "a" ,	"b"  `, []string{"a", "b"}},
		{`"a\"b\\c";r=1`, []string{`a"b\c`}},
		{`tok, 1, -2.5, ?0, :aGk=:, ("x" y);p, "z"`, []string{"", "", "", "", "", "", "z"}},
		{`"a";r;t=?1;q="s";w=tok/x:y;*k=1`, []string{"a"}},
		{`"a"; r=1`, []string{"a"}},
		{`()`, []string{""}},
	}
	for _, c := range valid {
		items, ok := parseList(c.in, nil)
		if !ok || len(items) != len(c.names) {
			t.Errorf("%q: ok %v, %d items; want %d", c.in, ok, len(items), len(c.names))
			continue
		}
		for i, n := range c.names {
			if items[i].name != n {
				t.Errorf("%q: item %d is %q, want %q", c.in, i, items[i].name, n)
			}
		}
	}
	invalid := []string{
		`,`, `"a",`, `"a",,"b"`, `"a" "b"`, `"a`, `"a\x"`, "\"a\x01\"", `"a";`, `"a";R=1`, `"a";1=1`,
		`"a";r=`, `"a";r=1.`, `"a";r=1.2345`, `"a";r=1234567890123456`, `"a";r=--1`, `1234567890123.5`,
		`:ab$:`, `:ab`, `?2`, `?`, `("a"`, `("a"x)`, `("a" )x`, `@12`, `%"x"`, `"a"x`, `"a";r=1 ;t=2`,
	}
	for _, in := range invalid {
		if items, ok := parseList(in, nil); ok {
			t.Errorf("%q: parsed as %+v, want invalid", in, items)
		}
	}
	var long string
	for i := range maxListMembers + 1 {
		if i > 0 {
			long += ","
		}
		long += `"a"`
	}
	if _, ok := parseList(long, nil); ok {
		t.Errorf("a list of %d members parsed, want at most %d", maxListMembers+1, maxListMembers)
	}
}
