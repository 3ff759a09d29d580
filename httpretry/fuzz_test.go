package httpretry

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

const maxHint = maxHintSeconds * time.Second

// checkWait asserts what every hint must satisfy: the raw hint between 0
// and ten years, and the transport's wait never negative, never over
// MaxWait for a hint, never over the backoff's ceiling otherwise.
func checkWait(t *testing.T, h http.Header, now time.Time) {
	t.Helper()
	for _, f := range []func(http.Header, time.Time) (time.Duration, Source, bool){retryHint, quotaHint} {
		if d, _, ok := f(h, now); d < 0 || d > maxHint || !ok && d != 0 {
			t.Fatalf("hint %v (ok %v) outside [0, 10y] for %v", d, ok, h)
		}
	}
	tr := New(Config{MaxWait: 30 * time.Second, BaseDelay: time.Second, MaxDelay: 8 * time.Second, HintJitter: 2 * time.Second})
	for k := range 5 {
		wait, need, src := tr.retryWait(h, now, k)
		switch {
		case wait < 0 || src == SourceBackoff && need != wait:
			t.Fatalf("retry %d: wait %v, need %v for %v", k, wait, need, h)
		case src == SourceBackoff && wait > min(time.Second<<k, 8*time.Second):
			t.Fatalf("retry %d: backoff %v over its ceiling", k, wait)
		case src != SourceBackoff && (wait > 30*time.Second || wait < min(need, 30*time.Second) || wait > min(need+2*time.Second, 30*time.Second)):
			t.Fatalf("retry %d: wait %v for a hint of %v (%v), MaxWait 30s, HintJitter 2s", k, wait, need, src)
		}
	}
}

func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// refSeconds is the naive reading of a whole number of seconds that may
// be a hint: ok only for 1 to 18 digits.
func refSeconds(s string) (int64, bool) {
	if !digits(s) || len(s) > 18 {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// refUntil is the naive wait until a server's date: measured from Date
// when it parses, else from now; only in the future and within ten years.
func refUntil(at time.Time, date string, now time.Time) (time.Duration, bool) {
	ref := now
	if d, err := http.ParseTime(date); err == nil && date != "" {
		ref = d
	}
	d := at.Sub(ref)
	return d, d > 0 && d <= maxHint
}

func FuzzRetryAfter(f *testing.F) {
	for _, s := range []string{"0", "120", "-1", "1.5", "99999999999999999999", "316224001", "Wed, 21 Oct 2015 07:28:00 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994", ""} {
		f.Add(s, "Wed, 21 Oct 2015 07:27:00 GMT", int64(1445412420))
	}
	f.Fuzz(func(t *testing.T, v, date string, nowSec int64) {
		now := time.Unix(nowSec, 0)
		h := hdr("Retry-After", v, "Date", date)
		checkWait(t, h, now)

		d, ok := retryAfter(h, now)
		v = strings.TrimSpace(h.Get("Retry-After"))
		var want time.Duration
		var wantOK bool
		if n, isNum := refSeconds(v); isNum {
			want, wantOK = time.Duration(n)*time.Second, n <= maxHintSeconds
		} else if at, err := http.ParseTime(v); err == nil && !digits(v) {
			want, wantOK = refUntil(at, h.Get("Date"), now)
		}
		if !wantOK {
			want = 0
		}
		if ok != wantOK || ok && d != want {
			t.Fatalf("Retry-After %q, Date %q: got %v %v, want %v %v", v, date, d, ok, want, wantOK)
		}
	})
}

func FuzzRateLimit(f *testing.F) {
	for _, s := range [][2]string{
		{`"a";r=0;t=10`, ``},
		{`"burst";r=0;t=12, "day";r=50;t=3000`, `"burst";q=100;w=60, "day";q=1000;w=86400`},
		{`"a";r=0`, `"a";q=10;w=60`},
		{`"a";r=0;t=10;pk=:cGsx:`, `"a";q=10;qu="requests";w=60`},
		{`("a" b);r=0;t=1, ?1, 1.5, tok`, `"a";q=1`},
		{`"a\"b";r=0;t=999999999999999`, `"a\"b";q=-1;w=5`},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, rl, policy string) {
		h := hdr("RateLimit", rl, "RateLimit-Policy", policy)
		checkWait(t, h, now)

		d, ok := rateLimitReset(h)
		if _, valid := parseList(strings.Join(h["Ratelimit"], ","), nil); ok && !valid {
			t.Fatalf("RateLimit %q is not a valid List, yet gave %v", rl, d)
		}
		// Malformed fields are ignored entirely: spoiling the field's
		// end spoils every hint in it.
		if d, ok := rateLimitReset(hdr("RateLimit", rl+", (")); ok {
			t.Fatalf("RateLimit %q, a malformed list, gave %v", rl+", (", d)
		}
		if ok {
			if rl2 := strings.ReplaceAll(rl, "r=0", "r=1"); rl2 != rl {
				h.Set("RateLimit", rl2)
				if d2, ok2 := rateLimitReset(h); ok2 && d2 > d {
					t.Fatalf("fewer exhausted limits made a longer wait: %v > %v", d2, d)
				}
			}
		}
	})
}

func FuzzXRateLimitReset(f *testing.F) {
	for _, s := range []string{"0", "60", "316224000", "316224001", "1772366460", "-5", "1e9", "999999999999999999", "9999999999999999999", ""} {
		f.Add(s, "0", "Sun, 01 Mar 2026 12:00:00 GMT", now.Unix())
	}
	f.Fuzz(func(t *testing.T, v, remaining, date string, nowSec int64) {
		now := time.Unix(nowSec, 0)
		h := hdr("X-RateLimit-Reset", v, "X-RateLimit-Remaining", remaining, "Date", date)
		checkWait(t, h, now)

		d, ok := xRateLimitReset(h, now)
		var want time.Duration
		var wantOK bool
		if n, isNum := refSeconds(strings.TrimSpace(h.Get("X-RateLimit-Reset"))); isNum {
			if n <= maxHintSeconds {
				want, wantOK = time.Duration(n)*time.Second, true
			} else {
				want, wantOK = refUntil(time.Unix(n, 0), h.Get("Date"), now)
			}
		}
		if !wantOK {
			want = 0
		}
		if ok != wantOK || ok && d != want {
			t.Fatalf("X-RateLimit-Reset %q, Date %q, now %v: got %v %v, want %v %v", v, date, now, d, ok, want, wantOK)
		}
	})
}
