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

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/edges/rls"
	"github.com/sluicehq/sluice/internal/vocab/bounds"
	"github.com/sluicehq/sluice/rules"
)

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

// permitEvent is what became of a permit token, a label of
// sluice_permit_tokens_total.
type permitEvent uint8

const (
	permitIssued   permitEvent = iota // an answer carried a token
	permitReleased                    // a release descriptor gave its permits back: the store held one at least
	permitStale                       // the store held none of them any more: released before (a replay), or expired
	permitRefused                     // a release descriptor's token was malformed or named none of its permits
	permitFailed                      // the store failed to give them back
	numPermitEvents
)

var permitEventNames = [numPermitEvents]string{"issued", "released", "stale", "refused", "failed"}

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
	exact, prefer := false, decide.PreferDecider
	if v := metadata.ValueFromIncomingContext(ctx, rls.DialectKey); len(v) == 1 && v[0] == rls.DialectExactValue {
		exact = true
	}
	if v := metadata.ValueFromIncomingContext(ctx, rls.AllOrNothingKey); len(v) == 1 {
		prefer = rls.Preference(v[0])
	}
	resp, f := s.answer(ctx, req, viaGRPC, exact, prefer)
	if f != nil {
		return nil, f.grpcErr()
	}
	return resp, nil
}

// exchange is one request in decision: the core's request and outcome,
// pooled.
type exchange struct {
	r decide.Request
	o decide.Outcome
}

// answer converts req, decides it through the one door (whose hooks add
// what the server adds: global shadow mode, metrics, top keys, response
// headers), and converts the outcome into the response, in the exact
// dialect or Envoy's. On failure there is no response.
func (s *Server) answer(ctx context.Context, req *rlsv3.RateLimitRequest, via transport, exact bool, prefer decide.Preference) (*rlsv3.RateLimitResponse, *failure) {
	x := s.exchanges.Get().(*exchange)
	defer s.exchanges.Put(x)
	if err := rls.Request(req, &x.r); err != nil {
		x.o.Reset()
		return nil, s.fail(err, via)
	}
	x.r.Prefer = prefer
	err := s.dec.Decide(ctx, &x.r, &x.o)
	if err != nil {
		return nil, s.fail(err, via)
	}
	o := &x.o
	if o.Permit != nil && ctx.Err() != nil {
		// The caller is gone (Envoy's timeout, a reset) and never gets
		// the token: nothing else would release the permits before
		// their TTL.
		s.releaseUnsent(ctx, o)
		return nil, s.fail(ctx.Err(), via)
	}
	// The server keeps no Permit: the token in the answer names the
	// permits, and the request that carries it back releases them.
	o.Permit = nil
	if o.Degraded != rules.FailDefault {
		s.logDegraded(req.GetDomain(), o, via)
	}
	s.countPermits(o, via)
	resp := rls.Response(o, exact)
	if s.metadata {
		resp.DynamicMetadata = rls.DynamicMetadata(req, o)
	}
	res := resultOK
	switch {
	case o.ShadowDenied:
		res = resultShadowOverLimit
	case o.OverLimit():
		res = resultOverLimit
	case o.Overall.Shadow:
		res = resultShadowOverLimit
	}
	s.m.requests[via][res].Inc()
	return resp, nil
}

// releaseUnsent releases the permits of o, whose answer its caller will
// never read, with a context its cancellation does not end.
func (s *Server) releaseUnsent(ctx context.Context, o *decide.Outcome) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unsentReleaseTimeout)
	defer cancel()
	if err := o.Permit.Release(rctx); err != nil {
		s.log.Warn("permits of an unanswered request not released; they expire by their ttl", "err", err)
	}
	o.Permit = nil
}

// unsentReleaseTimeout bounds releaseUnsent.
const unsentReleaseTimeout = time.Second

// countPermits counts the permit tokens of o and logs a failed release,
// at most as often as store failures.
func (s *Server) countPermits(o *decide.Outcome, via transport) {
	m := &s.m.permits
	if o.PermitToken != "" {
		m[permitIssued].Inc()
	}
	if o.Released+o.ReleaseStale+o.ReleaseRefused+o.ReleaseFailed == 0 {
		return
	}
	m[permitReleased].Add(float64(o.Released))
	m[permitStale].Add(float64(o.ReleaseStale))
	m[permitRefused].Add(float64(o.ReleaseRefused))
	m[permitFailed].Add(float64(o.ReleaseFailed))
	if o.ReleaseFailed > 0 {
		if n, ok := s.storeLog.Allow(time.Now()); ok {
			s.log.Warn("permits not released: the store failed; they expire by their ttl", "transport", transportNames[via], "err", o.ReleaseErr, "failures_not_logged", n)
		}
	}
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
	if sd := s.m.statsd; sd != nil && (errors.Is(err, sluice.ErrInvalid) || errors.Is(err, decide.ErrNoRules)) {
		sd.serviceError.Inc() // envoy-rl's service errors: a bad request, no configuration
	}
	switch {
	case errors.Is(err, sluice.ErrInvalid):
		s.m.requests[via][resultInvalid].Inc()
		if errors.Is(err, bounds.ErrTooLarge) {
			s.m.tooLarge[via].Inc()
		}
		s.log.Debug("invalid rate limit request", "transport", transportNames[via], "err", err)
		return &failure{failInvalid, err.Error()}
	case errors.Is(err, decide.ErrNoRules):
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

// logDegraded logs while the failure policies answer: one line at once,
// then at most one a minute, with the requests answered since the last
// line (the hook has counted them).
func (s *Server) logDegraded(domain string, o *decide.Outcome, via transport) {
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
func anyMatched(o *decide.Outcome) bool {
	for i := range o.Descriptors {
		if o.Descriptors[i].Status != rules.NoMatch {
			return true
		}
	}
	return false
}
