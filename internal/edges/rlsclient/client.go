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

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/fault"
	"github.com/sluicehq/sluice/internal/base/logsample"
	"github.com/sluicehq/sluice/internal/base/redact"
	"github.com/sluicehq/sluice/internal/edges/rls"
	"github.com/sluicehq/sluice/internal/stores/breaker"
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

// ErrClosed is returned by Ask after Close.
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

	// BreakerFailures consecutive failed calls open the circuit breaker,
	// which then turns calls away at once, for the failure policy to
	// answer, for BreakerCooldown (doubling up to 5s while the remote
	// stays down) before letting one probe through. Zero values mean the
	// internal/stores/breaker defaults (5 and 200ms).
	BreakerFailures int
	BreakerCooldown time.Duration

	// Logger receives the remote's failures (at most one line a second of
	// each result: error, timeout, breaker_open) and the breaker's changes
	// of state. Nil discards.
	Logger *slog.Logger
}

// Client decides RLS requests on a remote rate limit service. Make one
// with New; it is safe for concurrent use.
type Client struct {
	target  string
	conn    *grpc.ClientConn
	rls     rlsv3.RateLimitServiceClient
	timeout time.Duration
	br      *breaker.Breaker
	log     *slog.Logger
	limits  limitCache
	metrics metrics
	lastErr atomic.Pointer[error]         // of the last call, nil once one succeeds
	logs    [numResults]logsample.Sampler // of the failures answered by the policy

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
	}
	c := &Client{
		target:  cfg.Target,
		timeout: cfg.Timeout,
		log:     cfg.Logger,
	}
	if c.timeout == 0 {
		c.timeout = DefaultTimeout
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
		c.log.Warn("remote rate limit service circuit breaker", "target", redact.Value(c.target), "from", from.String(), "to", to.String())
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

// Health says whether the remote answers: nil while the remote answers,
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

// Ask decides r on the remote into o (see the package documentation for
// how the remote's response maps to o): the decide.Remote of a Decider
// whose own rules answer, by their failure policy, what the remote cannot.
// An error wrapping sluice.ErrInvalid means the request is invalid
// (checked here, or the remote's InvalidArgument); the caller's context
// ending returns its error; any other error (wrapping ErrUnavailable: the
// remote unreachable, failing, silent past the timeout, its breaker open,
// or an answer that does not fit the request; or ErrClosed) means the
// remote could not answer. On error o is left reset.
func (c *Client) Ask(ctx context.Context, r *decide.Request, o *decide.Outcome) error {
	o.Reset()
	if err := checkRequest(r); err != nil {
		return err
	}
	if c.closed.Load() {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	req, err := rls.RateLimitRequest(r)
	if err != nil {
		return err
	}
	if err := c.br.Allow(); err != nil {
		c.metrics.calls[resultBreakerOpen].Add(1)
		return c.failed(r, resultBreakerOpen, &fault.StoreError{Reason: fault.BreakerOpen, Err: errBreakerOpen})
	}
	timeout := c.timeout
	if c.br.State() == breaker.HalfOpen {
		// The one probe that may close the breaker: give it more time,
		// so that a remote that is back but slow (reconnecting, a cold
		// start) is not taken for dead again.
		timeout = max(timeout, min(4*timeout, time.Second))
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	// Ask sluice serve for what it knows (the exact dialect): limits named
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
		if err := c.fill(r, resp, o); err != nil {
			c.metrics.calls[resultMalformed].Add(1)
			o.Reset()
			return c.failed(r, resultMalformed, &fault.StoreError{Reason: fault.Error, Err: fmt.Errorf("%w: %w", ErrUnavailable, err)})
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
		return fmt.Errorf("%w: %s", sluice.ErrInvalid, status.Convert(err).Message())
	}
	res, why := resultError, fault.Unreachable
	if status.Code(err) == codes.DeadlineExceeded {
		res, why = resultTimeout, fault.Timeout
	}
	c.metrics.calls[res].Add(1)
	c.br.Done(err)
	var cause error = &fault.StoreError{Reason: why, Err: fmt.Errorf("%w: %s: %w", ErrUnavailable, redact.Value(c.target), err)}
	c.lastErr.Store(&cause)
	return c.failed(r, res, cause)
}

// failed logs that the remote could not answer r (at most a line a second
// of each result) and returns cause, for the failure policy.
func (c *Client) failed(r *decide.Request, res result, cause error) error {
	if n, ok := c.logs[res].Allow(time.Now()); ok {
		msg := "remote rate limit service failed; the failure policy answers"
		if len(r.Release) > 0 {
			msg = "remote rate limit service failed to release permits; they expire by their ttl"
		}
		c.log.Warn(msg, "target", redact.Value(c.target), "result", resultNames[res], "domain", r.Domain, "err", cause, "not_logged", n)
	}
	return cause
}

// checkRequest reports what every remote refuses, without asking it.
func checkRequest(r *decide.Request) error {
	switch {
	case r.Domain == "":
		return fmt.Errorf("%w: rate limit domain must not be empty", sluice.ErrInvalid)
	case len(r.Descriptors) == 0:
		return fmt.Errorf("%w: rate limit descriptor list must not be empty", sluice.ErrInvalid)
	}
	return nil
}
