package proxy

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/httplimit"
)

// recorder is the ResponseWriter a route hands the middleware, pooled: it
// records what became of the request for the metrics, and bounds a client
// that stops reading its answer (Config.WriteIdleTimeout). Unwrap lets
// http.ResponseController, through which ReverseProxy flushes and
// hijacks, reach the server's own ResponseWriter; Flush, FlushError and
// Hijack pass the same calls on for a writer above that looks for them
// by type (http.Flusher, http.Hijacker) instead.
type recorder struct {
	http.ResponseWriter
	idle        time.Duration    // Config.WriteIdleTimeout; 0: none
	result      httplimit.Result // 0 until the middleware says
	upstreamErr bool
	upstreamTO  bool // no response headers within Config.UpstreamTimeout (upstreamError)
	permitLost  bool // cancelled for a lost permit (pass)
	stalled     bool // a write to the client made no progress for idle
	upgraded    *idleConn
	cancel      context.CancelCauseFunc // a token route's, for an upstream timeout; nil otherwise
	settled     bool                    // a token budget's settlement, below
	reserved    int64
	spent       int64
}

// Unwrap returns the server's ResponseWriter, for http.ResponseController.
func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// WriteHeader passes the status on; a 1xx is written to the client at
// once, so it gets the write deadline too.
func (w *recorder) WriteHeader(code int) {
	w.extend()
	w.ResponseWriter.WriteHeader(code)
}

func (w *recorder) Write(b []byte) (int, error) {
	w.extend()
	n, err := w.ResponseWriter.Write(b)
	if err != nil {
		w.failed(err)
	}
	return n, err
}

func (w *recorder) Flush() { _ = w.FlushError() }

func (w *recorder) FlushError() error {
	w.extend()
	err := http.NewResponseController(w.ResponseWriter).Flush()
	if err != nil {
		w.failed(err)
	}
	return err
}

// Hijack hands the connection over; with a write idle timeout, each write
// to it must be done within it, as the answer's writes (idleConn).
func (w *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil || w.idle <= 0 {
		return c, brw, err
	}
	c.SetWriteDeadline(time.Now().Add(w.idle)) // the 101's header, written through brw
	w.upgraded = &idleConn{Conn: c, idle: w.idle}
	return w.upgraded, brw, nil
}

// extend gives the next write to the client idle to be done: the time the
// client may read nothing of its answer. The deadline is the
// connection's; on HTTP/1 one that passes while nothing is being written
// does nothing, so a stream that pauses for longer (between two events)
// is not cut, only a write that cannot go out. (HTTP/2 resets a stream at
// its deadline whatever it does: sluice proxy serves HTTP/1.)
func (w *recorder) extend() {
	if w.idle > 0 {
		http.NewResponseController(w.ResponseWriter).SetWriteDeadline(time.Now().Add(w.idle))
	}
}

// failed notes a write to the client that failed for its deadline. The
// server has then closed the connection and cancelled the request's
// context; ReverseProxy aborts the handler (http.ErrAbortHandler), which
// closes the upstream's response, and the middleware releases the
// request's permits and settles its tokens as cut off.
func (w *recorder) failed(err error) {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		w.stalled = true
	}
}

// clearWriteDeadline clears the write deadline a previous request on the
// connection may have left (its final writes need one: the server writes
// the end of a chunked answer after the handler returns), so that the
// writes of this request that do not pass through a recorder (a redirect,
// a 100 Continue, the header of a 101) are not failed by a deadline past.
func clearWriteDeadline(w http.ResponseWriter) {
	http.NewResponseController(w).SetWriteDeadline(time.Time{})
}

// idleConn is an upgraded (hijacked) connection whose every write must be
// done within idle: a WebSocket client that stops reading while the
// upstream sends is let go, and with it its permits; one that is merely
// quiet (nothing to send it) is never cut. ReverseProxy writes to it from
// its own goroutine, which may outlive the handler: stalled is its own,
// not the pooled recorder's.
type idleConn struct {
	net.Conn
	idle    time.Duration
	stalled atomic.Bool
}

func (c *idleConn) Write(b []byte) (int, error) {
	c.Conn.SetWriteDeadline(time.Now().Add(c.idle))
	n, err := c.Conn.Write(b)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		c.stalled.Store(true)
	}
	return n, err
}

// CloseWrite half-closes the connection when the upstream has closed its
// side, as ReverseProxy does with a connection that can.
func (c *idleConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

func (rt *route) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := rt.t.p
	start := time.Now()
	rec := p.recorder.Get().(*recorder)
	*rec = recorder{ResponseWriter: w, idle: p.writeIdle}
	if rt.unlimited {
		rec.result = httplimit.Unlimited
	}
	// Deferred, so that a response cut short (ReverseProxy aborts the
	// handler with http.ErrAbortHandler when the copy fails) is counted.
	defer rt.done(rec, r, start)
	r = rt.m.traced(r)
	if rt.tokens && p.upstreamTimeout > 0 {
		// An upstream timeout cancels the request, so that its token
		// budget settles it as cut off (upstreamError).
		ctx, cancel := context.WithCancelCause(r.Context())
		rec.cancel = cancel
		r = r.WithContext(ctx)
	}
	rt.h.ServeHTTP(rec, r)
}

// done counts the request rec recorded, and logs one cancelled for a
// lost permit or aborted for a client that stopped reading (at most one
// such line a second each). One cancelled for a lost permit counts as an
// error, whatever the middleware reported when it let it through.
func (rt *route) done(rec *recorder, r *http.Request, start time.Time) {
	p := rt.t.p
	if rec.cancel != nil {
		rec.cancel(nil)
	}
	res := rec.result
	if res == 0 { // cannot happen: the middleware reports every request
		res = httplimit.Error
	}
	if rec.permitLost {
		res = httplimit.Error
		if due(&p.lostLog) {
			p.log.Warn("request cancelled: its concurrency permit was lost (the store no longer held it, and other requests hold every slot)",
				"route", rt.name, "method", r.Method, "path", r.URL.Path)
		}
	}
	stalled := rec.stalled || rec.upgraded != nil && rec.upgraded.stalled.Load()
	if stalled && due(&p.stallLog) {
		p.log.Warn("request aborted: its client read nothing of the answer for the write idle timeout",
			"route", rt.name, "method", r.Method, "path", r.URL.Path, "write_idle_timeout", p.writeIdle)
	}
	rt.m.observe(res, rec.upstreamErr, time.Since(start))
	rt.m.timedOut(stalled, rec.upstreamTO)
	if rec.settled {
		rt.m.settled(rec.reserved, rec.spent)
	}
	*rec = recorder{}
	p.recorder.Put(rec)
}

// recorderOf finds the route's recorder under w: the middleware may wrap
// it (to see the status of a route with failure limits).
func recorderOf(w http.ResponseWriter) *recorder {
	for {
		switch x := w.(type) {
		case *recorder:
			return x
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return nil
		}
	}
}
