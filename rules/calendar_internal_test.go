package rules

import (
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/calendar"
)

// Requests about a boundary, from clocks a little apart, alternate between
// two periods: both limits are kept, not made again for each request.
func TestCalendarKeepsTwoPeriods(t *testing.T) {
	c := &calLimit{tmpl: &sluice.Limit{Rate: 10, Period: 24 * time.Hour}, cal: calendar.Calendar{Unit: calendar.Day, Loc: time.UTC}}
	midnight := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	before, _, end := c.at(midnight.Add(-time.Millisecond), "t")
	after, tag, _ := c.at(midnight, "t")
	if before == after || !end.Equal(midnight) || tag != "t@"+strconv.FormatInt(midnight.Unix(), 10) {
		t.Fatalf("the two days: %p %p, end %v, tag %q", before, after, end, tag)
	}
	for i := range 10 {
		at := midnight.Add(time.Duration(i%2*2-1) * time.Millisecond) // before, after, before, ...
		l, _, _ := c.at(at, "t")
		if want := map[bool]*sluice.Limit{true: before, false: after}[at.Before(midnight)]; l != want {
			t.Fatalf("request %d at %v: a new limit %p", i, at, l)
		}
	}
	if err := after.Validate(); err != nil || after.WindowOffset != 0 {
		t.Errorf("a UTC day: %v, offset %v", err, after.WindowOffset)
	}
}
