package rules_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
)

const scheduled = `domain: geo
descriptors:
  - key: country
    value: IN
    rate_limit: {unit: minute, requests_per_unit: 100}
    schedules:
      - name: quiet
        days: [mon-fri]
        from: "01:00"
        to: "06:00"
        tz: Asia/Kolkata
        rate_limit: {unit: minute, requests_per_unit: 5}
      - name: weekend nights
        days: [fri-sat]
        from: "22:00"
        to: "06:00"
        tz: Asia/Kolkata
        rate_limits:
          - {unit: minute, requests_per_unit: 10}
          - {unit: hour, requests_per_unit: 100}
      - name: maintenance
        days: [sun]
        from: "03:00"
        to: "04:00"
        tz: UTC
        rate_limit: {unlimited: true}
`

func scheduledConfig(t *testing.T, src string) *rules.Config {
	t.Helper()
	d, err := rules.Parse("geo.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	c, err := rules.NewConfig(d)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Each window's limits apply while it holds, the first listed wins, the
// rule's own limits apply outside every window, and each window counts in
// keys of its own.
func TestSchedulePlan(t *testing.T) {
	c := scheduledConfig(t, scheduled)
	at := func(s string) func() time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return func() time.Time { return v }
	}
	keys := map[string]string{} // key -> window
	for _, tc := range []struct {
		name, now string
		window    string // "" for the rule's own limits
		rates     []int64
		unlimited bool
		until     string
	}{
		{"a weekday afternoon", "2026-12-01T09:00:00Z", "", []int64{100}, false, "2026-12-01T19:30:00Z"},
		{"a weekday's quiet hours", "2026-12-01T21:00:00Z", "quiet", []int64{5}, false, "2026-12-02T00:30:00Z"},
		{"Friday night", "2026-12-04T17:00:00Z", "weekend nights", []int64{10, 100}, false, "2026-12-05T00:30:00Z"},
		{"Saturday 02:00 IST: Friday's window", "2026-12-04T20:30:00Z", "weekend nights", []int64{10, 100}, false, "2026-12-05T00:30:00Z"},
		{"Sunday maintenance", "2026-12-06T03:30:00Z", "maintenance", nil, true, "2026-12-06T04:00:00Z"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := rules.Plan{Now: at(tc.now)}
			if err := c.Plan("geo", []rules.Descriptor{desc("country=IN")}, &p); err != nil {
				t.Fatal(err)
			}
			m := p.Matches[0]
			window := ""
			if m.Schedule != nil {
				window = m.Schedule.Name
			}
			if window != tc.window {
				t.Errorf("window %q, want %q", window, tc.window)
			}
			if want, _ := time.Parse(time.RFC3339, tc.until); !m.Until.Equal(want) {
				t.Errorf("until %v, want %v", m.Until.UTC(), want)
			}
			if tc.unlimited {
				if m.Status != rules.Unlimited || m.Count != 0 {
					t.Fatalf("status %v with %d hits, want unlimited", m.Status, m.Count)
				}
				return
			}
			var rates []int64
			for _, h := range p.Hits[m.First : m.First+m.Count] {
				rates = append(rates, h.Limit.Rate)
				if w, dup := keys[h.Key]; dup && w != tc.window {
					t.Errorf("key %q counts in window %q and in %q", h.Key, w, tc.window)
				}
				keys[h.Key] = tc.window
			}
			if !slices.Equal(rates, tc.rates) {
				t.Errorf("rates %v, want %v", rates, tc.rates)
			}
		})
	}
	if len(keys) != 4 {
		t.Errorf("%d distinct keys, want 4 (own, quiet, two of the weekend nights)", len(keys))
	}
}

// The clock is read once per plan, and not at all without schedules.
func TestScheduleClockReads(t *testing.T) {
	c := scheduledConfig(t, scheduled+`  - key: plain
    rate_limit: {unit: second, requests_per_unit: 1}
`)
	reads := 0
	p := rules.Plan{Now: func() time.Time { reads++; return time.Now() }}
	if err := c.Plan("geo", []rules.Descriptor{desc("plain=x")}, &p); err != nil {
		t.Fatal(err)
	}
	if reads != 0 {
		t.Errorf("a plan without schedules read the clock %d times", reads)
	}
	if err := c.Plan("geo", []rules.Descriptor{desc("country=IN"), desc("country=IN"), desc("plain=y")}, &p); err != nil {
		t.Fatal(err)
	}
	if reads != 1 {
		t.Errorf("a plan with two scheduled descriptors read the clock %d times, want 1", reads)
	}
}

// A runtime override replaces the scheduled limits as it replaces the
// rule's own.
func TestScheduleRuntimeOverride(t *testing.T) {
	c := scheduledConfig(t, scheduled)
	p := rules.Plan{
		Now:     func() time.Time { return time.Date(2026, 12, 1, 21, 0, 0, 0, time.UTC) }, // quiet hours
		Runtime: fixedRuntime{id: "ovr", rate: 7},
	}
	if err := c.Plan("geo", []rules.Descriptor{desc("country=IN")}, &p); err != nil {
		t.Fatal(err)
	}
	m := p.Matches[0]
	if m.Runtime != "ovr" || m.Schedule != nil || m.Count != 1 || p.Hits[m.First].Limit.Rate != 7 {
		t.Errorf("runtime %q schedule %v hits %d: want the override alone", m.Runtime, m.Schedule, m.Count)
	}
}

func TestScheduleProblems(t *testing.T) {
	for _, tc := range []struct {
		name, entry string
		line        int
		want        string
	}{
		{"unknown zone", `days: [mon], from: "01:00", to: "02:00", tz: Mars/Olympus, rate_limit: {unit: second, requests_per_unit: 1}`, 6, `unknown time zone "Mars/Olympus"`},
		{"no zone", `from: "01:00", to: "02:00", rate_limit: {unit: second, requests_per_unit: 1}`, 6, "needs tz:"},
		{"empty days", `days: [], from: "01:00", to: "02:00", tz: UTC, rate_limit: {unit: second, requests_per_unit: 1}`, 6, "days is empty"},
		{"bad day", `days: [monday], from: "01:00", to: "02:00", tz: UTC, rate_limit: {unit: second, requests_per_unit: 1}`, 6, `unknown day "monday"`},
		{"bad time", `from: "1:00", to: "02:00", tz: UTC, rate_limit: {unit: second, requests_per_unit: 1}`, 6, `from: time "1:00"`},
		{"24:00 as a start", `from: "24:00", to: "02:00", tz: UTC, rate_limit: {unit: second, requests_per_unit: 1}`, 6, "want 00:00 to 23:59"},
		{"no limit", `from: "01:00", to: "02:00", tz: UTC`, 6, "needs rate_limit or rate_limits"},
		{"a name of its own", `from: "01:00", to: "02:00", tz: UTC, rate_limit: {name: x, unit: second, requests_per_unit: 1}`, 6, "belong to the descriptor's own rate_limit"},
		{"unknown key", `from: "01:00", to: "02:00", tz: UTC, until: "03:00", rate_limit: {unit: second, requests_per_unit: 1}`, 6, `until`},
		{"bad limit", `from: "01:00", to: "02:00", tz: UTC, rate_limit: {unit: fortnight, requests_per_unit: 1}`, 6, "fortnight"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := "domain: geo\ndescriptors:\n  - key: country\n    rate_limit: {unit: minute, requests_per_unit: 100}\n    schedules:\n      - {" + tc.entry + "}\n"
			_, err := rules.Parse("geo.yaml", []byte(src))
			var e *rules.Error
			if !errors.As(err, &e) {
				t.Fatalf("Parse: %v, want the problems", err)
			}
			for _, p := range e.Problems {
				if p.Line == tc.line && strings.Contains(p.Msg, tc.want) {
					return
				}
			}
			t.Errorf("problems %v, want one at line %d with %q", e.Problems, tc.line, tc.want)
		})
	}
	_, err := rules.Parse("geo.yaml", []byte("domain: geo\ndescriptors:\n  - key: country\n    rate_limit: {unit: minute, requests_per_unit: 1}\n    schedules:\n      - {name: schedule 2, from: \"01:00\", to: \"02:00\", tz: UTC, rate_limit: {unit: second, requests_per_unit: 1}}\n      - {from: \"03:00\", to: \"04:00\", tz: UTC, rate_limit: {unit: second, requests_per_unit: 1}}\n"))
	if err == nil || !strings.Contains(err.Error(), `geo.yaml:7:`) || !strings.Contains(err.Error(), `schedule name "schedule 2" is used twice in one descriptor (first at line 6)`) {
		t.Errorf("a repeated schedule name: %v", err)
	}
	_, err = rules.Parse("geo.yaml", []byte("domain: geo\ndescriptors:\n  - key: country\n    schedules:\n      - {from: \"01:00\", to: \"02:00\", tz: UTC, rate_limit: {unit: second, requests_per_unit: 1}}\n"))
	if err == nil || !strings.Contains(err.Error(), "need the descriptor's own rate_limit") {
		t.Errorf("schedules without the rule's own limit: %v", err)
	}
}

// sluice check's lints: a window that overlaps an earlier one, and one that
// earlier ones cover wholly.
func TestScheduleLints(t *testing.T) {
	d, err := rules.Parse("geo.yaml", []byte(`domain: geo
descriptors:
  - key: country
    rate_limit: {unit: minute, requests_per_unit: 100}
    schedules:
      - {name: nights, from: "22:00", to: "06:00", tz: Europe/Berlin, rate_limit: {unit: minute, requests_per_unit: 5}}
      - {name: early, days: [mon-fri], from: "05:00", to: "08:00", tz: Europe/Berlin, rate_limit: {unit: minute, requests_per_unit: 50}}
      - {name: small hours, days: [sat], from: "01:00", to: "02:00", tz: Europe/Berlin, rate_limit: {unit: minute, requests_per_unit: 1}}
      - {name: apart, days: [sun], from: "12:00", to: "13:00", tz: Europe/Berlin, rate_limit: {unit: minute, requests_per_unit: 1}}
`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range d.Warnings {
		got = append(got, w.String())
	}
	all := strings.Join(got, "\n")
	if !strings.Contains(all, `:7:`) || !strings.Contains(all, `"early" overlaps "nights" (line 6)`) {
		t.Errorf("warnings\n%s\nwant early overlapping nights at line 7", all)
	}
	if !strings.Contains(all, `:8:`) || !strings.Contains(all, `"small hours" never applies`) {
		t.Errorf("warnings\n%s\nwant small hours unreachable at line 8", all)
	}
	if strings.Contains(all, `"apart"`) || strings.Contains(all, `"nights"" `) {
		t.Errorf("warnings\n%s\nname a window that neither overlaps nor is covered", all)
	}
	if len(got) != 2 {
		t.Errorf("%d warnings, want 2:\n%s", len(got), all)
	}
}

// fixedRuntime overrides every descriptor with one limit.
type fixedRuntime struct {
	id   string
	rate int64
}

func (f fixedRuntime) Match(string, []rules.Entry) (rules.RuntimeMatch, bool) {
	return rules.RuntimeMatch{ID: f.id, Limits: []*sluice.Limit{{Rate: f.rate, Period: time.Minute}}}, true
}
