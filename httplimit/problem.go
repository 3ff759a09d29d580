package httplimit

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/internal/base/algo"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/decision/ratelimitheaders"
)

// The problem types (RFC 9457) of the middleware's error bodies. Each is
// the address of its own documentation.
const (
	// ProblemRateLimited is the type of a denial: the request exceeded a
	// rate limit. Its body has, besides type, title, status and detail:
	//
	//	"retry-after": seconds after which the same request may be
	//	               allowed, as the Retry-After header
	//	"violated-policies": [{"name": "...", "quota": 3, "window": 60}]
	//	               the limits that denied the request: the limit's
	//	               name, quota and window in seconds, as in
	//	               RateLimit-Policy
	ProblemRateLimited = "https://pkg.go.dev/github.com/sluicehq/sluice/httplimit#ProblemRateLimited"

	// ProblemInvalidRequest is the type of a 400 answer to a request
	// whose values cannot be limited (see Descriptor); detail names the
	// header or field, never its value.
	ProblemInvalidRequest = "https://pkg.go.dev/github.com/sluicehq/sluice/httplimit#ProblemInvalidRequest"

	// ProblemConcurrency is the type of a denial by Config.Concurrency:
	// too many requests of the same key in flight. Its retry-after is 1.
	ProblemConcurrency = "https://pkg.go.dev/github.com/sluicehq/sluice/httplimit#ProblemConcurrency"

	// ProblemUnavailable is the type of the default 503 answer to a
	// request that could not be decided (see Config.OnError). It carries
	// no detail of the cause, which goes to Config.Logger.
	ProblemUnavailable = "https://pkg.go.dev/github.com/sluicehq/sluice/httplimit#ProblemUnavailable"
)

// problem is an RFC 9457 problem details object.
type problem struct {
	Type       string   `json:"type"`
	Title      string   `json:"title"`
	Status     int      `json:"status"`
	Detail     string   `json:"detail,omitempty"`
	RetryAfter *int64   `json:"retry-after,omitempty"`
	Violated   []policy `json:"violated-policies,omitempty"`
}

// policy is a limit that denied a request.
type policy struct {
	Name   string `json:"name"`
	Quota  int64  `json:"quota"`
	Window int64  `json:"window"`
}

// denial is the problem body of the denied outcome o.
func (m *middleware) denial(o *decide.Outcome) *problem {
	p := &problem{Type: ProblemRateLimited, Title: "Too many requests", Status: m.denyStatus}
	retry := retryAfter(o)
	p.RetryAfter = &retry
	for i := range o.Limits {
		lo := &o.Limits[i]
		l := lo.Limit
		if lo.Decision.Allowed || l.Shadow || listedPolicy(p.Violated, l.Name) {
			continue
		}
		p.Violated = append(p.Violated, policy{Name: l.Name, Quota: algo.Nominal(algo.Kind(l.Algorithm), l.Rate, l.Burst), Window: ratelimitheaders.Window(l)})
	}
	p.Detail = "Rate limit exceeded; retry in " + strconv.FormatInt(retry, 10) + " seconds."
	return p
}

// retryAfter is the Retry-After of the denied outcome o, in seconds: the
// deciding limit's (ratelimitheaders.RetryAfter), or with no limit to
// describe, the overall decision's wait, a minute when it is Never, and at
// least 1.
func retryAfter(o *decide.Outcome) int64 {
	if d := ratelimitheaders.Deciding(o); d >= 0 {
		return ratelimitheaders.RetryAfter(o, &o.Limits[d])
	}
	return max(ratelimitheaders.Seconds(o.Overall.RetryAfter, time.Minute), 1)
}

func listedPolicy(ps []policy, name string) bool {
	for _, p := range ps {
		if p.Name == name {
			return true
		}
	}
	return false
}

// writeProblem writes p as application/problem+json with p.Status.
func writeProblem(w http.ResponseWriter, p *problem) {
	body, err := json.Marshal(p)
	if err != nil { // cannot happen: strings and numbers only
		body = []byte(`{"type":"about:blank","status":` + strconv.Itoa(p.Status) + `}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(p.Status)
	w.Write(append(body, '\n'))
}
