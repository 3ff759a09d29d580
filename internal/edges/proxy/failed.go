package proxy

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/vocab/permittrace"
)

// pass sends an admitted request upstream, and marks it for the metrics
// and the log (route.done) when it ends cancelled because its concurrency
// permit was lost: answered 503 (upstreamError), or its answer cut short.
func (t *table) pass(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if lostPermit(r) {
			if rec := recorderOf(w); rec != nil {
				rec.permitLost = true
			}
		}
	}()
	t.rp.ServeHTTP(w, r)
}

// lostPermit reports whether r's context was cancelled because a renewal
// found its concurrency permit lost (httplimit's Permit.Keep): the store
// held it no more, and others held every slot of its key.
func lostPermit(r *http.Request) bool {
	ctx := r.Context()
	return ctx.Err() != nil && errors.Is(context.Cause(ctx), permittrace.ErrLost)
}

// upstreamError answers a request the upstream did not answer: 502, 504
// when it sent no response headers within Config.UpstreamTimeout, or 503
// when the proxy cancelled it for a lost permit.
func (t *table) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	p := t.p
	if lostPermit(r) {
		// Not the upstream's doing, nor the client's: pass marks it,
		// route.done counts and logs it.
		writeProblem(w, http.StatusServiceUnavailable, ProblemPermitLost, "Service Unavailable",
			"The request's concurrency slot was lost while it ran (the limiter's store no longer held it, and other requests hold every slot), so it was cancelled.")
		return
	}
	gone := r.Context().Err() != nil // the client left: not the upstream's fault
	timedOut := !gone && p.upstreamTimeout > 0 && headerTimeout(err)
	rec := recorderOf(w)
	if rec != nil && !gone {
		rec.upstreamErr = true
		rec.upstreamTO = timedOut
		if timedOut && rec.cancel != nil {
			// The upstream may have spent tokens on it: cancelled, as a
			// client that hangs up, its token budget charges it whole.
			rec.cancel(errUpstreamTimeout)
		}
	}
	switch {
	case timedOut:
		if due(&p.lastLog) {
			p.log.Warn("upstream timeout: no response headers within the upstream timeout; answered 504", "method", r.Method, "path", r.URL.Path, "upstream_timeout", p.upstreamTimeout)
		}
	case !gone && due(&p.lastLog):
		p.log.Warn("upstream error", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	if p.cfg.ErrorHandler != nil {
		p.cfg.ErrorHandler(w, r, err)
		return
	}
	if timedOut {
		writeProblem(w, http.StatusGatewayTimeout, ProblemGatewayTimeout, "Gateway Timeout",
			"The upstream server did not start its answer in time.")
		return
	}
	writeProblem(w, http.StatusBadGateway, ProblemBadGateway, "Bad gateway",
		"The upstream server could not be reached or failed to answer.")
}

// errUpstreamTimeout is the cause of a token route's request cancelled
// for an upstream timeout.
var errUpstreamTimeout = errors.New("proxy: no response headers from the upstream within the upstream timeout")

// headerTimeout reports whether err is the transport's
// ResponseHeaderTimeout: a timeout (it is context.DeadlineExceeded, as
// net/http's says, though no context of the proxy's has a deadline) that
// is not the dial's (a *net.OpError, answered 502 as before).
func headerTimeout(err error) bool {
	var op *net.OpError
	return errors.Is(err, context.DeadlineExceeded) && !errors.As(err, &op)
}

// due reports whether a log line may be written now, at most one a second:
// a dead upstream fails every request, and the log must not grow with the
// request rate.
func due(last *atomic.Int64) bool {
	now := time.Now().UnixNano()
	prev := last.Load()
	return now-prev >= int64(time.Second) && last.CompareAndSwap(prev, now)
}
