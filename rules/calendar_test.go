package rules_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rules"
)

const monthly = `domain: plans
descriptors:
  - key: plan
    value: pro
    rate_limit:
      unit: month
      requests_per_unit: 100000
      calendar: {tz: Europe/Berlin, anchor_day: 31}
  - key: plan
    value: free
    rate_limits:
      - {unit: day, requests_per_unit: 100, calendar: {tz: America/New_York}}
      - {unit: minute, requests_per_unit: 10}
`

// A calendar limit is decided, period by period, as a fixed window of the
// period's length that starts where the period starts, in a counter of the
// period's own.
func TestCalendarPlan(t *testing.T) {
	c := scheduledConfig(t, monthly)
	berlin, _ := time.LoadLocation("Europe/Berlin")
	for _, tc := range []struct {
		now        string
		start, end time.Time
	}{
		{"2028-02-15T12:00:00Z", time.Date(2028, 1, 31, 0, 0, 0, 0, berlin), time.Date(2028, 2, 29, 0, 0, 0, 0, berlin)},
		{"2028-02-28T23:00:00Z", time.Date(2028, 2, 29, 0, 0, 0, 0, berlin), time.Date(2028, 3, 31, 0, 0, 0, 0, berlin)},
		{"2028-03-30T21:59:59Z", time.Date(2028, 2, 29, 0, 0, 0, 0, berlin), time.Date(2028, 3, 31, 0, 0, 0, 0, berlin)},
	} {
		now, _ := time.Parse(time.RFC3339, tc.now)
		p := rules.Plan{Now: func() time.Time { return now }}
		if err := c.Plan("plans", []rules.Descriptor{desc("plan=pro")}, &p); err != nil {
			t.Fatal(err)
		}
		h := p.Hits[0]
		if !p.Matches[0].Until.Equal(tc.end) {
			t.Errorf("at %s: until %v, want the period's end %v", tc.now, p.Matches[0].Until, tc.end)
		}
		if h.Limit.Period != tc.end.Sub(tc.start) {
			t.Errorf("at %s: period %v, want %v", tc.now, h.Limit.Period, tc.end.Sub(tc.start))
		}
		if got := (now.UnixNano() - int64(h.Limit.WindowOffset)) % int64(h.Limit.Period); got != now.Sub(tc.start).Nanoseconds() {
			t.Errorf("at %s: the window holding now started %v ago, want %v (the period's start)", tc.now, time.Duration(got), now.Sub(tc.start))
		}
		if !strings.Contains(h.Key, "@"+strconv.FormatInt(tc.start.Unix(), 10)) {
			t.Errorf("at %s: key %q does not name the period that starts at %d", tc.now, h.Key, tc.start.Unix())
		}
		if err := h.Limit.Validate(); err != nil {
			t.Errorf("at %s: %v", tc.now, err)
		}
	}
	// The day of New York's 25-hour day, beside a plain limit.
	now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	p := rules.Plan{Now: func() time.Time { return now }}
	if err := c.Plan("plans", []rules.Descriptor{desc("plan=free")}, &p); err != nil {
		t.Fatal(err)
	}
	if len(p.Hits) != 2 || p.Hits[0].Limit.Period != 25*time.Hour || p.Hits[1].Limit.Period != time.Minute || p.Hits[1].Limit.WindowOffset != 0 {
		t.Errorf("hits %+v %+v: want a 25-hour day and a plain minute", p.Hits[0].Limit, p.Hits[1].Limit)
	}
}

func TestCalendarProblems(t *testing.T) {
	for _, tc := range []struct {
		name, limit string
		want        string
	}{
		{"no zone", `{unit: month, requests_per_unit: 1, calendar: {anchor_day: 3}}`, "calendar needs tz:"},
		{"a minute", `{unit: minute, requests_per_unit: 1, calendar: {tz: UTC}}`, "calendar needs unit: day, week, month or year, not minute"},
		{"a period", `{period: 720h, requests_per_unit: 1, calendar: {tz: UTC}}`, "calendar needs unit: day, week, month or year"},
		{"a multiplier", `{unit: day, unit_multiplier: 2, requests_per_unit: 1, calendar: {tz: UTC}}`, "without unit_multiplier"},
		{"a sliding log", `{unit: day, requests_per_unit: 1, algorithm: sliding_log, calendar: {tz: UTC}}`, "calendar applies to fixed_window and sliding_window, not sliding_log"},
		{"a token bucket", `{unit: day, requests_per_unit: 1, algorithm: token_bucket, calendar: {tz: UTC}}`, "calendar applies to fixed_window and sliding_window, not token_bucket"},
		{"anchor day of a week", `{unit: week, requests_per_unit: 1, calendar: {tz: UTC, anchor_day: 2}}`, "anchor_day applies to unit month or year"},
		{"anchor day 32", `{unit: month, requests_per_unit: 1, calendar: {tz: UTC, anchor_day: 32}}`, "anchor_day"},
		{"anchor month of a month", `{unit: month, requests_per_unit: 1, calendar: {tz: UTC, anchor_month: 2}}`, "anchor_month applies to unit year"},
		{"unknown zone", `{unit: day, requests_per_unit: 1, calendar: {tz: Europe/Atlantis}}`, `unknown time zone "Europe/Atlantis"`},
		{"unknown key", `{unit: day, requests_per_unit: 1, calendar: {tz: UTC, start: monday}}`, "start"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := rules.Parse("c.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: "+tc.limit+"\n"))
			var e *rules.Error
			if !errors.As(err, &e) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Parse: %v, want a problem with %q", err, tc.want)
			}
		})
	}
	_, err := rules.Parse("c.yaml", []byte("domain: d\ncapacity: {unit: day, requests_per_unit: 1, calendar: {tz: UTC}}\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
	if err == nil || !strings.Contains(err.Error(), "calendar is not supported in capacity") {
		t.Errorf("a calendar capacity: %v", err)
	}
}

// A calendar applies inside a schedule's window too.
func TestCalendarInSchedule(t *testing.T) {
	c := scheduledConfig(t, `domain: plans
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 10}
    schedules:
      - {from: "00:00", to: "12:00", tz: UTC, rate_limit: {unit: day, requests_per_unit: 5, calendar: {tz: Asia/Tokyo}}}
`)
	now := time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC) // 15:00 in Tokyo
	p := rules.Plan{Now: func() time.Time { return now }}
	if err := c.Plan("plans", []rules.Descriptor{desc("k=x")}, &p); err != nil {
		t.Fatal(err)
	}
	tokyo, _ := time.LoadLocation("Asia/Tokyo")
	l := p.Hits[0].Limit
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, tokyo)
	if l.Rate != 5 || l.Period != 24*time.Hour || (now.UnixNano()-int64(l.WindowOffset))%int64(l.Period) != now.Sub(start).Nanoseconds() {
		t.Errorf("limit %+v: want 5 a Tokyo day", l)
	}
}

// A sliding window over calendar periods keeps one counter (its key does
// not change with the period), so that a period weighs the one before.
func TestCalendarSlidingKeepsItsKey(t *testing.T) {
	c := scheduledConfig(t, `domain: plans
descriptors:
  - key: plan
    rate_limit: {unit: month, requests_per_unit: 100, algorithm: sliding_window, calendar: {tz: UTC}}
`)
	var keys []string
	var periods []time.Duration
	for _, at := range []time.Time{time.Date(2027, 2, 27, 0, 0, 0, 0, time.UTC), time.Date(2027, 3, 2, 0, 0, 0, 0, time.UTC)} {
		p := rules.Plan{Now: func() time.Time { return at }}
		if err := c.Plan("plans", []rules.Descriptor{desc("plan=x")}, &p); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, p.Hits[0].Key)
		periods = append(periods, p.Hits[0].Limit.Period)
	}
	if keys[0] != keys[1] || periods[0] != 28*24*time.Hour || periods[1] != 31*24*time.Hour {
		t.Errorf("keys %q, periods %v: want one key, February's and March's lengths", keys, periods)
	}
}
