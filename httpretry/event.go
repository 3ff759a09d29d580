package httpretry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Event describes one wait of the transport, before a retry or before an
// attempt that self-throttling or pacing holds back. Config.OnWait
// receives it before the wait begins.
type Event struct {
	Request *http.Request // the caller's request; read it, never change it
	Host    string        // the host's key (Config.Key)
	Attempt int           // the attempt that follows the wait: 1 is the first, 2 the first retry
	Status  int           // the refused response's status before a retry; otherwise 0
	Wait    time.Duration // how long the transport waits, MaxWait and hints' caps applied
	Source  Source        // where Wait came from
}

// ErrDeadline is the reason of an *Error when the wait a request needs
// reaches its context's deadline: the server's hint, the host's spent
// quota, the pacing limiter or the backoff says that no attempt could be
// sent in time, so the transport fails at once instead of sleeping in
// vain.
var ErrDeadline = errors.New("the wait reaches the request's deadline")

// ErrRejected is the reason of an *Error when the adaptive retry budget
// (Config.Budget) rejects a request locally, without sending it.
var ErrRejected = errors.New("rejected locally by the adaptive retry budget")

// Error is the error of a request that the transport stopped without a
// response to return: a wait beyond the deadline (ErrDeadline) or a local
// rejection (ErrRejected). The last refused response, if any, has been
// drained and closed; its status and header are kept here.
//
// errors.Is(err, ErrDeadline) and errors.Is(err, ErrRejected) tell the
// reasons apart; an ErrDeadline error also matches
// context.DeadlineExceeded, like any request that cannot finish in time.
type Error struct {
	Err      error         // ErrDeadline or ErrRejected
	Attempts int           // the attempts sent before stopping
	Status   int           // the last response's status; 0 when none was received
	Header   http.Header   // the last response's header; nil when none was received
	Wait     time.Duration // the wait that was needed (ErrDeadline), uncapped
	Source   Source        // where Wait came from
}

func (e *Error) Error() string {
	s := "httpretry: " + e.Err.Error()
	if e.Err == ErrDeadline {
		s = fmt.Sprintf("httpretry: a wait of %v (%v) reaches the request's deadline", e.Wait, e.Source)
	}
	if e.Status != 0 {
		s += fmt.Sprintf(" (after %d %s)", e.Status, http.StatusText(e.Status))
	}
	return s
}

// Unwrap returns the reason, and context.DeadlineExceeded with ErrDeadline.
func (e *Error) Unwrap() []error {
	if e.Err == ErrDeadline {
		return []error{e.Err, context.DeadlineExceeded}
	}
	return []error{e.Err}
}
