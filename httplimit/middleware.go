package httplimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"sync"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/base/logsample"
	"github.com/sluicehq/sluice/internal/decision/ratelimitheaders"
	"github.com/sluicehq/sluice/rules"
)

// Decider decides the requests: *decide.Decider, the one door of the
// decision core (local rules and a store, or a remote service with the
// rules as its fallback), is the one callers want. Decide must fill o as
// decide.Decider.Decide documents, leave o reset on error, and be safe for
// concurrent use. It must not use r, nor keep the strings in it, after it
// returns: the middleware reuses their storage for the next request
// (decide.Decider copies what it keeps).
type Decider interface {
	Decide(ctx context.Context, r *decide.Request, o *decide.Outcome) error
}

// Config configures the middleware made by New. Zero fields mean the
// documented default; Decider and Domain are required.
type Config struct {
	// Decider decides every request: a *decide.Decider (the rules, the
	// limiter, and the failure policy that answers when the store fails,
	// decide.Failover), or a client of a remote sluice serve. Required.
	Decider Decider

	// Domain is the rules domain the requests are decided in. Required.
	Domain string

	// ClientIP resolves the client address for RemoteAddress. The zero
	// value trusts no proxy: the client is the peer.
	ClientIP ClientIP

	// Descriptors are the RLS descriptors built from each request, all
	// decided together, all-or-nothing: a request denied by one
	// descriptor's limits consumes nothing from the others'. Empty means
	// one descriptor {remote_address: <client>}, as Envoy's
	// remote_address action, so that a rules file with
	// `key: remote_address` works as it is. A request for which every
	// descriptor is skipped (see Descriptor) is let through without
	// headers.
	Descriptors []Descriptor

	// Headers selects the rate limit headers sent, on allowed and denied
	// responses alike. Zero means ratelimitheaders.HeadersAll;
	// ratelimitheaders.HeadersNone sends none.
	Headers ratelimitheaders.HeaderMode

	// ShadowMode is the global shadow mode: every request is decided and
	// counted, but none is denied; Logger gets a line (at most one a
	// second) when one would have been, as when a rule's shadow_mode
	// limit would have denied. The headers of a request that would
	// have been denied show the limit that would have denied it, with
	// nothing remaining, and no Retry-After. Rules' own shadow_mode
	// limits never deny and are not advertised, with or without it. It is
	// every front door's global shadow mode, decide.GlobalShadow, applied
	// to each decision of the request's limits.
	ShadowMode bool

	// DenyStatus is the status of a denial. Zero means 429 Too Many
	// Requests.
	DenyStatus int

	// OnDeny, when set, writes denials instead of the problem+json body.
	// It is called with the rate limit headers (Retry-After included)
	// already set on w, and must write the status itself.
	OnDeny http.Handler

	// OnError, when set, answers a request that could not be decided: no
	// rules loaded, the store failing with no failure policy to answer,
	// the client's address unusable (a Unix socket listener with
	// RemoteAddress), the request's context ending, a request the rules
	// refuse (descriptors whose counter key would exceed
	// sluice.MaxKeyLen: many long entries). Nil means 503 with a
	// problem+json body ([ProblemUnavailable]) that says nothing of err.
	OnError func(w http.ResponseWriter, r *http.Request, err error)

	// Logger receives decision errors and store failures answered by the
	// failure policy, at most one line per second of each. Nil discards.
	Logger *slog.Logger

	// Shaping, when set, delays requests that the limits deny instead of
	// denying them, as long as waiting admits them within MaxDelay: the
	// leaky bucket as a queue. See Shaping.
	Shaping *Shaping

	// Failures, when set, are limits that count only failed responses
	// (failed logins, declined payments). See Failures.
	Failures *Failures

	// Concurrency, when set, caps the requests in flight per key in this
	// process. See Concurrency.
	Concurrency *Concurrency

	// Tokens, when set, is a token budget: a cost reserved at admission
	// and settled when the response ends, such as an LLM answer's tokens.
	// See Tokens.
	Tokens *Tokens

	// OnResult, when set, is told what became of each request (Result),
	// for metrics: before the handler is called, or before the
	// middleware answers by itself. w and r are the middleware's own. It
	// must be fast and safe for concurrent use.
	OnResult func(w http.ResponseWriter, r *http.Request, res Result)
	// OnOutcome, when set, is told the decision that settled each request
	// the store decided, once: the main one, or the failure limits' when
	// they deny it first (not their peeks before, nor the decisions
	// shaping retried, nor the failures charged after). Descriptors of
	// cost 0 in it were peeks. descs and o are the middleware's own: read
	// them before returning. In global shadow mode o is as
	// decide.GlobalShadow leaves it: a denial let through has
	// o.ShadowDenied set. It must be fast and safe for concurrent use.
	OnOutcome func(descs []rules.Descriptor, o *decide.Outcome)

	// OnSettle, when set with Tokens, is told each request's token
	// reservation and the cost it was settled to, when its response ends
	// (for metrics: what reservations hold against what answers spend).
	// w and r are the middleware's own. It must be fast and safe for
	// concurrent use.
	OnSettle func(w http.ResponseWriter, r *http.Request, reserved, spent int64)
}

// middleware is a validated Config.
type middleware struct {
	dec        func(context.Context, *decide.Request, *decide.Outcome) error // Config.Decider's Decide
	domain     string
	ip         ClientIP
	descs      [][]entry
	needIP     bool
	entries    int                         // over all descriptors
	headers    ratelimitheaders.HeaderMode // the families sent; 0: none
	shadow     bool
	denyStatus int
	onDeny     http.Handler
	onError    func(w http.ResponseWriter, r *http.Request, err error)
	log        *slog.Logger
	errLog     logsample.Sampler // decision errors
	degLog     logsample.Sampler // answers of the failure policy
	shadowLog  logsample.Sampler // shadow denials
	permitLog  logsample.Sampler // permits not released
	scratch    sync.Pool         // *scratch
	pipe       pipeline          // the features' stages
	shaping    *shaper
	failures   *failures
	conc       *concurrency
	tokens     *tokens
	settle     settler // the Decider, with Tokens
	onResult   func(w http.ResponseWriter, r *http.Request, res Result)
	onOutcome  func(descs []rules.Descriptor, o *decide.Outcome)
	onSettle   func(w http.ResponseWriter, r *http.Request, reserved, spent int64)
}

// New validates cfg and returns the middleware: a
// func(http.Handler) http.Handler for the standard library, chi and
// gorilla/mux alike. See the package documentation for what it does to a
// request.
func New(cfg Config) (func(http.Handler) http.Handler, error) {
	if cfg.Decider == nil {
		return nil, fmt.Errorf("%w: Decider is required", ErrConfig)
	}
	st, _ := cfg.Decider.(settler)
	m, err := newMiddleware(cfg, cfg.Decider.Decide, st)
	if err != nil {
		return nil, err
	}
	return m.wrap, nil
}

// wrap is the middleware around next.
func (m *middleware) wrap(next http.Handler) http.Handler {
	return &handler{m: m, next: next}
}

// newMiddleware checks cfg, but for its Decider: dec decides, and st
// settles token reservations (nil when it cannot). It composes the
// features' stages into the pipeline.
func newMiddleware(cfg Config, dec func(context.Context, *decide.Request, *decide.Outcome) error, st settler) (*middleware, error) {
	switch {
	case cfg.Domain == "":
		return nil, fmt.Errorf("%w: Domain is required", ErrConfig)
	case len(cfg.Domain) > rules.MaxEntryLen:
		return nil, fmt.Errorf("%w: Domain longer than %d bytes", ErrConfig, rules.MaxEntryLen)
	case cfg.DenyStatus != 0 && (cfg.DenyStatus < 400 || cfg.DenyStatus > 599):
		return nil, fmt.Errorf("%w: DenyStatus %d is not a 4xx or 5xx status", ErrConfig, cfg.DenyStatus)
	case len(cfg.Descriptors) > MaxDescriptors:
		return nil, fmt.Errorf("%w: %d descriptors (at most %d)", ErrConfig, len(cfg.Descriptors), MaxDescriptors)
	}
	if err := cfg.Headers.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if err := cfg.ClientIP.Validate(); err != nil {
		return nil, err
	}
	m := &middleware{
		dec:        dec,
		domain:     cfg.Domain,
		ip:         cfg.ClientIP,
		headers:    cfg.Headers.With(ratelimitheaders.HeadersAll),
		shadow:     cfg.ShadowMode,
		denyStatus: cfg.DenyStatus,
		onDeny:     cfg.OnDeny,
		onError:    cfg.OnError,
		onResult:   cfg.OnResult,
		onOutcome:  cfg.OnOutcome,
		onSettle:   cfg.OnSettle,
		log:        cfg.Logger,
	}
	m.ip.TrustedProxies = append([]netip.Prefix(nil), cfg.ClientIP.TrustedProxies...)
	m.ip.Headers = append([]string(nil), cfg.ClientIP.Headers...)
	if m.denyStatus == 0 {
		m.denyStatus = http.StatusTooManyRequests
	}
	if m.log == nil {
		m.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	descs := cfg.Descriptors
	if len(descs) == 0 && cfg.Failures == nil {
		descs = []Descriptor{{{Source: RemoteAddress()}}}
	}
	var err error
	if m.descs, err = m.compileAll(descs); err != nil {
		return nil, err
	}
	if err := m.newFeatures(cfg, st); err != nil {
		return nil, err
	}
	m.scratch.New = func() any { return m.newScratch() }
	if m.conc != nil {
		m.conc.record(cfg.Concurrency)
	}
	return m, nil
}

// newFeatures checks the features of cfg (failures, concurrency, shaping,
// tokens) and composes them, the descriptors and the headers as the
// stages of m's pipeline: refused when two cannot be combined.
func (m *middleware) newFeatures(cfg Config, st settler) error {
	var err error
	if cfg.Failures != nil {
		if m.failures, err = m.newFailures(cfg.Failures); err != nil {
			return err
		}
	}
	if cfg.Concurrency != nil {
		if m.conc, err = m.newConcurrency(cfg.Concurrency); err != nil {
			return err
		}
	}
	if cfg.Shaping != nil {
		if m.shaping, err = newShaper(cfg.Shaping); err != nil {
			return err
		}
	}
	if cfg.Tokens != nil {
		if m.tokens, err = m.newTokens(cfg.Tokens, st); err != nil {
			return err
		}
		m.settle = st
	}
	return m.buildPipeline()
}

// compileAll compiles the descriptors ds, counting their entries into
// m.entries and noting whether they need the client address.
func (m *middleware) compileAll(ds []Descriptor) ([][]entry, error) {
	var out [][]entry
	for i, d := range ds {
		c, err := compile(i, d)
		if err != nil {
			return nil, err
		}
		for _, e := range c {
			m.needIP = m.needIP || e.needsClient()
		}
		m.entries += len(c)
		out = append(out, c)
	}
	return out, nil
}

type handler struct {
	m    *middleware
	next http.Handler
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m := h.m
	s := m.scratch.Get().(*scratch)
	defer m.release(s)
	f := &s.flow
	f.w, f.r, f.s = w, r, s
	defer m.pipe.end(m, f)
	m.pipe.run(m, f, h.next)
}

// admitConcurrent applies the concurrency cap to f's request: the slot
// it takes is held in f (given back by releaseConcurrent), or, over the
// cap, it is answered, or let through in shadow mode (f.shadowed).
func (m *middleware) admitConcurrent(f *flow) bool {
	key, limited, err := m.conc.key(f.s, f.r)
	switch {
	case err != nil:
		m.invalid(f.w, f.r, err)
		return false
	case !limited:
		return true
	case m.conc.acquire(key):
		f.held, f.ckey = true, key
		return true
	case !m.shadow:
		m.tooConcurrent(f.w, f.r)
		return false
	}
	if n, ok := m.shadowLog.Allow(time.Now()); ok {
		m.log.Info("concurrency cap exceeded in shadow mode; let through", "domain", m.domain, "not_logged", n)
	}
	f.shadowed = true
	return true
}

// releaseConcurrent gives back the concurrency slot f holds, if any.
func (m *middleware) releaseConcurrent(f *flow) {
	if f.held {
		m.conc.release(f.ckey)
	}
}

// failuresFirst checks the failure limits of f's request before its other
// limits, on their own: a request they deny must consume nothing from the
// others. It notes in f whether the request was charged its failure
// already, or would have been denied in shadow mode; when the request may
// not go on it has been answered (denied, or failed).
func (m *middleware) failuresFirst(f *flow) bool {
	if f.fails == 0 {
		return true
	}
	w, r, s := f.w, f.r, f.s
	wouldDeny, precharged, err := m.checkFailures(r.Context(), s)
	if err != nil {
		m.decisionFailed(w, r, err)
		return false
	}
	if wouldDeny {
		m.applyShadow(&s.out)
	}
	switch {
	case wouldDeny && !s.out.ShadowDenied:
		if m.onOutcome != nil {
			m.onOutcome(s.fail.descs, &s.out)
		}
		if s.out.Degraded != rules.FailOpen {
			m.setHeaders(w.Header(), s, true)
		}
		m.deny(w, r, s)
		return false
	case wouldDeny:
		if n, ok := m.shadowLog.Allow(time.Now()); ok {
			m.log.Info("failure limit exceeded in shadow mode; let through", "domain", m.domain, "limit", shadowLimit(&s.out), "not_logged", n)
		}
		f.shadowed = true
	}
	f.precharged = precharged
	return true
}

// decisionFailed answers r whose decision failed with err: nothing when
// the client went away, else by fail.
func (m *middleware) decisionFailed(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil && errors.Is(err, r.Context().Err()) {
		m.report(w, r, Canceled)
		return // the client went away: no one to answer
	}
	m.fail(w, r, err)
}

// result reports whether o denies the request and what became of it, for
// OnResult: shadowed, the request went over a cap or a failure limit in
// shadow mode; delayed, shaping held it.
func (m *middleware) result(o *decide.Outcome, shadowed, delayed bool) (denied bool, res Result) {
	denied = o.OverLimit()
	switch {
	case denied:
		return true, Denied
	case o.Overall.Shadow || o.ShadowDenied:
		if n, ok := m.shadowLog.Allow(time.Now()); ok {
			m.log.Info("rate limit exceeded in shadow mode; let through", "domain", m.domain, "limit", shadowLimit(o), "not_logged", n)
		}
		return false, Shadow
	case shadowed:
		return false, Shadow
	case delayed:
		return false, Delayed
	}
	return false, Allowed
}

// report tells Config.OnResult what became of r.
func (m *middleware) report(w http.ResponseWriter, r *http.Request, res Result) {
	if m.onResult != nil {
		m.onResult(w, r, res)
	}
}

// shadowLimit names the limit that would have denied o.
func shadowLimit(o *decide.Outcome) string {
	if i := o.Overall.Index; i >= 0 && i < len(o.Limits) {
		return o.Limits[i].Limit.Name
	}
	return ""
}

// decide decides s.main into s.out: reserving its costs (decide.Request's
// Reserve) when it has a token descriptor.
func (m *middleware) decide(ctx context.Context, s *scratch) error {
	s.req = decide.Request{Domain: m.domain, Descriptors: s.main.descs, Reserve: s.tokens >= 0}
	err := m.dec(ctx, &s.req, &s.out)
	if err == nil {
		m.applyShadow(&s.out)
	}
	if err == nil && s.out.Degraded != rules.FailDefault {
		if n, ok := m.degLog.Allow(time.Now()); ok {
			m.log.Warn("rate limit store failed; answered by the failure policy", "domain", m.domain, "policy", s.out.Degraded.String(), "reason", s.out.Reason.String(), "err", s.out.StoreErr, "not_logged", n)
		}
	}
	return err
}

// decideDescs decides descs, of the middleware's domain, into s.out: the
// failure limits' decisions, made before the request's own or after its
// response. None of them holds a permit: a concurrency limit that the
// rules put on a failure descriptor (sluice proxy refuses that at load,
// but a Decider's rules may change, or be a remote service's) caps
// nothing in flight there, and a permit taken would be held by no
// request, until its ttl. Any permit the decision took is given back at
// once.
func (m *middleware) decideDescs(ctx context.Context, s *scratch, descs []rules.Descriptor) error {
	s.req = decide.Request{Domain: m.domain, Descriptors: descs}
	err := m.dec(ctx, &s.req, &s.out)
	if pm := s.out.Permit; pm != nil {
		s.out.Permit = nil
		m.releasePermit(ctx, pm)
	}
	return err
}

// applyShadow lets o through when the global shadow mode is on: the hook
// of every front door, decide.GlobalShadow (which sets o.ShadowDenied).
// A Decider given to the middleware may have hooks of its own, but not
// this one: the middleware's ShadowMode is its own.
func (m *middleware) applyShadow(o *decide.Outcome) {
	if m.shadow {
		decide.GlobalShadow(context.Background(), nil, o, nil)
	}
}

// deny answers the denied request whose outcome is s.out, its headers
// already set.
func (m *middleware) deny(w http.ResponseWriter, r *http.Request, s *scratch) {
	m.report(w, r, Denied)
	if m.onDeny != nil {
		m.onDeny.ServeHTTP(w, r)
		return
	}
	writeProblem(w, m.denial(&s.out))
}

// invalid answers a request that build or fill refused: 400 for a value
// the limits cannot take, else as a request that could not be decided.
func (m *middleware) invalid(w http.ResponseWriter, r *http.Request, err error) {
	var inv invalidError
	if errors.As(err, &inv) {
		m.report(w, r, Invalid)
		writeProblem(w, &problem{Type: ProblemInvalidRequest, Title: "Invalid request", Status: http.StatusBadRequest, Detail: inv.msg})
		return
	}
	m.fail(w, r, err)
}

// invalidError is a request value that makes the request invalid; msg
// names the header or field, never the value.
type invalidError struct{ msg string }

func (e invalidError) Error() string { return e.msg }

// setHeaders sets the rate limit headers of the outcome in s on h, denied
// or not (ratelimitheaders.Values.Fill, the headers of every front door).
// The values share one string and one slice, allocated together per
// response.
func (m *middleware) setHeaders(h http.Header, s *scratch, denied bool) {
	v := &s.hdr
	v.Fill(&s.out, m.headers, denied)
	if v.N == 0 {
		return
	}
	// The values are new strings for every response: net/http writes the
	// header after the handler returns, when s may serve another request.
	// One allocation holds them and their slices.
	var vals []string
	var all string
	if len(v.Buf) <= len(headerBlock{}.buf) {
		hb := new(headerBlock)
		copy(hb.buf[:], v.Buf)
		vals, all = hb.vals[:v.N], unsafe.String(&hb.buf[0], len(v.Buf))
	} else {
		vals, all = make([]string, v.N), string(v.Buf)
	}
	start := 0
	for i := range v.N {
		vals[i] = all[start:v.Ends[i]]
		start = v.Ends[i]
		h[ratelimitheaders.CanonicalNames[v.Fields[i]]] = vals[i : i+1 : i+1]
	}
}

// headerBlock holds the rate limit header values of one response: their
// bytes, and the strings over them.
type headerBlock struct {
	vals [6]string
	buf  [224]byte
}

// fail answers a request that could not be decided.
func (m *middleware) fail(w http.ResponseWriter, r *http.Request, err error) {
	m.report(w, r, Error)
	if n, ok := m.errLog.Allow(time.Now()); ok {
		m.log.Warn("rate limit decision failed", "domain", m.domain, "err", err, "not_logged", n)
	}
	if m.onError != nil {
		m.onError(w, r, err)
		return
	}
	writeProblem(w, &problem{
		Type:   ProblemUnavailable,
		Title:  "Service unavailable",
		Status: http.StatusServiceUnavailable,
		Detail: "The rate limiter could not decide this request. Try again later.",
	})
}
