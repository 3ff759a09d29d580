package proxy

import (
	"bufio"
	"net"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/httplimit"
)

// recorder is the ResponseWriter a route hands the middleware, pooled: it
// records what became of the request for the metrics. Unwrap lets
// http.ResponseController, through which ReverseProxy flushes and
// hijacks, reach the server's own ResponseWriter; Flush, FlushError and
// Hijack pass the same calls on for a writer above that looks for them
// by type (http.Flusher, http.Hijacker) instead.
type recorder struct {
	http.ResponseWriter
	result      httplimit.Result // 0 until the middleware says
	upstreamErr bool
	permitLost  bool // cancelled for a lost permit (pass)
	settled     bool // a token budget's settlement, below
	reserved    int64
	spent       int64
}

// Unwrap returns the server's ResponseWriter, for http.ResponseController.
func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *recorder) Flush() { _ = w.FlushError() }

func (w *recorder) FlushError() error { return http.NewResponseController(w.ResponseWriter).Flush() }

func (w *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

func (rt *route) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := rt.t.p
	start := time.Now()
	rec := p.recorder.Get().(*recorder)
	*rec = recorder{ResponseWriter: w}
	if rt.unlimited {
		rec.result = httplimit.Unlimited
	}
	// Deferred, so that a response cut short (ReverseProxy aborts the
	// handler with http.ErrAbortHandler when the copy fails) is counted.
	defer rt.done(rec, r, start)
	rt.h.ServeHTTP(rec, rt.m.traced(r))
}

// done counts the request rec recorded, and logs one cancelled for a
// lost permit (at most one such line a second): it counts as an error,
// whatever the middleware reported when it let it through.
func (rt *route) done(rec *recorder, r *http.Request, start time.Time) {
	res := rec.result
	if res == 0 { // cannot happen: the middleware reports every request
		res = httplimit.Error
	}
	if rec.permitLost {
		res = httplimit.Error
		if p := rt.t.p; due(&p.lostLog) {
			p.log.Warn("request cancelled: its concurrency permit was lost (the store no longer held it, and other requests hold every slot)",
				"route", rt.name, "method", r.Method, "path", r.URL.Path)
		}
	}
	rt.m.observe(res, rec.upstreamErr, time.Since(start))
	if rec.settled {
		rt.m.settled(rec.reserved, rec.spent)
	}
	*rec = recorder{}
	rt.t.p.recorder.Put(rec)
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
