package server

import (
	"context"
	"errors"
	"net/http"

	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/rls"
	"github.com/sluicehq/sluice/rules"
)

// preference reads a client's all_or_nothing default (rls.AllOrNothingKey).
func preference(v string) decide.Preference {
	switch v {
	case "true":
		return decide.PreferAllOrNothing
	case "false":
		return decide.PreferEach
	}
	return decide.PreferDecider
}

// transport is where a request came from, a label of sluice_requests_total.
type transport uint8

const (
	viaGRPC transport = iota
	viaHTTP
	numTransports
)

var transportNames = [numTransports]string{"grpc", "http"}

// result is how a request ended, a label of sluice_requests_total.
type result uint8

const (
	resultOK              result = iota // OK
	resultOverLimit                     // OVER_LIMIT
	resultShadowOverLimit               // OK, but enforcing every limit would have denied it
	resultInvalid                       // InvalidArgument, HTTP 400 or 413
	resultError                         // no configuration, store failure, canceled
	numResults
)

var resultNames = [numResults]string{"ok", "over_limit", "shadow_over_limit", "invalid", "error"}

// RegisterGRPC registers the Envoy rate limit service
// (envoy.service.ratelimit.v3.RateLimitService) and the gRPC health service
// (grpc.health.v1.Health) on g, which must have been made with
// GRPCServerOptions.
func (s *Server) RegisterGRPC(g *grpc.Server) {
	g.RegisterService(&rlsServiceDesc, s)
	registerHealth(g, s)
}

// ShouldRateLimit answers one Envoy rate limit request: the
// RateLimitService method. A malformed request is an InvalidArgument error
// and changes nothing; an unloaded configuration or a store failure is
// Unavailable; an unknown domain or descriptors that match no rule are OK.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	// ValueFromIncomingContext copies only a key that is there (never for
	// Envoy, which sends neither), where FromIncomingContext would copy
	// every header of every request.
	dialect, prefer := rls.DialectEnvoy, decide.PreferDecider
	if v := metadata.ValueFromIncomingContext(ctx, rls.DialectKey); len(v) == 1 && v[0] == rls.DialectExactValue {
		dialect = rls.DialectExact
	}
	if v := metadata.ValueFromIncomingContext(ctx, rls.AllOrNothingKey); len(v) == 1 {
		prefer = preference(v[0])
	}
	o, f := s.answer(ctx, req, viaGRPC, dialect, prefer)
	if f != nil {
		return nil, f.grpcErr()
	}
	resp := o.Response
	s.release(o)
	return resp, nil
}

// answer decides req, answering in dialect, and applies what the server adds: global shadow mode,
// metrics and response headers. The outcome goes back with release; on
// failure there is none.
func (s *Server) answer(ctx context.Context, req *rlsv3.RateLimitRequest, via transport, dialect rls.Dialect, prefer decide.Preference) (*rls.Outcome, *failure) {
	o := s.outcomes.Get().(*rls.Outcome)
	o.Dialect, o.Prefer = dialect, prefer
	start := time.Now()
	err := s.dec.DecideInto(ctx, req, o)
	s.m.latency.Observe(time.Since(start).Seconds())
	if err != nil {
		s.release(o)
		return nil, s.fail(err, via)
	}
	if o.Degraded != rules.FailDefault {
		s.degraded(req.GetDomain(), o, via)
	}
	resp := o.Response
	if s.envoyHdrs != nil {
		// Before global shadow mode turns the overall code, as Envoy.
		resp.ResponseHeadersToAdd = s.envoyHdrs.values(resp, &o.Outcome)
	}
	res := resultOK
	switch {
	case resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT && s.shadow:
		// As envoyproxy/ratelimit: the request is let through, and each
		// descriptor still says what its limit decided.
		res = resultShadowOverLimit
		resp.OverallCode = rlsv3.RateLimitResponse_OK
		if sd := s.m.statsd; sd != nil {
			sd.globalShadow.Inc()
		}
	case resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT:
		res = resultOverLimit
	case o.Overall.Shadow:
		res = resultShadowOverLimit
	}
	s.m.count(req.GetDomain(), o, s.shadow)
	if s.hitters != nil {
		recordHitters(s.hitters, req, o, s.shadow)
	}
	if s.m.statsd != nil && len(req.Descriptors) > 0 && !anyMatched(o) {
		if cfg := s.dec.Rules(); cfg != nil && cfg.Domain(req.GetDomain()) == nil {
			s.m.notFound(req.GetDomain(), len(req.Descriptors))
		}
	}
	// A fail_open answer knows no quota to advertise.
	if s.headers != 0 && o.Degraded != rules.FailOpen {
		hv := s.headerValues(o, resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT)
		if resp.ResponseHeadersToAdd == nil {
			resp.ResponseHeadersToAdd = hv // the common case: no copy
		} else {
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, hv...)
		}
	}
	if s.limitedBy && res == resultOverLimit {
		if hv := limitedBy(o); hv != nil {
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, hv)
		}
	}
	s.m.requests[via][res].Inc()
	return o, nil
}

// release returns o to the pool; its Response stays with the caller.
func (s *Server) release(o *rls.Outcome) {
	o.Reset()
	s.outcomes.Put(o)
}

// failure is a request the server could not answer: what kind of failure
// and its message, which each transport spells its own way (a gRPC status,
// an HTTP status), so that neither goes through the other's codes.
type failure struct {
	kind failKind
	msg  string
}

type failKind uint8

const (
	failInvalid     failKind = iota // the request itself: gRPC InvalidArgument, HTTP 400
	failUnavailable                 // no rules, or the store failed: Unavailable, 503
	failCanceled                    // the caller gave up: Canceled, 499
	failDeadline                    // the caller's deadline passed: DeadlineExceeded, 504
)

func (f *failure) Error() string { return f.msg }

// grpcErr is f as a gRPC status error.
func (f *failure) grpcErr() error {
	code := [...]codes.Code{failInvalid: codes.InvalidArgument, failUnavailable: codes.Unavailable,
		failCanceled: codes.Canceled, failDeadline: codes.DeadlineExceeded}[f.kind]
	return status.Error(code, f.msg)
}

// httpStatus is f's HTTP status.
func (f *failure) httpStatus() int {
	return [...]int{failInvalid: http.StatusBadRequest, failUnavailable: http.StatusServiceUnavailable,
		failCanceled: 499, failDeadline: http.StatusGatewayTimeout}[f.kind] // 499: client closed the request; nobody reads it
}

// fail turns a Decider error into a failure and counts it.
func (s *Server) fail(err error, via transport) *failure {
	if sd := s.m.statsd; sd != nil && (errors.Is(err, rls.ErrInvalid) || errors.Is(err, rls.ErrNoRules)) {
		sd.serviceError.Inc() // envoy-rl's service errors: a bad request, no configuration
	}
	switch {
	case errors.Is(err, rls.ErrInvalid):
		s.m.requests[via][resultInvalid].Inc()
		if errors.Is(err, rls.ErrTooLarge) {
			s.m.tooLarge[via].Inc()
		}
		s.log.Debug("invalid rate limit request", "transport", transportNames[via], "err", err)
		return &failure{failInvalid, err.Error()}
	case errors.Is(err, rls.ErrNoRules):
		s.m.requests[via][resultError].Inc()
		return &failure{failUnavailable, err.Error()}
	case errors.Is(err, context.Canceled):
		s.m.requests[via][resultError].Inc()
		return &failure{failCanceled, err.Error()}
	case errors.Is(err, context.DeadlineExceeded):
		s.m.requests[via][resultError].Inc()
		return &failure{failDeadline, err.Error()}
	default:
		s.m.requests[via][resultError].Inc()
		s.m.storeErrors.Inc()
		if sd := s.m.statsd; sd != nil {
			sd.redisError.Inc()
		}
		if n, ok := s.storeLog.Allow(time.Now()); ok {
			s.log.Warn("rate limit store failed", "transport", transportNames[via], "err", err, "failures_not_logged", n)
		}
		return &failure{failUnavailable, "rate limit store: " + err.Error()}
	}
}

// degraded counts a request of domain that the failure policy o.Degraded
// answered, and logs while the policies answer: one line at once, then
// at most one a minute, with the requests answered since the last line.
func (s *Server) degraded(domain string, o *rls.Outcome, via transport) {
	s.m.degraded(domain, o.Degraded, o.Reason)
	if sd := s.m.statsd; sd != nil {
		sd.redisError.Inc() // the store failed, as envoy-rl counts it
	}
	now := time.Now()
	s.policy.answered(now, o.Reason)
	if n, ok := s.policyLog.Allow(now); ok {
		s.log.Warn("rate limit store could not decide; the failure policy is answering",
			"domain", domain, "policy", o.Degraded.String(), "reason", o.Reason.String(),
			"transport", transportNames[via], "err", o.StoreErr, "answered_since_last_line", n+1)
	}
}

// anyMatched reports whether a descriptor of o matched a rule: then its
// domain is known, and no lookup need say so.
func anyMatched(o *rls.Outcome) bool {
	for i := range o.Descriptors {
		if o.Descriptors[i].Status != rules.NoMatch {
			return true
		}
	}
	return false
}
