// Package calendar is the wall-clock arithmetic of rules that follow the
// clock: the windows of a schedule ("mon-fri, 01:00 to 06:00,
// Asia/Kolkata") and calendar periods (the day, the week from Monday, the
// month from an anchor day, the year, in a time zone). It does no I/O and
// never reads the clock: every function is given "now", which for a
// decision is the store's clock.
//
// Local times that a daylight-saving change skips or repeats are resolved
// as a person reading the rule expects, the same way everywhere:
//
//   - a wall-clock time the clock skips (02:30 on a day the clock goes from
//     02:00 to 03:00) happens at the instant of the jump, the first instant
//     whose local time is past it: a window "from 02:30" starts at 03:00
//     that day, one "to 02:30" ends then;
//   - a wall-clock time the clock shows twice (01:30 on a day it goes from
//     02:00 back to 01:00) is its first occurrence: a window "01:00 to
//     01:30" lasts half an hour that day, and the repeated half hour is
//     outside it.
//
// So a window or a period never has a negative length, a day of 23 or 25
// hours is one period of 23 or 25 hours, and "midnight" is the first
// instant of the local date (in the few zones whose clocks jump at
// midnight, the instant of the jump).
package calendar

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Boundary returns the instant at which the local wall clock of loc shows
// the date y-m-d and the time min minutes after midnight (0 to 1440, 1440
// being the next day's midnight), resolving skipped and repeated times as
// the package doc says. y, m and d are normalized as time.Date does.
func Boundary(y int, m time.Month, d int, min int, loc *time.Location) time.Time {
	// The wall time as if it were UTC: the instant is this minus the
	// zone's offset at that instant.
	naive := time.Date(y, m, d, 0, min, 0, 0, time.UTC).Unix()
	// The offsets in force around it: a transition changes the offset at
	// most once within a day in every zone of the tz database.
	var first int64
	found := false
	var offs [2]int
	_, offs[0] = time.Unix(naive-2*86400, 0).In(loc).Zone()
	_, offs[1] = time.Unix(naive+2*86400, 0).In(loc).Zone()
	for i, o := range offs {
		if i == 1 && o == offs[0] {
			break
		}
		u := naive - int64(o)
		if _, got := time.Unix(u, 0).In(loc).Zone(); got == o && (!found || u < first) {
			first, found = u, true
		}
	}
	if found {
		return time.Unix(first, 0).In(loc)
	}
	// Skipped: the clock jumps over the time. The jump is the end of the
	// zone in force just before it, which shows a wall time earlier than
	// the one asked for under the larger offset.
	hi := max(offs[0], offs[1])
	_, end := time.Unix(naive-int64(hi), 0).In(loc).ZoneBounds()
	return end.In(loc)
}

// Midnight returns the first instant of the local date of t in loc.
func Midnight(t time.Time, loc *time.Location) time.Time {
	y, m, d := t.In(loc).Date()
	return Boundary(y, m, d, 0, loc)
}

// Days is a set of weekdays: bit i is time.Weekday(i). The zero set means
// every day.
type Days uint8

// EveryDay holds all seven days.
const EveryDay Days = 1<<7 - 1

// Has says whether d holds w (the zero set holds every day).
func (d Days) Has(w time.Weekday) bool { return d == 0 || d&(1<<w) != 0 }

var dayNames = []string{"sun", "mon", "tue", "wed", "thu", "fri", "sat"}

func parseDay(s string) (time.Weekday, bool) {
	s = strings.ToLower(strings.TrimSpace(s))
	for i, n := range dayNames {
		if s == n {
			return time.Weekday(i), true
		}
	}
	return 0, false
}

// ParseDays reads a list of days: names mon to sun, and ranges such as
// mon-fri; a range may wrap the week (fri-mon is Friday to Monday). An
// empty list is every day.
func ParseDays(items []string) (Days, error) {
	var d Days
	for _, it := range items {
		a, b, isRange := strings.Cut(it, "-")
		from, ok := parseDay(a)
		if !ok {
			return 0, fmt.Errorf("unknown day %q (want mon, tue, wed, thu, fri, sat or sun, or a range such as mon-fri)", a)
		}
		to := from
		if isRange {
			if to, ok = parseDay(b); !ok {
				return 0, fmt.Errorf("unknown day %q in %q (want mon to sun)", b, it)
			}
		}
		for w := from; ; w = (w + 1) % 7 {
			d |= 1 << w
			if w == to {
				break
			}
		}
	}
	if d == EveryDay {
		return 0, nil
	}
	return d, nil
}

// String lists the days as ParseDays reads them, mon first.
func (d Days) String() string {
	if d == 0 || d == EveryDay {
		return "every day"
	}
	var out []string
	for i := 1; i <= 7; i++ {
		w := time.Weekday(i % 7)
		if d.Has(w) {
			out = append(out, dayNames[w])
		}
	}
	return strings.Join(out, ",")
}

// ParseClock reads a wall-clock time HH:MM (00:00 to 23:59, and 24:00 for
// the end of the day when end is true) as minutes after midnight.
func ParseClock(s string, end bool) (int, error) {
	h, m, ok := strings.Cut(s, ":")
	hh, err1 := strconv.Atoi(h)
	mm, err2 := strconv.Atoi(m)
	if !ok || len(h) != 2 || len(m) != 2 || err1 != nil || err2 != nil || hh < 0 || mm < 0 || mm > 59 {
		return 0, fmt.Errorf("time %q: want HH:MM, such as 06:00", s)
	}
	v := hh*60 + mm
	if v > 1440 || (v == 1440 && !end) || (hh == 24 && mm != 0) {
		if end {
			return 0, fmt.Errorf("time %q: want 00:00 to 24:00", s)
		}
		return 0, fmt.Errorf("time %q: want 00:00 to 23:59", s)
	}
	return v, nil
}

// A Window is one window of a schedule: on each of its days, from From to
// To (minutes after local midnight in Loc). A window whose To is not after
// its From crosses midnight and ends the next day (22:00 to 06:00); From
// equal to To is a whole 24 hours of wall clock. Days are the days a window
// starts on: "fri 22:00 to 06:00" holds Saturday 03:00.
type Window struct {
	Days     Days
	From, To int
	Loc      *time.Location
}

// occurrence returns the instants of w's occurrence that starts on the
// local date y-m-d (whether or not w holds that day).
func (w Window) occurrence(y int, m time.Month, d int) (start, end time.Time) {
	start = Boundary(y, m, d, w.From, w.Loc)
	if w.To > w.From {
		return start, Boundary(y, m, d, w.To, w.Loc)
	}
	return start, Boundary(y, m, d+1, w.To, w.Loc)
}

// At says whether now is in w, and until when that holds: the end of the
// occurrence now is in (of the run of occurrences that follow on without a
// gap), or the start of the next occurrence. A window that no day holds is
// never in force (until is the zero time).
func (w Window) At(now time.Time) (in bool, until time.Time) {
	local := now.In(w.Loc)
	y, m, d := local.Date()
	// An occurrence lasts at most 25 hours, so one that holds now started
	// on now's local date or the one before.
	// (or, within a repeated hour, on the next one).
	for back := 1; back >= -1; back-- {
		day := d - back
		if !w.Days.Has(time.Date(y, m, day, 12, 0, 0, 0, time.UTC).Weekday()) {
			continue
		}
		start, end := w.occurrence(y, m, day)
		if !now.Before(start) && now.Before(end) {
			// Extend across occurrences that start where this one ends.
			for next := day + 1; next <= day+7 && w.Days.Has(time.Date(y, m, next, 12, 0, 0, 0, time.UTC).Weekday()); next++ {
				s, e := w.occurrence(y, m, next)
				if s.After(end) {
					break
				}
				end = e
			}
			return true, end
		}
	}
	for day := d; day <= d+7; day++ {
		if !w.Days.Has(time.Date(y, m, day, 12, 0, 0, 0, time.UTC).Weekday()) {
			continue
		}
		if start, _ := w.occurrence(y, m, day); start.After(now) {
			return false, start
		}
	}
	return false, time.Time{}
}

// Active returns the index of the first window of ws that holds now (-1 for
// none), and until when that answer holds: the next instant at which a
// different window (or none) applies. until is the zero time when the
// answer never changes (no window ever holds, or one always does).
func Active(ws []Window, now time.Time) (idx int, until time.Time) {
	idx, next := active(ws, now)
	// The answer can only change at one of the windows' boundaries; walk
	// them until it does. A week of boundaries covers every pattern.
	limit := now.Add(8 * 24 * time.Hour)
	for !next.IsZero() && next.Before(limit) {
		i, n := active(ws, next)
		if i != idx {
			return idx, next
		}
		next = n
	}
	return idx, time.Time{}
}

// active returns the first window holding now, and the earliest instant
// after now at which any window starts or stops holding.
func active(ws []Window, now time.Time) (int, time.Time) {
	idx := -1
	var next time.Time
	for i, w := range ws {
		in, until := w.At(now)
		if in && idx < 0 {
			idx = i
		}
		if !until.IsZero() && (next.IsZero() || until.Before(next)) {
			next = until
		}
	}
	return idx, next
}

// Unit is the length of a calendar period.
type Unit int

// The calendar units.
const (
	Day Unit = iota + 1
	Week
	Month
	Year
)

// ParseUnit reads day, week, month or year.
func ParseUnit(s string) (Unit, bool) {
	switch strings.ToLower(s) {
	case "day":
		return Day, true
	case "week":
		return Week, true
	case "month":
		return Month, true
	case "year":
		return Year, true
	}
	return 0, false
}

func (u Unit) String() string {
	switch u {
	case Day:
		return "day"
	case Week:
		return "week"
	case Month:
		return "month"
	case Year:
		return "year"
	}
	return "Unit(" + strconv.Itoa(int(u)) + ")"
}

// A Calendar aligns periods to the local calendar of Loc: days start at
// midnight, weeks on Monday at midnight, months on AnchorDay (1 to 31; 0
// is 1) at midnight, clamped to the month's last day (the 31st is the 28th
// or 29th in February, the 30th in April), and years on AnchorDay of
// AnchorMonth (0 is January), clamped the same way (the 29th of February
// is the 28th in other years).
type Calendar struct {
	Unit        Unit
	Loc         *time.Location
	AnchorDay   int
	AnchorMonth time.Month
}

// daysIn returns the number of days of month m of year y.
func daysIn(y int, m time.Month) int {
	return time.Date(y, m+1, 0, 12, 0, 0, 0, time.UTC).Day()
}

// anchor returns the first instant of the period of c that starts in the
// month m of year y (for Month) or in year y (for Year).
func (c Calendar) anchor(y int, m time.Month) time.Time {
	if c.Unit == Year {
		m = c.AnchorMonth
		if m == 0 {
			m = time.January
		}
	}
	// Normalize y and m first, so that the clamp sees the real month.
	n := time.Date(y, m, 1, 12, 0, 0, 0, time.UTC)
	y, m = n.Year(), n.Month()
	d := max(c.AnchorDay, 1)
	return Boundary(y, m, min(d, daysIn(y, m)), 0, c.Loc)
}

// Period returns the period of c that holds now: its first instant and the
// first instant of the next one.
func (c Calendar) Period(now time.Time) (start, end time.Time) {
	y, m, d := now.In(c.Loc).Date()
	var nth func(k int) time.Time // the start of the k-th period from the one of now's local date
	switch c.Unit {
	case Day:
		nth = func(k int) time.Time { return Boundary(y, m, d+k, 0, c.Loc) }
	case Week:
		monday := d - (int(time.Date(y, m, d, 12, 0, 0, 0, time.UTC).Weekday())+6)%7
		nth = func(k int) time.Time { return Boundary(y, m, monday+7*k, 0, c.Loc) }
	case Month:
		// The period that starts in now's month, or the one before when
		// now is before this month's anchor day.
		if time.Date(y, m, d, 12, 0, 0, 0, time.UTC).Before(time.Date(y, m, min(max(c.AnchorDay, 1), daysIn(y, m)), 12, 0, 0, 0, time.UTC)) {
			m--
		}
		nth = func(k int) time.Time { return c.anchor(y, m+time.Month(k)) }
	case Year:
		if c.anchor(y, 0).After(now) {
			y--
		}
		nth = func(k int) time.Time { return c.anchor(y+k, 0) }
	default:
		panic("calendar: Period of an unknown unit " + c.Unit.String())
	}
	// The local date says which period, except within a repeated hour
	// around a boundary, where the instants decide.
	k := 0
	for nth(k).After(now) {
		k--
	}
	for !nth(k + 1).After(now) {
		k++
	}
	return nth(k), nth(k + 1)
}
