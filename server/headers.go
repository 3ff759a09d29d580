package server

import (
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/sluicehq/sluice/ratelimitheaders"
	"github.com/sluicehq/sluice/rls"
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
