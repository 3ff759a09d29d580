package server

import (
	"errors"
	"math"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http/httpguts"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/ratelimitheaders"
	"github.com/sluicehq/sluice/internal/rls"
)

// headerValues builds the rate limit headers of o (see the
// ratelimitheaders package). over is the response's overall code;
// shadow-mode limits, which never deny, are not advertised.
func (s *Server) headerValues(o *rls.Outcome, over bool) []*corev3.HeaderValue {
	deciding := ratelimitheaders.Deciding(&o.Outcome)
	if deciding < 0 {
		return nil
	}
	dl := &o.Limits[deciding]

	n := 0
	if s.headers&ratelimitheaders.HeadersIETF != 0 {
		n += 2
	}
	if s.headers&ratelimitheaders.HeadersXRateLimit != 0 {
		n += 3
	}
	retry := over && s.headers&ratelimitheaders.HeadersRetryAfter != 0
	if retry {
		n++
	}
	hvs := make([]corev3.HeaderValue, n)
	out := make([]*corev3.HeaderValue, 0, n)
	add := func(k, v string) {
		h := &hvs[len(out)]
		h.Key, h.Value = k, v
		out = append(out, h)
	}
	if s.headers&ratelimitheaders.HeadersIETF != 0 {
		b := ratelimitheaders.AppendPolicy(make([]byte, 0, 64), o.Limits)
		add("RateLimit-Policy", string(b))
		add("RateLimit", string(ratelimitheaders.AppendRateLimit(b[:0], dl)))
	}
	if s.headers&ratelimitheaders.HeadersXRateLimit != 0 {
		add("X-RateLimit-Limit", strconv.FormatInt(dl.Decision.Limit, 10))
		add("X-RateLimit-Remaining", strconv.FormatInt(dl.Decision.Remaining, 10))
		add("X-RateLimit-Reset", strconv.FormatInt(ratelimitheaders.Reset(dl), 10))
	}
	if retry {
		add("Retry-After", strconv.FormatInt(ratelimitheaders.RetryAfter(&o.Outcome, dl), 10))
	}
	return out
}

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

// values are the headers envoyproxy/ratelimit adds to resp: those of the
// descriptor with the least remaining count among those with a limit, or
// of the last one over its limit that is not a quota; none when no
// descriptor has a limit.
func (n *EnvoyHeaderNames) values(resp *rlsv3.RateLimitResponse, o *decide.Outcome) []*corev3.HeaderValue {
	var least *rlsv3.RateLimitResponse_DescriptorStatus
	leastLeft := uint32(math.MaxUint32)
	for i, st := range resp.GetStatuses() {
		if st.GetCurrentLimit() != nil && st.GetLimitRemaining() < leastLeft {
			least, leastLeft = st, st.GetLimitRemaining()
		}
		quota := i < len(o.Descriptors) && o.Descriptors[i].Quota
		if st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT && !quota {
			least, leastLeft = st, 0
		}
	}
	if least == nil || least.GetCurrentLimit() == nil {
		return nil
	}
	reset := least.GetDurationUntilReset()
	secs := reset.GetSeconds()
	if reset.GetNanos() > 0 {
		secs++
	}
	hvs := []corev3.HeaderValue{
		{Key: n.Limit, Value: strconv.FormatUint(uint64(least.GetCurrentLimit().GetRequestsPerUnit()), 10)},
		{Key: n.Remaining, Value: strconv.FormatUint(uint64(least.GetLimitRemaining()), 10)},
		{Key: n.Reset, Value: strconv.FormatInt(secs, 10)},
	}
	return []*corev3.HeaderValue{&hvs[0], &hvs[1], &hvs[2]}
}
