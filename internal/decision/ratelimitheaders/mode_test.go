package ratelimitheaders

import (
	"strings"
	"testing"
)

func TestParseHeaderMode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want HeaderMode
	}{
		{"", HeadersNone},
		{"off", HeadersNone},
		{"OFF", HeadersNone},
		{"none", HeadersNone},
		{"ietf", HeadersIETF},
		{"x-ratelimit", HeadersXRateLimit},
		{"retry-after", HeadersRetryAfter},
		{"ietf, Retry-After", HeadersIETF | HeadersRetryAfter},
		{"all", HeadersAll},
		{"ietf,x-ratelimit,retry-after", HeadersAll},
		{"ietf, all", HeadersAll},
		{" X-RateLimit ", HeadersXRateLimit},
	} {
		got, err := ParseHeaderMode(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseHeaderMode(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
		if back, err := ParseHeaderMode(got.String()); err != nil || back != got {
			t.Errorf("%v does not parse back: %v %v", got, back, err)
		}
	}
	for _, bad := range []string{"ietf,", "draft-03", "x-ratelimit;retry-after", ",", "none,none"} {
		if _, err := ParseHeaderMode(bad); err == nil || !strings.Contains(err.Error(), "unknown rate limit headers") && !strings.Contains(err.Error(), "must be alone") {
			t.Errorf("ParseHeaderMode(%q): %v", bad, err)
		}
	}
	for _, alone := range []string{"off,ietf", "ietf, None"} {
		if _, err := ParseHeaderMode(alone); err == nil || !strings.Contains(err.Error(), "must be alone") {
			t.Errorf("ParseHeaderMode(%q): %v", alone, err)
		}
	}
	var m HeaderMode
	if err := m.Set("x-ratelimit,ietf"); err != nil || m != HeadersIETF|HeadersXRateLimit || m.String() != "ietf,x-ratelimit" {
		t.Errorf("Set: %v %v", m, err)
	}
}

// Zero is each front door's default; HeadersNone is none whatever the
// default.
func TestHeaderModeWith(t *testing.T) {
	for _, tc := range []struct{ m, def, want HeaderMode }{
		{0, HeadersAll, HeadersAll},
		{0, 0, 0},
		{HeadersNone, HeadersAll, 0},
		{HeadersIETF, HeadersAll, HeadersIETF},
		{HeadersIETF | HeadersRetryAfter, 0, HeadersIETF | HeadersRetryAfter},
	} {
		if got := tc.m.With(tc.def); got != tc.want {
			t.Errorf("%v.With(%v) = %v, want %v", tc.m, tc.def, got, tc.want)
		}
	}
	for _, bad := range []HeaderMode{HeadersNone | HeadersIETF, 1 << 6} {
		if bad.Validate() == nil {
			t.Errorf("%d validates", bad)
		}
	}
	for _, good := range []HeaderMode{0, HeadersNone, HeadersAll, HeadersXRateLimit} {
		if err := good.Validate(); err != nil {
			t.Errorf("%v: %v", good, err)
		}
	}
}
