package main

import (
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"
)

// defaultBodyTimeout is the default of --body-timeout: the longest pause
// allowed in a request body, as nginx's client_body_timeout.
const defaultBodyTimeout = time.Minute

// bodyTimeoutUsage is the usage of --body-timeout, in serve and proxy.
const bodyTimeoutUsage = "the longest a client may pause while it sends a request body (the time between two reads of it) on every HTTP listener; then the request fails and its connection is closed. It bounds a stalled upload, not a long one that keeps sending; 0 disables it"

// newHTTPServer is the HTTP server of every listener of sluice's
// commands: a request's headers must arrive within 10 s, and its body
// may not pause longer than bodyTimeout (see withBodyTimeout).
func newHTTPServer(h http.Handler, log *slog.Logger, bodyTimeout time.Duration) *http.Server {
	return &http.Server{
		Handler:           withBodyTimeout(h, bodyTimeout),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// withBodyTimeout bounds how long a client may send nothing of the body
// of a request: every read of the body must get data within idle, or it
// fails, and with it the request, whose connection is closed. The bound
// is on pauses, not on the whole body, so that a large upload streamed
// through sluice proxy at any steady rate is never cut; a client that
// sends its headers and then stalls is let go after idle.
//
// http.Server's ReadTimeout would bound the whole request instead, a
// deadline that a long upload (or an import of overrides) can never meet.
//
// The deadline is on the connection (http.ResponseController), so it is
// set only while the body is read: before each read of it, and when the
// handler returns before its end, for the server to read and drop the
// rest. Once the body has ended the server clears the deadline to watch
// the connection, and it is not set again; a request without a body is
// left alone. So a handler that takes its time, or a long answer (a
// stream, a profile), is never cut by it. idle <= 0 disables it.
func withBodyTimeout(h http.Handler, idle time.Duration) http.Handler {
	if idle <= 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			h.ServeHTTP(w, r)
			return
		}
		b := &idleBody{ReadCloser: r.Body, rc: http.NewResponseController(w), idle: idle}
		r.Body = b
		h.ServeHTTP(w, r)
		b.extend() // what is left, the server drops: that may not stall either
	})
}

// idleBody is a request body whose every read must get data within idle.
// It is read by one goroutine at a time, not always the handler's (the
// proxy's transport reads it), hence the atomic.
type idleBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	idle time.Duration
	done atomic.Bool // the body ended: the server watches the connection now
}

func (b *idleBody) Read(p []byte) (int, error) {
	b.extend()
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.done.Store(true)
	}
	return n, err
}

// extend gives the next read of the body idle, unless the body has ended.
func (b *idleBody) extend() {
	if !b.done.Load() {
		b.rc.SetReadDeadline(time.Now().Add(b.idle))
	}
}
