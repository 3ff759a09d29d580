package server

import (
	"context"
	"errors"
	"math"
	"strconv"

	"golang.org/x/net/http/httpguts"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/edges/rls"
	"github.com/sluicehq/sluice/rules"
)

// EnvoyHeaderNames are the names of envoyproxy/ratelimit's own rate limit
// headers (its LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER and
// LIMIT_RESET_HEADER); DefaultEnvoyHeaderNames are its defaults.
type EnvoyHeaderNames struct {
	Limit, Remaining, Reset string
}

// DefaultEnvoyHeaderNames are envoyproxy/ratelimit's default header names.
var DefaultEnvoyHeaderNames = EnvoyHeaderNames{Limit: "RateLimit-Limit", Remaining: "RateLimit-Remaining", Reset: "RateLimit-Reset"}

func (n *EnvoyHeaderNames) validate() error {
	if n == nil {
		return nil
	}
	for _, h := range []string{n.Limit, n.Remaining, n.Reset} {
		if !httpguts.ValidHeaderFieldName(h) {
			return errors.New("Envoy header name " + strconv.Quote(h) + " is not a header name")
		}
	}
	return nil
}

// hook is the decide.Hook of envoyproxy/ratelimit's own headers, added
// to every answer: those of the descriptor with the least remaining count
// among those with a limit, or of the last one over its limit that is not
// a quota; none when no descriptor has a limit (or a fail_open answer,
// which knows none). Register it before decide.GlobalShadow, as Envoy
// sets them before its shadow mode turns the answer.
func (n *EnvoyHeaderNames) hook(_ context.Context, _ *decide.Request, o *decide.Outcome, err error) {
	if err != nil || o.Degraded == rules.FailOpen {
		return
	}
	least := -1
	leastLeft := uint32(math.MaxUint32)
	for i := range o.Descriptors {
		do := &o.Descriptors[i]
		if !do.Limited {
			continue
		}
		left := clampUint32(do.Decision.Remaining)
		if left < leastLeft {
			least, leastLeft = i, left
		}
		if !do.Decision.Allowed && !do.Quota {
			least, leastLeft = i, 0
		}
	}
	if least < 0 {
		return
	}
	do := &o.Descriptors[least]
	var b [24]byte
	o.AddHeader(n.Limit, strconv.AppendUint(b[:0], uint64(clampUint32(do.Limit.Rate)), 10))
	o.AddHeader(n.Remaining, strconv.AppendUint(b[:0], uint64(clampUint32(do.Decision.Remaining)), 10))
	o.AddHeader(n.Reset, strconv.AppendInt(b[:0], rls.WholeSeconds(rls.UntilReset(do.Limit, &do.Decision)), 10))
}

func clampUint32(v int64) uint32 {
	return uint32(min(max(v, 0), math.MaxUint32))
}
