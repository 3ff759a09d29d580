package rlsclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/breaker"
	"github.com/sluicehq/sluice/internal/logsample"
	"github.com/sluicehq/sluice/internal/rls"
	"github.com/sluicehq/sluice/rules"
)

// exactDialect is the metadata by which the client asks for
// rls.DialectExact, and states all-or-nothing as its default (the
// proxy's) for the domains whose rules set no all_or_nothing:.
var exactDialect = metadata.Pairs(rls.DialectKey, rls.DialectExactValue, rls.AllOrNothingKey, "true")

// Defaults of Config.
const (
	// DefaultTimeout is long enough that a remote which is busy, or a
	// node short of CPU, is waited for rather than taken for down: the
	// deadline measures the call's queueing on both sides as much as the
	// remote (with 50ms, a loaded machine answered by the failure policy).
	// A remote that is down refuses the connection at once.
	DefaultTimeout = 500 * time.Millisecond

	// DefaultReconnectMax caps the wait between attempts to reconnect to
	// a remote that is down (gRPC's own default is two minutes, too long
	// for a rate limiter answering by its failure policy meanwhile).
	DefaultReconnectMax = 5 * time.Second
)

// ErrUnavailable wraps the error of every call the remote did not answer:
// Outcome.StoreErr of a request answered by the failure policy.
var ErrUnavailable = errors.New("remote rate limit service unavailable")

// errBreakerOpen is the cause of the answers while the breaker is open,
// made once: a remote that is down turns every request away.
var errBreakerOpen = fmt.Errorf("%w: %w", ErrUnavailable, breaker.ErrOpen)

// ErrClosed is returned by DecideInto and DecideRLS after Close.
var ErrClosed = errors.New("rlsclient: client closed")

// Config configures a Client. Zero fields mean the default in their
// comment; Target is required.
type Config struct {
	// Target is the remote service's gRPC address: host:port (a name is
	// resolved by DNS), or a gRPC target URI such as dns:///host:port or
	// unix:///path. Required.
	Target string

	// DialOptions are passed to grpc.NewClient after the Client's own
	// (insecure transport credentials, and reconnection backoff from 100ms
	// up to DefaultReconnectMax), so that an option given here wins. For
	// TLS:
	//
	//	DialOptions: []grpc.DialOption{
	//		grpc.WithTransportCredentials(credentials.NewTLS(tlsConfig)),
	//	}
	DialOptions []grpc.DialOption

	// Timeout bounds every call to the remote, within the caller's own
	// deadline; 0 means DefaultTimeout. A call that times out is
	// answered by the failure policy.
	Timeout time.Duration

	// Fallback, when not nil, answers the requests the remote cannot, as
	// it answers when its own store fails: by the domain's failure_policy
	// in its rules, else its Failover().Default; the local policy decides
	// on its Failover().Local with every limit divided by
	// Failover().Nodes (see rls.Failover). Give it the remote's rules.
	Fallback *rls.Decider

	// FailurePolicy answers the requests the remote cannot when Fallback
	// is nil: FailOpen (the zero value, FailDefault, means it) allows
	// them, with no limit known; FailClosed denies them, retry after a
	// second. FailLocal needs local rules: use Fallback. Setting both
	// FailurePolicy and Fallback is an error.
	FailurePolicy rules.FailurePolicy

	// BreakerFailures consecutive failed calls open the circuit breaker,
	// which then turns calls away at once, answering them by the failure
	// policy, for BreakerCooldown (doubling up to 5s while the remote
	// stays down) before letting one probe through. Zero values mean the
	// internal/breaker defaults (5 and 200ms).
	BreakerFailures int
	BreakerCooldown time.Duration

	// Logger receives the remote's failures answered by the failure
	// policy (at most one line a second of each result: error, timeout,
	// breaker_open) and the breaker's changes of state. Nil discards.
	Logger *slog.Logger
}

// Client decides RLS requests on a remote rate limit service. Make one
// with New; it is safe for concurrent use.
type Client struct {
	target   string
	conn     *grpc.ClientConn
	rls      rlsv3.RateLimitServiceClient
	timeout  time.Duration
	fallback *rls.Decider
	policy   rules.FailurePolicy
	br       *breaker.Breaker
	log      *slog.Logger
	limits   limitCache
	metrics  metrics
	lastErr  atomic.Pointer[error]         // of the last call, nil once one succeeds
	logs     [numResults]logsample.Sampler // of the failures answered by the policy

	outcomes sync.Pool // *rls.Outcome, for DecideInto

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// New validates cfg and returns a Client. It does not connect: the
// connection is made on the first call and remade as needed, so a Client
// made while the remote is down answers by its failure policy until the
// remote is up.
func New(cfg Config) (*Client, error) {
	if err := checkTarget(cfg.Target); err != nil {
		return nil, err
	}
	switch {
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("rlsclient: negative Timeout %v", cfg.Timeout)
	case cfg.BreakerFailures < 0:
		return nil, fmt.Errorf("rlsclient: negative BreakerFailures %d", cfg.BreakerFailures)
	case cfg.BreakerCooldown < 0:
		return nil, fmt.Errorf("rlsclient: negative BreakerCooldown %v", cfg.BreakerCooldown)
	case cfg.Fallback != nil && cfg.FailurePolicy != rules.FailDefault:
		return nil, errors.New("rlsclient: set FailurePolicy or Fallback, not both (the Fallback's rules and Failover choose its policy)")
	case cfg.FailurePolicy == rules.FailLocal:
		return nil, errors.New("rlsclient: FailurePolicy local needs local rules: set Fallback instead")
	case cfg.FailurePolicy > rules.FailLocal:
		return nil, fmt.Errorf("rlsclient: unknown FailurePolicy %v", cfg.FailurePolicy)
	}
	c := &Client{
		target:   cfg.Target,
		timeout:  cfg.Timeout,
		fallback: cfg.Fallback,
		policy:   cfg.FailurePolicy,
		log:      cfg.Logger,
	}
	if c.timeout == 0 {
		c.timeout = DefaultTimeout
	}
	if c.policy == rules.FailDefault {
		c.policy = rules.FailOpen
	}
	if c.log == nil {
		c.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	bo := backoff.DefaultConfig
	bo.BaseDelay, bo.MaxDelay = 100*time.Millisecond, DefaultReconnectMax
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: time.Second}),
	}, cfg.DialOptions...)
	conn, err := grpc.NewClient(cfg.Target, opts...)
	if err != nil {
		return nil, fmt.Errorf("rlsclient: %w", err)
	}
	c.conn = conn
	c.rls = rlsv3.NewRateLimitServiceClient(conn)
	c.br = breaker.New(breaker.Config{Failures: cfg.BreakerFailures, Cooldown: cfg.BreakerCooldown})
	c.br.OnChange(func(from, to breaker.State) {
		c.log.Warn("remote rate limit service circuit breaker", "target", c.target, "from", from.String(), "to", to.String())
	})
	return c, nil
}

// checkTarget reports what is wrong with a Target.
func checkTarget(t string) error {
	if t == "" {
		return errors.New("rlsclient: Target is required (host:port of the rate limit service)")
	}
	if u, err := url.Parse(t); err == nil && u.Scheme != "" && resolver.Get(u.Scheme) != nil {
		return nil // a gRPC target URI
	}
	host, port, err := net.SplitHostPort(t)
	if err != nil {
		return fmt.Errorf("rlsclient: Target %q is neither host:port nor a gRPC target URI (dns:///host:port, unix:///path): %v", t, err)
	}
	if host == "" {
		return fmt.Errorf("rlsclient: Target %q has no host", t)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return fmt.Errorf("rlsclient: Target %q: port %q is not a number from 1 to 65535", t, port)
	}
	return nil
}

// Close closes the connection. Close is idempotent; the calls fail with
// ErrClosed afterwards.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		c.closeErr = c.conn.Close()
	})
	return c.closeErr
}

// Health implements sluice.HealthReporter: nil while the remote answers,
// the reason otherwise (the breaker is not closed, or the last call
// failed). It does no I/O; before the first call it is nil.
func (c *Client) Health() error {
	if st := c.br.State(); st != breaker.Closed {
		return fmt.Errorf("%w: circuit breaker %s", ErrUnavailable, st)
	}
	if p := c.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// DecideRLS decides req on the remote into o, as rls.Decider.DecideInto
// does locally (see the package documentation for how the remote's
// response maps to o), reusing o's storage. o.Response is the remote's
// response, which the caller owns. On error o is left reset.
//
// A request the remote cannot answer is answered by the failure policy,
// with o.Degraded set and o.StoreErr wrapping ErrUnavailable and the
// gRPC error. The errors are: an invalid request (wrapping rls.ErrInvalid:
// checked here, or the remote's InvalidArgument), the caller's context
// ending (wrapping its error), a malformed response (statuses that do not
// match the descriptors), the Fallback's own errors, and ErrClosed.
func (c *Client) DecideRLS(ctx context.Context, req *rlsv3.RateLimitRequest, o *rls.Outcome) error {
	o.Reset()
	if err := checkRequest(req); err != nil {
		return err
	}
	if c.closed.Load() {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := c.br.Allow(); err != nil {
		c.metrics.calls[resultBreakerOpen].Add(1)
		return c.degrade(ctx, req, o, resultBreakerOpen, &sluice.StoreError{Reason: sluice.FailBreakerOpen, Err: errBreakerOpen})
	}
	timeout := c.timeout
	if c.br.State() == breaker.HalfOpen {
		// The one probe that may close the breaker: give it more time,
		// so that a remote that is back but slow (reconnecting, a cold
		// start) is not taken for dead again.
		timeout = max(timeout, min(4*timeout, time.Second))
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	// Ask sluice serve for what it knows (rls.DialectExact): limits named
	// as its rules name them, resets to the nanosecond.
	cctx = metadata.NewOutgoingContext(cctx, exactDialect)
	start := time.Now()
	resp, err := c.rls.ShouldRateLimit(cctx, req)
	cancel()
	c.metrics.duration.observe(time.Since(start))
	if err == nil {
		c.br.Done(nil)
		if c.lastErr.Load() != nil {
			c.lastErr.Store(nil)
		}
		if err := c.fill(req, resp, o); err != nil {
			c.metrics.calls[resultMalformed].Add(1)
			o.Reset()
			return err
		}
		c.metrics.calls[resultOK].Add(1)
		return nil
	}
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(cerr, context.Canceled) {
			// The caller gave up: that says nothing about the remote,
			// so the breaker hears nothing (a probe that does not
			// report is replaced after a cooldown).
			c.metrics.calls[resultCanceled].Add(1)
			return fmt.Errorf("rlsclient: %w", cerr)
		}
		// The caller's deadline passed while the remote did not answer:
		// that counts, as Envoy's own deadline (20ms by default) can be
		// shorter than Timeout and a silent remote must still open the
		// breaker. No policy answers a caller that is gone.
		c.metrics.calls[resultTimeout].Add(1)
		c.br.Done(err)
		return fmt.Errorf("rlsclient: %w (remote: %v)", cerr, err)
	}
	if status.Code(err) == codes.InvalidArgument {
		c.br.Done(nil)
		c.metrics.calls[resultInvalid].Add(1)
		return fmt.Errorf("%w: %s", rls.ErrInvalid, status.Convert(err).Message())
	}
	res, why := resultError, sluice.FailUnreachable
	if status.Code(err) == codes.DeadlineExceeded {
		res, why = resultTimeout, sluice.FailTimeout
	}
	c.metrics.calls[res].Add(1)
	c.br.Done(err)
	var cause error = &sluice.StoreError{Reason: why, Err: fmt.Errorf("%w: %s: %w", ErrUnavailable, c.target, err)}
	c.lastErr.Store(&cause)
	return c.degrade(ctx, req, o, res, cause)
}

// DecideInto decides the descriptors descs of domain on the remote into o,
// as decide.Decider.DecideInto does locally: it is the httplimit.Decider
// of a remote service. Each descriptor's cost is its hits_addend (the
// request's, 1, when the cost is 1); the rest is DecideRLS's.
func (c *Client) DecideInto(ctx context.Context, domain string, descs []rules.Descriptor, o *decide.Outcome) error {
	req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: 1, Descriptors: make([]*rlv3.RateLimitDescriptor, len(descs))}
	for i := range descs {
		d := &descs[i]
		pd := &rlv3.RateLimitDescriptor{Entries: make([]*rlv3.RateLimitDescriptor_Entry, len(d.Entries))}
		for j, e := range d.Entries {
			pd.Entries[j] = &rlv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value}
		}
		if d.Cost != 1 {
			if d.Cost < 0 {
				o.Reset()
				return fmt.Errorf("%w: descriptor %d: negative cost %d", rls.ErrInvalid, i, d.Cost)
			}
			pd.HitsAddend = wrapperspb.UInt64(uint64(d.Cost))
		}
		if ov := d.Override; ov != nil {
			pd.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: ov.RequestsPerUnit, Unit: typev3.RateLimitUnit(ov.Unit)}
			if ov.UnitMultiplier != 1 {
				pd.Limit.UnitMultiplier = wrapperspb.UInt32(ov.UnitMultiplier)
			}
		}
		req.Descriptors[i] = pd
	}
	ro, _ := c.outcomes.Get().(*rls.Outcome)
	if ro == nil {
		ro = new(rls.Outcome)
	}
	defer func() {
		ro.Reset()
		c.outcomes.Put(ro)
	}()
	if err := c.DecideRLS(ctx, req, ro); err != nil {
		o.Reset()
		return err
	}
	o.Reset()
	src := &ro.Outcome
	o.Overall, o.Degraded, o.StoreErr, o.Reason = src.Overall, src.Degraded, src.StoreErr, src.Reason
	o.Descriptors = append(o.Descriptors, src.Descriptors...)
	o.Limits = append(o.Limits, src.Limits...)
	return nil
}

// degrade answers req by the failure policy, the remote having failed with
// cause, and logs it.
func (c *Client) degrade(ctx context.Context, req *rlsv3.RateLimitRequest, o *rls.Outcome, res result, cause error) error {
	if c.fallback != nil {
		if err := c.fallback.DecideDegraded(ctx, req, o, cause); err != nil {
			return err
		}
	} else {
		c.answer(req, o, cause)
	}
	if n, ok := c.logs[res].Allow(time.Now()); ok {
		c.log.Warn("remote rate limit service failed; answered by the failure policy",
			"target", c.target, "result", resultNames[res], "domain", req.GetDomain(),
			"policy", o.Degraded.String(), "err", cause, "not_logged", n)
	}
	return nil
}

// checkRequest reports what every remote refuses, without asking it: the
// errors of rls.Decider for a request it cannot read.
func checkRequest(req *rlsv3.RateLimitRequest) error {
	switch {
	case req == nil:
		return fmt.Errorf("%w: no request", rls.ErrInvalid)
	case req.GetDomain() == "":
		return fmt.Errorf("%w: rate limit domain must not be empty", rls.ErrInvalid)
	case len(req.GetDescriptors()) == 0:
		return fmt.Errorf("%w: rate limit descriptor list must not be empty", rls.ErrInvalid)
	}
	for i, d := range req.GetDescriptors() {
		if d == nil {
			return fmt.Errorf("%w: descriptor %d is null", rls.ErrInvalid, i)
		}
	}
	return nil
}
