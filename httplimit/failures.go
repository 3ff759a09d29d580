package httplimit

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/vocab/limits"
	"github.com/sluicehq/sluice/rules"
)

// Failures are limits that count only failed responses: "5 failed logins
// per IP per hour", "3 declined card payments per account per day". Their
// descriptors are built from each request like Config.Descriptors and
// matched by the same rules, but a request is charged to them only after
// the handler answered with one of Statuses:
//
//   - before the handler, their limits are checked without charging: a
//     request is denied when one more failure would exceed one of them (or
//     its key serves a block_for penalty). That check is decided on its
//     own, before Config.Descriptors, so that a request it denies consumes
//     nothing anywhere. A denied check is the decision of a failure (cost
//     1) that did not fit: its Retry-After is exact and it starts the
//     limit's block_for penalty, as any denial does;
//   - after the handler, a response with one of Statuses charges each of
//     them 1, each on its own (a failure counts even where another limit
//     denies), with the request's context detached from cancellation: a
//     client that hangs up after failing is still counted.
//
// Failure limits count at their nominal quota: a soft_percent or
// elastic_ceiling margin does not admit more failures (it would have to
// charge the attempt before knowing whether it fails).
//
// Limits that count afterwards can be overrun by the requests in flight
// at once: with 5 failures left, 20 concurrent attempts all pass the check.
// Pair them with Concurrency on the same key to bound that. In the rare
// race where the limit frees up between the check and the cost-1 decision
// that confirms a denial, that decision is admitted and charged: the
// request goes on and is not charged again, whatever its status (the error
// is one failure too many counted, never too few).
//
// A concurrency limit (`concurrency:`) on a rule that a failure
// descriptor reaches caps nothing: a failure is counted as its response
// is written, with nothing left in flight. Put it on Config.Descriptors'
// rules instead (sluice proxy refuses such a file). Any permit a failure
// decision takes anyway is given back before the decision returns.
//
// When Config.Descriptors is empty and Failures is set, the request has no
// other descriptors (the default remote_address descriptor applies only
// when both are unset), and the rate limit headers describe the failure
// limits: X-RateLimit-Remaining is the failures left.
type Failures struct {
	// Descriptors are the descriptors whose limits count failures. At
	// least one.
	Descriptors []Descriptor

	// Statuses are the response statuses that count as failures, such as
	// 401 and 403 for a login, or 402 for a payment. At least one, each
	// between 100 and 599.
	Statuses []int
}

// failures is a validated Failures.
type failures struct {
	descs    [][]entry
	statuses [10]uint64 // a bit per status 0..639
}

func (m *middleware) newFailures(cfg *Failures) (*failures, error) {
	if len(cfg.Descriptors) == 0 {
		return nil, fmt.Errorf("%w: Failures needs at least one descriptor", ErrConfig)
	}
	if len(cfg.Descriptors) > MaxDescriptors {
		return nil, fmt.Errorf("%w: Failures has %d descriptors (at most %d)", ErrConfig, len(cfg.Descriptors), MaxDescriptors)
	}
	if len(cfg.Statuses) == 0 {
		return nil, fmt.Errorf("%w: Failures needs at least one status", ErrConfig)
	}
	f := &failures{}
	for _, st := range cfg.Statuses {
		if st < 100 || st > 599 {
			return nil, fmt.Errorf("%w: Failures status %d is not an HTTP status", ErrConfig, st)
		}
		f.statuses[st/64] |= 1 << (st % 64)
	}
	var err error
	if f.descs, err = m.compileAll(cfg.Descriptors); err != nil {
		return nil, fmt.Errorf("failures: %w", err)
	}
	return f, nil
}

// counts reports whether status is a failure.
func (f *failures) counts(status int) bool {
	return status >= 0 && status < 640 && f.statuses[status/64]&(1<<(status%64)) != 0
}

// prepareFailures fills s.fail with the failure descriptors of f's request
// as peeks, and adds them to s.main as peeks too: the main decision
// reports the failures left, for the headers, and a key serving a
// block_for penalty denies it.
func (m *middleware) prepareFailures(f *flow) bool {
	s := f.s
	s.fail.reset()
	n, err := m.fill(&s.fail, m.failures.descs, f.r, s, 0)
	if err != nil {
		m.invalid(f.w, f.r, err)
		return false
	}
	s.main.appendCopy(&s.fail)
	f.fails = n
	return true
}

// serveFailures serves the admitted request, charging its failure when
// its response's status is one (unless it was charged already).
func (m *middleware) serveFailures(f *flow, next http.Handler) {
	if f.fails == 0 || f.precharged {
		next.ServeHTTP(f.w, f.r)
		return
	}
	sw := statusWriter{ResponseWriter: f.w, m: m, s: f.s, ctx: f.r.Context(), n: f.n}
	next.ServeHTTP(&sw, f.r)
	if sw.status == 0 {
		sw.status = http.StatusOK
		sw.charge()
	}
}

// checkFailures decides whether one more failure fits the failure limits
// of s.fail, into s.out: first as a peek, and when a limit has nothing
// left, as a failure (cost 1) for the exact denial. It reports whether the
// failure limits would deny the request (in shadow mode they deny
// nothing), and whether it was charged a failure already (the confirming
// decision was admitted, in a race with the limit freeing up).
func (m *middleware) checkFailures(ctx context.Context, s *scratch) (wouldDeny, charged bool, err error) {
	o := &s.out
	if err := m.decideDescs(ctx, s, s.fail.descs); err != nil {
		return false, false, err
	}
	if o.OverLimit() {
		return true, false, nil // a block_for penalty, or fail_closed
	}
	if o.Degraded != rules.FailDefault {
		return false, false, nil
	}
	i := exhausted(o)
	if i < 0 {
		return false, false, nil
	}
	if l := o.Limits[i].Limit; l.SoftPercent > 0 || l.ElasticCeiling > 0 {
		// A margin would admit the confirming failure, and charge it
		// whatever the response: failure limits count at their nominal
		// quota, denied until the limit has some again.
		denyAt(o, i)
		return true, false, nil
	}
	setCost(s.fail.descs, 1)
	if err := m.decideDescs(ctx, s, s.fail.descs); err != nil {
		return false, false, err
	}
	if o.OverLimit() {
		return true, false, nil
	}
	return false, o.Degraded == rules.FailDefault, nil
}

// denyAt turns the peek o into a denial by its limit i, retrying when that
// limit has quota again (sluice.Limit.MoreAfter).
func denyAt(o *decide.Outcome, i int) {
	l := &o.Limits[i]
	wait := max(limits.MoreAfter(l.Limit, l.Decision), time.Second)
	l.Decision.Allowed, l.Decision.RetryAfter = false, wait
	o.Overall = l.Decision
	o.Overall.Index = i
}

// exhausted returns the index of an enforced limit of o with nothing left,
// or -1.
func exhausted(o *decide.Outcome) int {
	for i := range o.Limits {
		if l := &o.Limits[i]; !l.Limit.Shadow && l.Decision.Remaining <= 0 {
			return i
		}
	}
	return -1
}

// setCost sets the cost of every descriptor of descs to n.
func setCost(descs []rules.Descriptor, n int64) {
	for i := range descs {
		descs[i].Cost = n
	}
}

// statusWriter records the status of the response written through it,
// and charges the failure limits before a failed response's header goes
// out, so that its rate limit headers count the failure. It unwraps for
// http.ResponseController, and flushes and hijacks through it, so that
// streaming and protocol upgrades still work.
type statusWriter struct {
	http.ResponseWriter
	m      *middleware
	s      *scratch
	ctx    context.Context
	n      int // Config.Descriptors in s.main; the failure peeks follow
	status int // the first final status; 0 until written
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
		w.charge()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
		w.charge()
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) ReadFrom(r io.Reader) (int64, error) {
	if w.status == 0 {
		w.status = http.StatusOK
		w.charge()
	}
	return io.Copy(w.ResponseWriter, r)
}

// charge charges the failure limits one failure when w.status is one,
// and sets the rate limit headers again from that decision: the main
// descriptors as peeks, the failure descriptors with cost 1. The request's
// context is detached from cancellation: a client that hangs up after
// failing is still counted.
func (w *statusWriter) charge() {
	m, s := w.m, w.s
	if !m.failures.counts(w.status) {
		return
	}
	// Each failure limit is charged on its own: the failure happened,
	// and one limit denying (spent by failures in flight at once) or a
	// main limit's block must not keep it from the others.
	ctx := context.WithoutCancel(w.ctx)
	o := &s.out
	setCost(s.fail.descs, 1)
	for i := range s.fail.descs {
		if err := m.decideDescs(ctx, s, s.fail.descs[i:i+1]); err != nil {
			if n, ok := m.errLog.Allow(time.Now()); ok {
				m.log.Warn("rate limit failure not counted", "domain", m.domain, "err", err, "not_logged", n)
			}
		}
	}
	// The headers again, from a peek at every limit of the request.
	setCost(s.main.descs, 0)
	if err := m.decideDescs(ctx, s, s.main.descs); err == nil && o.Degraded != rules.FailOpen {
		m.setHeaders(w.Header(), s, false)
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) Flush() { _ = w.FlushError() }

// FlushError flushes through http.ResponseController, so that a writer
// below with no Flush of its own (only Unwrap) does not drop it. A flush
// before any write sends the header, 200, as the server's own does.
func (w *statusWriter) FlushError() error {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.ResponseWriter).Hijack()
}
