package rules

import (
	"fmt"
	"strings"
	"time"
)

// Unit is the time unit of an Envoy rate limit. The values are those of
// envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit (and of
// envoy.type.v3.RateLimitUnit), so that transports convert them directly.
type Unit int32

// The units Envoy knows. UnitUnknown is never valid for a limit.
const (
	UnitUnknown Unit = 0
	Second      Unit = 1
	Minute      Unit = 2
	Hour        Unit = 3
	Day         Unit = 4
	Month       Unit = 5
	Year        Unit = 6
	Week        Unit = 7
)

// unitInfo lists the units in the order used in messages. The lengths are
// those of envoyproxy/ratelimit: a month is 30 days and a year 365 days;
// windows are aligned to the Unix epoch.
var unitInfo = []struct {
	unit Unit
	name string
	d    time.Duration
}{
	{Second, "second", time.Second},
	{Minute, "minute", time.Minute},
	{Hour, "hour", time.Hour},
	{Day, "day", 24 * time.Hour},
	{Week, "week", 7 * 24 * time.Hour},
	{Month, "month", 30 * 24 * time.Hour},
	{Year, "year", 365 * 24 * time.Hour},
}

// unitNames is the list of unit names for error messages.
const unitNames = "second, minute, hour, day, week, month, year"

// ParseUnit returns the unit with the given name, ignoring case as Envoy
// does ("second", "SECOND", "Second").
func ParseUnit(s string) (Unit, error) {
	for _, u := range unitInfo {
		if strings.EqualFold(s, u.name) {
			return u.unit, nil
		}
	}
	return UnitUnknown, fmt.Errorf("invalid rate limit unit '%s' (want one of %s)", s, unitNames)
}

// Duration returns the length of the unit, or 0 for an unknown unit.
func (u Unit) Duration() time.Duration {
	for _, i := range unitInfo {
		if i.unit == u {
			return i.d
		}
	}
	return 0
}

// String returns the lower-case name of the unit, e.g. "minute".
func (u Unit) String() string {
	for _, i := range unitInfo {
		if i.unit == u {
			return i.name
		}
	}
	if u == UnitUnknown {
		return "unknown"
	}
	return fmt.Sprintf("rules.Unit(%d)", int32(u))
}
