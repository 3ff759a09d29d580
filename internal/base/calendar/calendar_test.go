package calendar

import (
	"math/rand/v2"
	"testing"
	"time"
)

func zone(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("time zone %s: %v", name, err)
	}
	return loc
}

func utc(t testing.TB, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestBoundary(t *testing.T) {
	for _, c := range []struct {
		name, tz string
		y        int
		m        time.Month
		d, min   int
		want     string
	}{
		{"plain", "Asia/Kolkata", 2026, 12, 1, 60, "2026-11-30T19:30:00Z"},
		{"midnight", "Europe/Berlin", 2026, 12, 15, 0, "2026-12-14T23:00:00Z"},
		{"24:00 is the next midnight", "Europe/Berlin", 2026, 12, 15, 1440, "2026-12-15T23:00:00Z"},
		{"Berlin skips 02:30: the jump", "Europe/Berlin", 2026, 3, 29, 150, "2026-03-29T01:00:00Z"},
		{"Berlin after the jump", "Europe/Berlin", 2026, 3, 29, 180, "2026-03-29T01:00:00Z"},
		{"Berlin repeats 02:30: the first", "Europe/Berlin", 2026, 10, 25, 150, "2026-10-25T00:30:00Z"},
		{"New York skips 02:30: the jump", "America/New_York", 2026, 3, 8, 150, "2026-03-08T07:00:00Z"},
		{"New York repeats 01:30: the first", "America/New_York", 2026, 11, 1, 90, "2026-11-01T05:30:00Z"},
		{"New York after the repeat", "America/New_York", 2026, 11, 1, 120, "2026-11-01T07:00:00Z"},
		{"Sydney skips 02:30 in October", "Australia/Sydney", 2026, 10, 4, 150, "2026-10-03T16:00:00Z"},
		{"Samoa skipped 30 December 2011", "Pacific/Apia", 2011, 12, 30, 720, "2011-12-30T10:00:00Z"},
		{"normalized date", "UTC", 2026, 2, 29, 0, "2026-03-01T00:00:00Z"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Boundary(c.y, c.m, c.d, c.min, zone(t, c.tz))
			if want := utc(t, c.want); !got.Equal(want) {
				t.Errorf("Boundary(%d-%02d-%02d %02d:%02d %s) = %v, want %v", c.y, c.m, c.d, c.min/60, c.min%60, c.tz, got.UTC(), want)
			}
		})
	}
}

func TestParseDays(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want string
		err  bool
	}{
		{nil, "every day", false},
		{[]string{"mon-fri"}, "mon,tue,wed,thu,fri", false},
		{[]string{"Sat", "sun"}, "sat,sun", false},
		{[]string{"fri-mon"}, "mon,fri,sat,sun", false},
		{[]string{"mon-sun"}, "every day", false},
		{[]string{"wed", "mon-tue"}, "mon,tue,wed", false},
		{[]string{"monday"}, "", true},
		{[]string{"mon-"}, "", true},
		{[]string{""}, "", true},
	} {
		d, err := ParseDays(c.in)
		if (err != nil) != c.err || (err == nil && d.String() != c.want) {
			t.Errorf("ParseDays(%q) = %v, %v; want %q (error %v)", c.in, d, err, c.want, c.err)
		}
	}
}

func TestParseClock(t *testing.T) {
	for _, c := range []struct {
		in   string
		end  bool
		want int
		err  bool
	}{
		{"00:00", false, 0, false},
		{"06:30", false, 390, false},
		{"23:59", false, 1439, false},
		{"24:00", true, 1440, false},
		{"24:00", false, 0, true},
		{"24:01", true, 0, true},
		{"6:00", false, 0, true},
		{"06:60", false, 0, true},
		{"25:00", true, 0, true},
		{"-1:00", false, 0, true},
		{"0600", false, 0, true},
	} {
		got, err := ParseClock(c.in, c.end)
		if (err != nil) != c.err || got != c.want {
			t.Errorf("ParseClock(%q, %v) = %d, %v; want %d (error %v)", c.in, c.end, got, err, c.want, c.err)
		}
	}
}

func window(t testing.TB, days []string, from, to, tz string) Window {
	t.Helper()
	d, err := ParseDays(days)
	if err != nil {
		t.Fatal(err)
	}
	f, err := ParseClock(from, false)
	if err != nil {
		t.Fatal(err)
	}
	e, err := ParseClock(to, true)
	if err != nil {
		t.Fatal(err)
	}
	return Window{Days: d, From: f, To: e, Loc: zone(t, tz)}
}

func TestWindowAt(t *testing.T) {
	quiet := window(t, []string{"mon-fri"}, "01:00", "06:00", "Asia/Kolkata")
	night := window(t, []string{"fri"}, "22:00", "06:00", "Europe/Berlin")
	early := window(t, nil, "01:00", "05:00", "Europe/Berlin")
	skipped := window(t, nil, "02:30", "03:30", "America/New_York")
	allDay := window(t, []string{"sat-sun"}, "00:00", "00:00", "Europe/Berlin")
	for _, c := range []struct {
		name  string
		w     Window
		now   string
		in    bool
		until string
	}{
		{"weekday inside", quiet, "2026-12-01T21:00:00Z" /* Wed 02:30 IST */, true, "2026-12-02T00:30:00Z"},
		{"weekday before", quiet, "2026-11-30T19:00:00Z" /* Tue 00:30 IST */, false, "2026-11-30T19:30:00Z"},
		{"Saturday: next is Monday", quiet, "2026-12-04T21:00:00Z" /* Sat 02:30 IST */, false, "2026-12-06T19:30:00Z"},
		{"Friday night, Saturday morning", night, "2026-12-05T02:00:00Z" /* Sat 03:00 CET */, true, "2026-12-05T05:00:00Z"},
		{"Friday before it", night, "2026-12-04T20:00:00Z" /* Fri 21:00 */, false, "2026-12-04T21:00:00Z"},
		{"Sunday: next Friday", night, "2026-12-06T02:00:00Z" /* Sun 03:00 */, false, "2026-12-11T21:00:00Z"},
		{"23-hour day: 3 hours", early, "2026-03-29T00:30:00Z", true, "2026-03-29T03:00:00Z"},
		{"23-hour day: starts at 01:00 CET", early, "2026-03-28T23:59:00Z", false, "2026-03-29T00:00:00Z"},
		{"25-hour day: 5 hours", early, "2026-10-24T23:30:00Z", true, "2026-10-25T04:00:00Z"},
		{"25-hour day: starts at 01:00 CEST", early, "2026-10-24T22:30:00Z", false, "2026-10-24T23:00:00Z"},
		{"starts at the jump over 02:30", skipped, "2026-03-08T06:59:00Z", false, "2026-03-08T07:00:00Z"},
		{"in from the jump", skipped, "2026-03-08T07:00:00Z", true, "2026-03-08T07:30:00Z"},
		{"a weekend of whole days", allDay, "2026-12-05T12:00:00Z", true, "2026-12-06T23:00:00Z"},
		{"a weekend of whole days, from Friday", allDay, "2026-12-04T12:00:00Z", false, "2026-12-04T23:00:00Z"},
	} {
		t.Run(c.name, func(t *testing.T) {
			in, until := c.w.At(utc(t, c.now))
			if in != c.in || !until.Equal(utc(t, c.until)) {
				t.Errorf("At(%s) = %v until %v, want %v until %s", c.now, in, until.UTC(), c.in, c.until)
			}
		})
	}
}

func TestActive(t *testing.T) {
	ws := []Window{
		window(t, []string{"mon-fri"}, "09:00", "17:00", "UTC"),
		window(t, nil, "08:00", "20:00", "UTC"),
	}
	for _, c := range []struct {
		now, until string
		idx        int
	}{
		{"2026-11-30T10:00:00Z", "2026-11-30T17:00:00Z", 0},
		{"2026-11-30T08:30:00Z", "2026-11-30T09:00:00Z", 1},
		{"2026-11-30T17:30:00Z", "2026-11-30T20:00:00Z", 1},
		{"2026-11-30T21:00:00Z", "2026-12-01T08:00:00Z", -1},
		{"2026-12-05T10:00:00Z", "2026-12-05T20:00:00Z", 1}, // Saturday
	} {
		idx, until := Active(ws, utc(t, c.now))
		if idx != c.idx || !until.Equal(utc(t, c.until)) {
			t.Errorf("Active(%s) = %d until %v, want %d until %s", c.now, idx, until.UTC(), c.idx, c.until)
		}
	}
	always := []Window{window(t, nil, "00:00", "24:00", "Europe/Berlin")}
	if idx, until := Active(always, utc(t, "2026-03-29T12:00:00Z")); idx != 0 || !until.IsZero() {
		t.Errorf("a window of every whole day: %d until %v, want 0 for ever", idx, until)
	}
	if idx, until := Active(nil, utc(t, "2026-03-29T12:00:00Z")); idx != -1 || !until.IsZero() {
		t.Errorf("no windows: %d until %v, want -1 for ever", idx, until)
	}
}

func TestPeriod(t *testing.T) {
	for _, c := range []struct {
		name       string
		cal        Calendar
		now        string
		start, end string
	}{
		{"day, 23 hours", Calendar{Unit: Day, Loc: zone(t, "Europe/Berlin")}, "2026-03-29T12:00:00Z", "2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z"},
		{"day, 25 hours", Calendar{Unit: Day, Loc: zone(t, "Europe/Berlin")}, "2026-10-25T12:00:00Z", "2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z"},
		{"day, New York 25 hours", Calendar{Unit: Day, Loc: zone(t, "America/New_York")}, "2026-11-01T06:30:00Z", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"},
		{"week from Monday", Calendar{Unit: Week, Loc: zone(t, "Europe/Berlin")}, "2026-12-02T12:00:00Z", "2026-11-29T23:00:00Z", "2026-12-06T23:00:00Z"},
		{"week, on Monday at midnight", Calendar{Unit: Week, Loc: zone(t, "Europe/Berlin")}, "2026-11-29T23:00:00Z", "2026-11-29T23:00:00Z", "2026-12-06T23:00:00Z"},
		{"month from the 1st", Calendar{Unit: Month, Loc: time.UTC}, "2026-12-31T23:59:59Z", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		{"anchor 15 in Berlin, just past", Calendar{Unit: Month, Loc: zone(t, "Europe/Berlin"), AnchorDay: 15}, "2026-12-14T23:30:00Z", "2026-12-14T23:00:00Z", "2027-01-14T23:00:00Z"},
		{"anchor 15 in Berlin, just before", Calendar{Unit: Month, Loc: zone(t, "Europe/Berlin"), AnchorDay: 15}, "2026-12-14T22:59:59Z", "2026-11-14T23:00:00Z", "2026-12-14T23:00:00Z"},
		{"anchor 31, leap February", Calendar{Unit: Month, Loc: time.UTC, AnchorDay: 31}, "2028-02-15T00:00:00Z", "2028-01-31T00:00:00Z", "2028-02-29T00:00:00Z"},
		{"anchor 31 from the 29th of a leap February", Calendar{Unit: Month, Loc: time.UTC, AnchorDay: 31}, "2028-02-29T10:00:00Z", "2028-02-29T00:00:00Z", "2028-03-31T00:00:00Z"},
		{"anchor 31, February 28th", Calendar{Unit: Month, Loc: time.UTC, AnchorDay: 31}, "2027-02-28T10:00:00Z", "2027-02-28T00:00:00Z", "2027-03-31T00:00:00Z"},
		{"anchor 31, April", Calendar{Unit: Month, Loc: time.UTC, AnchorDay: 31}, "2027-04-30T10:00:00Z", "2027-04-30T00:00:00Z", "2027-05-31T00:00:00Z"},
		{"anchor 30, leap February", Calendar{Unit: Month, Loc: time.UTC, AnchorDay: 30}, "2028-03-01T00:00:00Z", "2028-02-29T00:00:00Z", "2028-03-30T00:00:00Z"},
		{"anchor 30, February before its end", Calendar{Unit: Month, Loc: time.UTC, AnchorDay: 30}, "2027-02-27T10:00:00Z", "2027-01-30T00:00:00Z", "2027-02-28T00:00:00Z"},
		{"anchor 29, common February", Calendar{Unit: Month, Loc: time.UTC, AnchorDay: 29}, "2027-02-28T10:00:00Z", "2027-02-28T00:00:00Z", "2027-03-29T00:00:00Z"},
		{"anchor 29, leap February", Calendar{Unit: Month, Loc: time.UTC, AnchorDay: 29}, "2028-02-28T10:00:00Z", "2028-01-29T00:00:00Z", "2028-02-29T00:00:00Z"},
		{"anchor 31 in January", Calendar{Unit: Month, Loc: time.UTC, AnchorDay: 31}, "2027-01-15T00:00:00Z", "2026-12-31T00:00:00Z", "2027-01-31T00:00:00Z"},
		{"year", Calendar{Unit: Year, Loc: zone(t, "Asia/Tokyo")}, "2026-12-31T15:00:00Z", "2026-12-31T15:00:00Z", "2027-12-31T15:00:00Z"},
		{"year from the 29th of February", Calendar{Unit: Year, Loc: time.UTC, AnchorMonth: time.February, AnchorDay: 29}, "2027-03-01T00:00:00Z", "2027-02-28T00:00:00Z", "2028-02-29T00:00:00Z"},
		{"year before its anchor", Calendar{Unit: Year, Loc: time.UTC, AnchorMonth: time.July, AnchorDay: 1}, "2027-03-01T00:00:00Z", "2026-07-01T00:00:00Z", "2027-07-01T00:00:00Z"},
	} {
		t.Run(c.name, func(t *testing.T) {
			start, end := c.cal.Period(utc(t, c.now))
			if !start.Equal(utc(t, c.start)) || !end.Equal(utc(t, c.end)) {
				t.Errorf("Period(%s) = [%v, %v), want [%s, %s)", c.now, start.UTC(), end.UTC(), c.start, c.end)
			}
		})
	}
}

// The periods of a calendar tile time: every instant is in exactly one,
// and each starts where the one before ends, across years of daylight
// saving changes in zones north and south of the equator.
func TestPeriodsTile(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	zones := []string{"UTC", "Europe/Berlin", "America/New_York", "Australia/Sydney", "Asia/Kolkata", "America/Santiago", "Pacific/Apia"}
	from := utc(t, "2011-06-01T00:00:00Z").Unix()
	to := utc(t, "2030-01-01T00:00:00Z").Unix()
	for _, z := range zones {
		loc := zone(t, z)
		for _, cal := range []Calendar{
			{Unit: Day, Loc: loc}, {Unit: Week, Loc: loc},
			{Unit: Month, Loc: loc, AnchorDay: 1}, {Unit: Month, Loc: loc, AnchorDay: 29},
			{Unit: Month, Loc: loc, AnchorDay: 31}, {Unit: Year, Loc: loc, AnchorMonth: 2, AnchorDay: 29},
		} {
			for range 2000 {
				now := time.Unix(from+rnd.Int64N(to-from), 0)
				start, end := cal.Period(now)
				if now.Before(start) || !now.Before(end) {
					t.Fatalf("%s %v anchor %d: Period(%v) = [%v, %v) does not hold it", z, cal.Unit, cal.AnchorDay, now.UTC(), start.UTC(), end.UTC())
				}
				if s, _ := cal.Period(end); !s.Equal(end) {
					t.Fatalf("%s %v: the period after [%v, %v) starts at %v", z, cal.Unit, start.UTC(), end.UTC(), s.UTC())
				}
				if _, e := cal.Period(start.Add(-time.Second)); !e.Equal(start) {
					t.Fatalf("%s %v: the period before [%v, %v) ends at %v", z, cal.Unit, start.UTC(), end.UTC(), e.UTC())
				}
			}
		}
	}
}

// At and Active agree with a minute-by-minute walk: until is the first
// minute at which the answer changes.
func TestWindowsWalk(t *testing.T) {
	ws := []Window{
		window(t, []string{"mon-fri"}, "01:00", "06:00", "Europe/Berlin"),
		window(t, []string{"fri-sat"}, "22:00", "02:30", "Europe/Berlin"),
		window(t, []string{"sun"}, "00:00", "00:00", "America/New_York"),
	}
	// Both of Berlin's changes of 2026 and New York's.
	for _, start := range []string{"2026-03-06T00:00:00Z", "2026-03-27T00:00:00Z", "2026-10-23T00:00:00Z", "2026-10-30T00:00:00Z"} {
		now := utc(t, start)
		end := now.Add(10 * 24 * time.Hour)
		idx, until := Active(ws, now)
		for m := now.Add(time.Minute); m.Before(end); m = m.Add(time.Minute) {
			i, _ := active(ws, m)
			if m.Before(until) && i != idx {
				t.Fatalf("from %v: Active said %d until %v, but at %v it is %d", now.UTC(), idx, until.UTC(), m.UTC(), i)
			}
			if !m.Before(until) {
				if i == idx {
					t.Fatalf("from %v: Active said %d until %v, but it still is at %v", now.UTC(), idx, until.UTC(), m.UTC())
				}
				now = m
				idx, until = Active(ws, now)
			}
		}
	}
}
