package rules

import (
	"strconv"
	"sync/atomic"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/calendar"
)

// calendarKeys are the keys of a limit's calendar: block.
var calendarKeys = []string{"tz", "anchor_day", "anchor_month"}

// calLimit is a limit whose windows follow the local calendar (the
// `calendar:` extension): the day from midnight, the week from Monday, the
// month from its anchor day, the year from its anchor day and month, in a
// time zone. Each period is decided as a window of the period's own
// length, offset to start where the period starts: a fixed window in a
// counter of the period's own, a sliding window in one counter across
// periods, whose estimate weighs the period before by the share of the
// current one still to run. The limits of the latest period and of the one before are kept, so
// that requests about a boundary (clocks a little apart) share them.
type calLimit struct {
	tmpl      *sluice.Limit // as compiled: Period is the unit's nominal length
	cal       calendar.Calendar
	cur, prev atomic.Pointer[periodLimit]
}

// periodLimit is the limit of one calendar period.
type periodLimit struct {
	start, end time.Time
	limit      *sluice.Limit
	tag        string // appended to the limit's key tag: a fixed window's period start
}

func (p *periodLimit) holds(now time.Time) bool {
	return p != nil && !now.Before(p.start) && now.Before(p.end)
}

// at returns the limit of the period that holds now, its key tag (tag and
// the period's start) and the period's end.
func (c *calLimit) at(now time.Time, tag string) (*sluice.Limit, string, time.Time) {
	if p := c.cur.Load(); p.holds(now) {
		return p.limit, tag + p.tag, p.end
	}
	if p := c.prev.Load(); p.holds(now) {
		return p.limit, tag + p.tag, p.end
	}
	start, end := c.cal.Period(now)
	l := *c.tmpl
	l.Period = end.Sub(start)
	l.WindowOffset = time.Duration(start.UnixNano() % int64(l.Period))
	p := &periodLimit{start: start, end: end, limit: &l}
	if l.Algorithm == sluice.FixedWindow {
		// A counter a period: a new period starts afresh. A sliding
		// window keeps its key, to weigh the period before.
		p.tag = "@" + strconv.FormatInt(start.Unix(), 10)
	}
	switch cur := c.cur.Load(); {
	case cur == nil || cur.start.Before(start):
		if c.cur.CompareAndSwap(cur, p) && cur != nil {
			c.prev.Store(cur)
		}
	default:
		c.prev.Store(p)
	}
	return p.limit, tag + p.tag, end
}

// calendar reads the calendar: block of a limit compiled as l with the
// spec s: the unit must be a day, week, month or year, the algorithm a
// fixed or sliding window.
func (p *parser) calendar(l *sluice.Limit, s *limitSpec) *calLimit {
	pairs, ok := p.Mapping(s.calendar, "calendar")
	if !ok {
		return nil
	}
	at := p.Deref(s.calendar)
	before := len(p.Errs)
	c := &calLimit{tmpl: l}
	var tz, day, month *yaml.Node
	for _, kv := range pairs {
		switch kv.K.Value {
		case "tz":
			tz = kv.V
		case "anchor_day":
			day = kv.V
		case "anchor_month":
			month = kv.V
		default:
			p.unknown(kv.K, "calendar", calendarKeys, false)
		}
	}
	if tz == nil {
		p.Errorf(at, "calendar needs tz: (an IANA time zone such as Europe/Berlin, or UTC)")
	} else {
		c.cal.Loc = p.zone(at, tz)
	}
	c.cal.Unit = p.calendarUnit(l, s, at)
	if day != nil {
		if c.cal.Unit != calendar.Month && c.cal.Unit != calendar.Year {
			p.Errorf(p.Deref(day), "anchor_day applies to unit month or year")
		} else if v, ok := p.integer(day, "anchor_day", 1, 31); ok {
			c.cal.AnchorDay = int(v)
		}
	}
	if month != nil {
		if c.cal.Unit != calendar.Year {
			p.Errorf(p.Deref(month), "anchor_month applies to unit year")
		} else if v, ok := p.integer(month, "anchor_month", 1, 12); ok {
			c.cal.AnchorMonth = time.Month(v)
		}
	}
	if l.Algorithm != sluice.FixedWindow && l.Algorithm != sluice.SlidingWindow {
		p.Errorf(at, "calendar applies to fixed_window and sliding_window, not %s: the buckets refill continuously and have no period to align, and a sliding log or sketch has no periods", l.Algorithm)
	}
	if len(p.Errs) > before {
		return nil
	}
	return c
}

// calendarUnit reads the unit of a limit with a calendar: day, week, month
// or year, once, without unit_multiplier or period.
func (p *parser) calendarUnit(l *sluice.Limit, s *limitSpec, at *yaml.Node) calendar.Unit {
	if s.unit == nil || s.mult != nil || s.period != nil || s.refillAmount != nil {
		p.Errorf(at, "calendar needs unit: day, week, month or year (without unit_multiplier or period)")
		return 0
	}
	name, _ := p.str(s.unit, "unit")
	u, ok := calendar.ParseUnit(name)
	if !ok {
		p.Errorf(p.Deref(s.unit), "calendar needs unit: day, week, month or year, not %s", name)
		return 0
	}
	return u
}
