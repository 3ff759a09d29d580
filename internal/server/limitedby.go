package server

import (
	"context"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/internal/algo"

	"github.com/sluicehq/sluice/decide"
)

// LimitedByHeader is the header that says why a request was limited.
const LimitedByHeader = "x-sluice-limited-by"

// limitedBy is the x-sluice-limited-by header of a denied request: the
// first descriptor whose limits denied it, as
//
//	rule="api.user"; descriptor=0; algorithm=fixed_window; limit=10/1h0m0s; remaining=0; reset=1834s
//
// or, when a runtime override's limits (not the rule's) denied it, the
// override's ID first:
//
//	override="api|user=bob"; rule="api.user"; descriptor=0; algorithm=fixed_window; limit=2/1h0m0s; remaining=0; reset=1834s
//
// or rule="capacity"; descriptor=-1 when the domain capacity did. It is
// the decide.Hook of Config.LimitedBy: denials only, not those global
// shadow mode let through.
func limitedBy(_ context.Context, _ *decide.Request, o *decide.Outcome, err error) {
	if err != nil || !o.OverLimit() {
		return
	}
	for i := range o.Descriptors {
		d := &o.Descriptors[i]
		if !d.Limited || !d.Over || d.ShadowOver || d.Limit == nil {
			continue
		}
		var b strings.Builder
		if d.Override != "" {
			b.WriteString(`override="`)
			b.WriteString(headerSafe(d.Override))
			b.WriteString(`"; `)
		}
		b.WriteString(`rule="`)
		b.WriteString(headerSafe(d.StatKey))
		b.WriteString(`"; descriptor=`)
		b.WriteString(strconv.Itoa(i))
		b.WriteString("; algorithm=")
		b.WriteString(d.Limit.Algorithm.String())
		b.WriteString("; limit=")
		b.WriteString(strconv.FormatInt(algo.Nominal(d.Limit.Algorithm, d.Limit.Rate, d.Limit.Burst), 10))
		b.WriteByte('/')
		b.WriteString(d.Limit.Period.String())
		b.WriteString("; remaining=")
		b.WriteString(strconv.FormatInt(max(d.Decision.Remaining, 0), 10))
		b.WriteString("; reset=")
		b.WriteString(strconv.FormatInt(int64((d.Decision.ResetAfter+999_999_999)/1_000_000_000), 10))
		b.WriteByte('s')
		o.AddHeader(LimitedByHeader, []byte(b.String()))
		return
	}
	if c := len(o.Limits); c > 0 && o.Limits[c-1].Descriptor < 0 && !o.Limits[c-1].Decision.Allowed {
		o.AddHeader(LimitedByHeader, []byte(`rule="capacity"; descriptor=-1`))
	}
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
