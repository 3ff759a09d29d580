package httpretry

import (
	"context"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/internal/base/algo"
)

// Config configures a Transport. Its zero value is a working transport
// with the defaults written in each field's comment; a negative duration
// or count means the default too.
type Config struct {
	// Base sends each attempt. Nil means http.DefaultTransport.
	Base http.RoundTripper

	// MaxAttempts is the most attempts of one request, the first one
	// included: 1 never retries. Zero means 4.
	MaxAttempts int

	// RetryStatus lists the response statuses that are retried and whose
	// hints are read. Nil means 429 Too Many Requests and 503 Service
	// Unavailable; an empty, non-nil slice retries nothing (self-throttling,
	// pacing and the budget still work).
	RetryStatus []int

	// RetryNonIdempotent retries requests of any method. When false (the
	// default) a request is retried only if its method is idempotent (GET,
	// HEAD, OPTIONS, TRACE, PUT, DELETE: RFC 9110 §9.2.2) or it carries an
	// Idempotency-Key header. Either way a request whose body cannot be
	// replayed (a body and no GetBody) is sent once.
	RetryNonIdempotent bool

	// BaseDelay and MaxDelay shape the backoff used when a refused response
	// carries no usable hint: before retry number k (0 for the first) the
	// transport sleeps a uniformly random time in
	// [0, min(MaxDelay, BaseDelay × 2^k)], "full jitter". Zero means 100ms
	// and 20s.
	BaseDelay time.Duration
	MaxDelay  time.Duration

	// MaxWait caps every wait on a server's word: a hint (Retry-After,
	// RateLimit, X-RateLimit-Reset) and a hold of self-throttling. A
	// longer hint is waited for MaxWait, then the request is tried again.
	// Zero means one minute. It does not bound pacing, which is the
	// client's own limit.
	MaxWait time.Duration

	// HintJitter spreads the clients that a server gives the same reset:
	// every wait on a server's word (a hint, a hold of self-throttling)
	// is extended by a uniformly random time in [0, HintJitter], never
	// shortened, so that they do not all come back at the announced
	// instant. The extension stays within MaxWait. Zero means 1s (a
	// Retry-After in seconds is rounded anyway); negative means none.
	HintJitter time.Duration

	// IgnoreQuota turns self-throttling off. When false (the default) and a
	// response says a host's quota is spent (a RateLimit limit with r=0,
	// X-RateLimit-Remaining: 0, or a refused status with a hint), later
	// requests to that host wait until the announced reset (at most
	// MaxWait) instead of being sent to be refused.
	IgnoreQuota bool

	// Pace limits the requests sent to each host with a token bucket, for
	// budgets the server does not announce. The zero Pace paces nothing.
	Pace Pace

	// Budget enables the adaptive retry budget: client-side throttling
	// that rejects requests locally while a host refuses most of them. Nil
	// means none.
	Budget *Budget

	// MaxHosts bounds the number of hosts whose state (quota hold, pacing
	// bucket, budget counts) is kept. Zero means 1024. When full, idle
	// hosts are forgotten first, then hosts at random.
	MaxHosts int

	// Key names the host of a request for self-throttling, pacing and the
	// budget. Nil means req.URL.Host as written (host, or host:port).
	Key func(req *http.Request) string

	// Rand returns a uniformly random integer in [0, n) for n > 0. It must
	// be safe for concurrent use. Nil means math/rand/v2's Int64N.
	Rand func(n int64) int64

	// OnWait, if set, is called before every wait: each retry (even one
	// that waits zero) and each hold of self-throttling or pacing. It runs
	// on the request's goroutine and must not block.
	OnWait func(Event)

	// Logger, if set, logs every wait: retries at Info, holds of
	// self-throttling and pacing at Debug.
	Logger *slog.Logger
}

// Pace is a token bucket per host: Burst requests at once, refilled at
// Rate per Period. Requests beyond it wait for their turn (first come,
// first served), bounded by their context: a request whose turn comes at
// or after its deadline fails at once with ErrDeadline.
type Pace struct {
	Rate   int64         // requests per Period; zero or negative paces nothing
	Period time.Duration // zero means one second
	Burst  int64         // the bucket's size; zero means Rate
}

// Budget configures the adaptive retry budget of the Google SRE book
// ("Handling Overload", client-side throttling). For each host the
// transport counts, over the last Window, the requests (every attempt,
// including the ones it rejected itself) and the accepts (responses whose
// status is not in RetryStatus), and rejects an attempt locally with
// probability
//
//	max(0, (requests − K × accepts) / (requests + 1))
//
// returning an *Error with ErrRejected without sending it.
type Budget struct {
	// K is how many requests the client may send per accepted one before
	// rejecting locally. Zero means 2; values below 1 mean 1.
	K float64
	// Window is the span the counts cover, in twelve steps. Zero means two
	// minutes.
	Window time.Duration
}

// Transport is an http.RoundTripper that retries refused requests (429 and
// 503 by default) on the server's hints or with exponential backoff and full
// jitter, holds requests to a host whose quota is spent, and optionally
// paces requests and rejects them locally under an adaptive budget. It is
// safe for concurrent use; make one with New and share it.
//
// RoundTrip returns the last response when attempts run out, with its body
// intact; the bodies of the responses it retried are drained (up to
// 64 KiB) and closed, so that connections are reused. It stops without a
// response, returning an *Error, when the wait a retry needs reaches the
// request's deadline (ErrDeadline) or the budget rejects the request
// (ErrRejected), and returns the context's error at once when the context
// ends during a wait.
type Transport struct {
	base        http.RoundTripper
	maxAttempts int
	retryStatus []int
	retryAll    bool
	baseDelay   time.Duration
	maxDelay    time.Duration
	maxWait     time.Duration
	hintJitter  time.Duration
	quota       bool
	pacing      bool
	pace        algo.Params
	budget      bool
	k           float64
	slot        int64 // the budget window's step, in nanoseconds
	key         func(*http.Request) string
	rand        func(int64) int64
	onWait      func(Event)
	log         *slog.Logger
	hosts       hostMap
}

// Defaults of Config, as its fields' comments give them.
const (
	defaultMaxAttempts = 4
	defaultBaseDelay   = 100 * time.Millisecond
	defaultMaxDelay    = 20 * time.Second
	defaultMaxWait     = time.Minute
	defaultHintJitter  = time.Second
	defaultMaxHosts    = 1024
	defaultBudgetK     = 2
	defaultBudgetSpan  = 2 * time.Minute
)

// drainLimit is how much of a discarded response body is read so that its
// connection can be reused; a longer body's connection is closed.
const drainLimit = 64 << 10

// New returns a Transport configured by cfg.
func New(cfg Config) *Transport {
	t := &Transport{
		base:        cfg.Base,
		maxAttempts: orDefault(cfg.MaxAttempts, defaultMaxAttempts),
		retryStatus: cfg.RetryStatus,
		retryAll:    cfg.RetryNonIdempotent,
		baseDelay:   orDefault(cfg.BaseDelay, defaultBaseDelay),
		maxDelay:    orDefault(cfg.MaxDelay, defaultMaxDelay),
		maxWait:     orDefault(cfg.MaxWait, defaultMaxWait),
		hintJitter:  orDefault(cfg.HintJitter, defaultHintJitter),
		quota:       !cfg.IgnoreQuota,
		key:         cfg.Key,
		rand:        cfg.Rand,
		onWait:      cfg.OnWait,
		log:         cfg.Logger,
		hosts:       hostMap{max: orDefault(cfg.MaxHosts, defaultMaxHosts)},
	}
	if cfg.HintJitter < 0 {
		t.hintJitter = 0
	}
	if t.base == nil {
		t.base = http.DefaultTransport
	}
	if t.retryStatus == nil {
		t.retryStatus = []int{http.StatusTooManyRequests, http.StatusServiceUnavailable}
	}
	if t.rand == nil {
		t.rand = rand.Int64N
	}
	if p := cfg.Pace; p.Rate > 0 {
		t.pacing = true
		t.pace = algo.Params{
			Kind:     algo.TokenBucket,
			Rate:     p.Rate,
			Period:   int64(orDefault(p.Period, time.Second)),
			Capacity: orDefault(p.Burst, p.Rate),
		}
	}
	if b := cfg.Budget; b != nil {
		t.budget = true
		t.k = defaultBudgetK
		if b.K > 0 {
			t.k = max(b.K, 1)
		}
		t.slot = max(int64(orDefault(b.Window, defaultBudgetSpan))/budgetSlots, 1)
	} else {
		t.slot = int64(defaultBudgetSpan) / budgetSlots
	}
	return t
}

// NewClient returns an *http.Client whose Transport is New(cfg).
func NewClient(cfg Config) *http.Client {
	return &http.Client{Transport: New(cfg)}
}

func orDefault[T int | int64 | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// CloseIdleConnections closes the idle connections of the base
// RoundTripper, when it has any.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// RoundTrip sends req, retrying as configured. See Transport.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	key := t.hostKey(req)
	attempts := t.maxAttempts
	if !t.replayable(req) {
		attempts = 1
	}
	var prev *http.Response // the last refused response, drained
	var waited time.Duration
	for attempt := 1; ; attempt++ {
		if err := t.gate(ctx, req, key, attempt, prev, waited); err != nil {
			if attempt == 1 && req.Body != nil {
				_ = req.Body.Close() // a RoundTripper closes the body, even on errors
			}
			return nil, err
		}
		r := req
		if attempt > 1 {
			var err error
			if r, err = rewind(req); err != nil {
				return nil, err
			}
		}
		resp, err := t.base.RoundTrip(r)
		if err != nil {
			return nil, err
		}
		if !t.refused(resp.StatusCode) {
			if quota := t.quota && hasQuotaFields(resp.Header); quota || t.budget {
				now := time.Now()
				var hint time.Duration
				var hinted bool
				if quota {
					hint, _, hinted = quotaHint(resp.Header, now)
				}
				t.record(key, now, true, hinted, hint)
			}
			return resp, nil
		}
		now := time.Now()
		wait, need, src := t.retryWait(resp.Header, now, attempt-1)
		t.record(key, now, false, src != SourceBackoff, need)
		if attempt >= attempts {
			return resp, nil
		}
		discard(resp)
		prev = resp
		if beyond(ctx, now, need) {
			return nil, t.stop(ErrDeadline, attempt, prev, need, src)
		}
		t.notify(ctx, req, key, attempt+1, resp.StatusCode, wait, src)
		if err := sleep(ctx, wait); err != nil {
			return nil, err
		}
		waited = 0
		if src != SourceBackoff {
			waited = wait
		}
	}
}

// retryWait returns how long to wait before retry number k (0 for the
// first) after a refused response whose header is h, received at now: the
// server's hint capped at MaxWait, or else the backoff. need is the wait
// the server asked for, uncapped, which the deadline is compared with.
func (t *Transport) retryWait(h http.Header, now time.Time, k int) (wait, need time.Duration, src Source) {
	if hint, src, ok := retryHint(h, now); ok {
		return min(t.spread(hint), t.maxWait), hint, src
	}
	d := t.backoff(k)
	return d, d, SourceBackoff
}

// gate holds back an attempt, in this order: until the host's quota is
// back (self-throttling; waited, the time this attempt already waited on a
// hint, counts against MaxWait), then asks the budget, then waits for a
// pacing token. Rejected requests take no pacing token.
func (t *Transport) gate(ctx context.Context, req *http.Request, key string, attempt int, prev *http.Response, waited time.Duration) error {
	if !t.quota && !t.budget && !t.pacing {
		return nil
	}
	var h *host
	if !t.budget && !t.pacing {
		if h = t.hosts.get(key); h == nil {
			return nil
		}
	}
	now := time.Now()
	if h == nil {
		h = t.hosts.getOrCreate(key, now.UnixNano(), t.slot)
	}
	if t.quota {
		h.mu.Lock()
		need := time.Duration(h.hold - now.UnixNano())
		h.mu.Unlock()
		if need > 0 {
			if beyond(ctx, now, need) {
				return t.stop(ErrDeadline, attempt-1, prev, need, SourceQuota)
			}
			if wait := min(t.spread(need), t.maxWait-waited); wait > 0 {
				t.notify(ctx, req, key, attempt, 0, wait, SourceQuota)
				if err := sleep(ctx, wait); err != nil {
					return err
				}
				now = time.Now()
			}
		}
	}
	if t.budget && t.reject(h, now.UnixNano()) {
		return t.stop(ErrRejected, attempt-1, prev, 0, 0)
	}
	if t.pacing {
		wait, before, after, ok := t.reserve(h, now.UnixNano(), deadline(ctx))
		if !ok {
			return t.stop(ErrDeadline, attempt-1, prev, wait, SourcePacing)
		}
		if wait > 0 {
			t.notify(ctx, req, key, attempt, 0, wait, SourcePacing)
			if err := sleep(ctx, wait); err != nil {
				t.unreserve(h, before, after)
				return err
			}
		}
	}
	return nil
}

// record notes a response: an accept for the budget, and a host's spent
// quota for self-throttling.
func (t *Transport) record(key string, now time.Time, accepted, hinted bool, hint time.Duration) {
	hold := t.quota && hinted && hint > 0
	if !hold && !(t.budget && accepted) {
		return
	}
	ns := now.UnixNano()
	h := t.hosts.getOrCreate(key, ns, t.slot)
	h.mu.Lock()
	if t.budget && accepted {
		h.win.add(ns, t.slot, 0, 1)
	}
	if hold {
		h.hold = max(h.hold, ns+int64(hint))
	}
	h.mu.Unlock()
}

// reject counts a request for the budget and decides whether to reject it
// locally.
func (t *Transport) reject(h *host, now int64) bool {
	h.mu.Lock()
	req, acc := h.win.sums(now, t.slot)
	h.win.add(now, t.slot, 1, 0)
	h.mu.Unlock()
	p := (float64(req) - t.k*float64(acc)) / float64(req+1)
	if p <= 0 {
		return false
	}
	const one = 1 << 53
	return float64(t.rand(one)) < p*one
}

// reserve takes a pacing token at now, or books the first one to come,
// and returns how long to wait for it, with the bucket's states before and
// after for unreserve. It books nothing and reports false when the token
// would come at or after deadline (zero when there is none), with the wait
// it would have needed.
func (t *Transport) reserve(h *host, now, deadline int64) (wait time.Duration, before, after algo.State, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	before = h.bucket
	at := now
	after, r := algo.Step(&t.pace, before, now, 1)
	if !r.Allowed {
		if r.RetryAfter == algo.Never || r.RetryAfter > math.MaxInt64-now {
			return time.Duration(algo.Never), before, before, false
		}
		at = now + r.RetryAfter
		if deadline != 0 && at >= deadline {
			return time.Duration(r.RetryAfter), before, before, false
		}
		if after, r = algo.Step(&t.pace, before, at, 1); !r.Allowed {
			return time.Duration(r.RetryAfter), before, before, false
		}
	}
	h.bucket = after
	return time.Duration(at - now), before, after, true
}

// unreserve gives back a token that reserve booked, when no later request
// has booked one since; a token booked behind it stays where it is.
func (t *Transport) unreserve(h *host, before, after algo.State) {
	h.mu.Lock()
	if h.bucket == after {
		h.bucket = before
	}
	h.mu.Unlock()
}

// spread extends the server's wait d by a random time in [0, HintJitter].
func (t *Transport) spread(d time.Duration) time.Duration {
	if t.hintJitter <= 0 {
		return d
	}
	j := min(max(t.rand(int64(t.hintJitter)+1), 0), int64(t.hintJitter))
	if d > math.MaxInt64-time.Duration(j) {
		return d
	}
	return d + time.Duration(j)
}

// backoff returns the full-jitter sleep before retry number k (0 for the
// first): uniform in [0, min(maxDelay, baseDelay × 2^k)].
func (t *Transport) backoff(k int) time.Duration {
	ceil := t.maxDelay
	if k < 62 && t.baseDelay <= t.maxDelay>>k {
		ceil = t.baseDelay << k
	}
	n := int64(ceil)
	if n < math.MaxInt64 {
		n++
	}
	d := t.rand(n)
	return time.Duration(min(max(d, 0), int64(ceil)))
}

func (t *Transport) refused(status int) bool {
	for _, s := range t.retryStatus {
		if s == status {
			return true
		}
	}
	return false
}

// replayable reports whether req may be sent more than once.
func (t *Transport) replayable(req *http.Request) bool {
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return false
	}
	if t.retryAll {
		return true
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return req.Header.Get("Idempotency-Key") != ""
}

func (t *Transport) hostKey(req *http.Request) string {
	if t.key != nil {
		return t.key(req)
	}
	return req.URL.Host
}

func (t *Transport) stop(reason error, attempts int, prev *http.Response, wait time.Duration, src Source) *Error {
	e := &Error{Err: reason, Attempts: attempts, Wait: wait, Source: src}
	if prev != nil {
		e.Status, e.Header = prev.StatusCode, prev.Header
	}
	return e
}

// notify reports a wait to OnWait and the Logger.
func (t *Transport) notify(ctx context.Context, req *http.Request, key string, attempt, status int, wait time.Duration, src Source) {
	if t.onWait != nil {
		t.onWait(Event{Request: req, Host: key, Attempt: attempt, Status: status, Wait: wait, Source: src})
	}
	if t.log != nil {
		level, msg := slog.LevelInfo, "httpretry: retry"
		if status == 0 {
			level, msg = slog.LevelDebug, "httpretry: hold"
		}
		t.log.LogAttrs(ctx, level, msg,
			slog.String("method", req.Method),
			slog.String("host", key),
			slog.Int("attempt", attempt),
			slog.Int("status", status),
			slog.Duration("wait", wait),
			slog.String("source", src.String()))
	}
}

// rewind returns a copy of req to send again, with a fresh body.
func rewind(req *http.Request) (*http.Request, error) {
	r := req.Clone(req.Context())
	if req.Body != nil && req.Body != http.NoBody {
		body, err := req.GetBody()
		if err != nil {
			return nil, err
		}
		r.Body = body
	}
	return r, nil
}

// discard drains and closes a response body, so that its connection can
// be reused.
func discard(resp *http.Response) {
	_, _ = io.CopyN(io.Discard, resp.Body, drainLimit)
	_ = resp.Body.Close()
}

// beyond reports whether a wait of d from now reaches ctx's deadline.
func beyond(ctx context.Context, now time.Time, d time.Duration) bool {
	dl, ok := ctx.Deadline()
	return ok && !now.Add(d).Before(dl)
}

// deadline is ctx's deadline in Unix nanoseconds, 0 when it has none.
func deadline(ctx context.Context) int64 {
	if dl, ok := ctx.Deadline(); ok {
		return dl.UnixNano()
	}
	return 0
}

// sleep waits for d or until ctx ends, and returns ctx's error then.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
