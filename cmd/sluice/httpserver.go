package main

import (
	"io"
	"log/slog"
	"net/http"
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
// The deadline is on the connection, so it is set only while the body is
// being read: from the start of the request (which also bounds the server
// draining a body the handler did not read) to the body's end, when the
// server clears it to watch the connection during the handler; a request
// without a body is left alone, so a long answer (a stream, a profile) is
// never cut by it. idle <= 0 disables it.
func withBodyTimeout(h http.Handler, idle time.Duration) http.Handler {
	if idle <= 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			h.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if rc.SetReadDeadline(time.Now().Add(idle)) == nil {
			r.Body = &idleBody{ReadCloser: r.Body, rc: rc, idle: idle}
		}
		h.ServeHTTP(w, r)
	})
}

// idleBody is a request body whose every read must get data within idle.
type idleBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	idle time.Duration
	done bool // the body ended: the server watches the connection now
}

func (b *idleBody) Read(p []byte) (int, error) {
	if !b.done {
		b.rc.SetReadDeadline(time.Now().Add(b.idle))
	}
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.done = true
	}
	return n, err
}
