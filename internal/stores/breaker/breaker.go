// Package breaker is a circuit breaker for the calls of a store to its
// backend (the Redis store wraps every Redis call in one): after
// Config.Failures consecutive failures it opens and turns calls away at once
// with ErrOpen, so that a dead backend is not hammered and callers do not
// wait on it; after a cooldown it lets one probe call through (half-open),
// whose success closes it and whose failure opens it again for twice as
// long, up to Config.MaxCooldown.
//
// The closed state, where a breaker spends its life, costs an atomic load in
// Allow and in Done(nil): no lock, no allocation, no clock read.
//
// The caller decides what counts as a failure: it reports the errors that
// say the backend is unwell (a refused connection, a deadline of its own),
// and reports its own context's cancellation as nil or not at all.
//
// This package imports only the standard library.
package breaker

import (
	"errors"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// ErrOpen is returned by Allow while the breaker turns calls away.
var ErrOpen = errors.New("circuit breaker open")

// Config configures a Breaker. Zero fields mean the default in their comment.
type Config struct {
	// Failures is the number of consecutive failures that open the
	// breaker. Zero means 5.
	Failures int

	// Cooldown is how long the breaker stays open the first time before it
	// lets a probe through. Each failed probe doubles it, up to
	// MaxCooldown; a success resets it. Zero means 200ms.
	Cooldown time.Duration

	// MaxCooldown caps the cooldown. Zero means 5s; it is never below
	// Cooldown.
	MaxCooldown time.Duration

	// Now is the clock. Nil means time.Now.
	Now func() time.Time
}

// Defaults of Config.
const (
	DefaultFailures    = 5
	DefaultCooldown    = 200 * time.Millisecond
	DefaultMaxCooldown = 5 * time.Second
)

// State is the state of a breaker.
type State int32

const (
	// Closed lets every call through and counts consecutive failures.
	Closed State = iota
	// HalfOpen lets one probe call through at a time and turns the others
	// away; the probe's outcome closes or reopens the breaker.
	HalfOpen
	// Open turns every call away until the cooldown ends.
	Open
)

var stateNames = [...]string{"closed", "half_open", "open"}

// String returns "closed", "half_open" or "open".
func (s State) String() string {
	if s >= 0 && int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "breaker.State(" + strconv.Itoa(int(s)) + ")"
}

// Breaker is a circuit breaker. Make one with New; it is safe for concurrent
// use.
//
// Every call goes through Allow, and every call that Allow let through
// reports its outcome with Done:
//
//	if err := b.Allow(); err != nil {
//		return err // ErrOpen: the backend is not called
//	}
//	err := call()
//	b.Done(err)
type Breaker struct {
	state    atomic.Int32 // a State
	failures atomic.Int32 // consecutive failures while closed
	// until, on the breaker's clock (nanoseconds since start): while
	// open, when the next probe may go; while half-open, when another
	// probe may go if the one in flight has not reported.
	until atomic.Int64

	threshold   int32
	base, limit time.Duration
	now         func() time.Time
	start       time.Time
	onChange    func(from, to State)

	mu       sync.Mutex    // serializes the changes of state
	cooldown time.Duration // the current open period; guarded by mu
}

// New returns a closed breaker.
func New(cfg Config) *Breaker {
	b := &Breaker{
		threshold: DefaultFailures,
		base:      cfg.Cooldown,
		limit:     cfg.MaxCooldown,
		now:       cfg.Now,
	}
	if cfg.Failures > 0 {
		b.threshold = int32(min(cfg.Failures, math.MaxInt32))
	}
	if b.base <= 0 {
		b.base = DefaultCooldown
	}
	if b.limit <= 0 {
		b.limit = DefaultMaxCooldown
	}
	b.limit = max(b.limit, b.base)
	if b.now == nil {
		b.now = time.Now
	}
	b.start = b.now()
	b.cooldown = b.base
	return b
}

// OnChange has f called at every change of state, for metrics and logs. Set
// it before the breaker is used. f is called synchronously, in the order of
// the changes, while the breaker holds its lock: it must be quick and must
// not call Allow or Done (State is fine).
func (b *Breaker) OnChange(f func(from, to State)) { b.onChange = f }

// State returns the current state.
func (b *Breaker) State() State { return State(b.state.Load()) }

// Allow reports whether a call may go ahead: nil, or ErrOpen. A closed
// breaker lets every call through. An open one turns calls away until its
// cooldown ends, then lets one probe through and turns the others away while
// the probe is in flight; a probe that has not reported after another
// cooldown is given up on and the next call probes instead. A call that
// Allow let through must report its outcome with Done.
func (b *Breaker) Allow() error {
	if State(b.state.Load()) == Closed {
		return nil
	}
	return b.allowSlow()
}

func (b *Breaker) allowSlow() error {
	t := b.clock()
	if t < b.until.Load() {
		return ErrOpen
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if State(b.state.Load()) == Closed {
		return nil
	}
	if t < b.until.Load() {
		return ErrOpen // another call took the probe
	}
	b.until.Store(t + int64(b.cooldown))
	b.set(HalfOpen)
	return nil
}

// Done reports the outcome of a call that Allow let through: nil for a
// success, the error for a failure. A success closes a half-open breaker
// and resets the count of failures; a failure counts towards opening a
// closed breaker, and reopens a half-open one with twice the cooldown.
// Outcomes reported while the breaker is open (of calls let through before
// it opened) change nothing.
func (b *Breaker) Done(err error) {
	if err != nil {
		b.failure()
		return
	}
	if State(b.state.Load()) == Closed {
		// Load before storing: a shared cache line that every call
		// writes would cost more than the breaker itself.
		if b.failures.Load() != 0 {
			b.failures.Store(0)
		}
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if State(b.state.Load()) != HalfOpen {
		return
	}
	b.failures.Store(0)
	b.cooldown = b.base
	b.set(Closed)
}

func (b *Breaker) failure() {
	switch State(b.state.Load()) {
	case Closed:
		if b.failures.Add(1) < b.threshold {
			return
		}
	case Open:
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch State(b.state.Load()) {
	case Closed:
		if b.failures.Load() < b.threshold {
			return // a success came in between
		}
		b.cooldown = b.base
	case HalfOpen:
		b.cooldown = min(2*b.cooldown, b.limit)
	case Open:
		return
	}
	b.failures.Store(0)
	b.until.Store(b.clock() + int64(b.cooldown))
	b.set(Open)
}

// set changes the state; b.mu is held.
func (b *Breaker) set(to State) {
	from := State(b.state.Swap(int32(to)))
	if from != to && b.onChange != nil {
		b.onChange(from, to)
	}
}

// clock is the time since New on the breaker's clock, monotonic with the
// default clock.
func (b *Breaker) clock() int64 { return int64(b.now().Sub(b.start)) }
