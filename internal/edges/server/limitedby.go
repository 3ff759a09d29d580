package server

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/base/algo"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/decision/ratelimitheaders"
)

// LimitedByHeader is the header that says why a request was limited.
const LimitedByHeader = "x-sluice-limited-by"

// limitedBy is the x-sluice-limited-by header of a denied request. It
// describes the limit the rate limit headers describe (the deciding
// limit, ratelimitheaders.Deciding), in the same terms:
//
//	rule="api.user"; descriptor=0; algorithm=fixed_window; limit=10/1h0m0s; remaining=0; reset=1834s
//
// limit is the RateLimit-Policy's quota per window (q and w: for a
// bucket, its burst and the time it takes to refill it), and reset is
// the answer's Retry-After, when the request would be admitted. When a
// runtime override's limits (not the rule's) denied it, the override's
// ID comes first:
//
//	override="api|user=bob"; rule="api.user"; descriptor=0; algorithm=fixed_window; limit=2/1h0m0s; remaining=0; reset=1834s
//
// and rule="capacity"; descriptor=-1 when the domain capacity denied it.
// It is the decide.Hook of Config.LimitedBy: denials only, not those
// global shadow mode let through.
func limitedBy(_ context.Context, _ *decide.Request, o *decide.Outcome, err error) {
	if err != nil || !o.OverLimit() {
		return
	}
	i := ratelimitheaders.Deciding(o)
	if i < 0 {
		return
	}
	dl := &o.Limits[i]
	var b strings.Builder
	if dl.Descriptor < 0 || dl.Descriptor >= len(o.Descriptors) {
		b.WriteString(`rule="capacity"; descriptor=-1`)
	} else {
		d := &o.Descriptors[dl.Descriptor]
		if d.Override != "" {
			b.WriteString(`override="`)
			b.WriteString(headerSafe(d.Override))
			b.WriteString(`"; `)
		}
		b.WriteString(`rule="`)
		b.WriteString(headerSafe(d.StatKey))
		b.WriteString(`"; descriptor=`)
		b.WriteString(strconv.Itoa(dl.Descriptor))
	}
	b.WriteString("; algorithm=")
	b.WriteString(dl.Limit.Algorithm.String())
	b.WriteString("; limit=")
	b.WriteString(strconv.FormatInt(algo.Nominal(algo.Kind(dl.Limit.Algorithm), dl.Limit.Rate, dl.Limit.Burst), 10))
	b.WriteByte('/')
	b.WriteString((time.Duration(ratelimitheaders.Window(dl.Limit)) * time.Second).String())
	b.WriteString("; remaining=")
	b.WriteString(strconv.FormatInt(max(dl.Decision.Remaining, 0), 10))
	b.WriteString("; reset=")
	b.WriteString(strconv.FormatInt(ratelimitheaders.RetryAfter(o, dl), 10))
	b.WriteByte('s')
	o.AddHeader(LimitedByHeader, []byte(b.String()))
}

// headerSafe makes s fit in a quoted header value: no quotes, backslashes
// or control characters (a stats key may carry request values).
func headerSafe(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r == '"' || r == '\\' {
			return '?'
		}
		return r
	}, s)
}
