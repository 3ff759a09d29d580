package httplimit

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/base/entrytext"
	"github.com/sluicehq/sluice/rules"
)

// DefaultMaxQueue is the Shaping.MaxQueue of a zero field.
const DefaultMaxQueue = 100

// Shaping delays requests instead of denying them: the leaky bucket as a
// queue, as NGINX limit_req with burst and delay. A request that the
// limits deny, and that waiting could admit within MaxDelay, waits in a
// queue of its key (its descriptors' values) and is decided again when its
// turn comes and its limits' Retry-After has passed; it goes on to the
// handler once admitted, late. The limits themselves set the pace: with a
// leaky_bucket (or gcra) limit of rate r and burst b, the first b requests
// of a burst pass at once and the others are released one every 1/r, in
// the order they came, never faster; NGINX's burst=B delay=D is a burst of
// D+1 with MaxQueue B-D.
//
// The queue is FIFO per key in this process: while a key has requests
// waiting, a new request of that key joins the end of the queue without
// being decided, and only the head of the queue is decided. Its limits are
// decided by the Decider, so with a shared store several processes
// together never exceed the rate; each keeps its own queue order.
//
// A request is denied as usual (429) when the limits deny it with a
// Retry-After beyond MaxDelay (a block_for penalty, a request larger than
// the burst, a window that ends later), when its key already has MaxQueue
// requests waiting (it is then decided at once, and so may pass when the
// limits happen to admit it), or when its MaxDelay, counted from its
// arrival, runs out before it is admitted (it is then decided once more).
// A request whose context ends while it waits (the client went away)
// leaves the queue at once and is not answered; the requests behind it
// move up. Answers of the failure policy (a store failing) are never
// delayed, nor is a denial that names no wait.
//
// A waiting request holds its goroutine and connection: MaxQueue bounds
// the waiters of one key, the server's own limits on connections bound
// them all.
//
// The pace comes from the Decider's Retry-After: exact with decide.Decider;
// over a remote rate limit service (rlsclient), the remote's reset, which a
// sluice serve answers as the time until the request would be admitted
// and envoyproxy/ratelimit as the end of its window.
type Shaping struct {
	// MaxDelay is the longest a request may wait, from its arrival to
	// its admission. Required (positive).
	MaxDelay time.Duration

	// MaxQueue is the most requests waiting per key. Zero means
	// DefaultMaxQueue.
	MaxQueue int
}

// shaper is a validated Shaping and its queues.
type shaper struct {
	maxDelay time.Duration
	maxQueue int
	mu       sync.Mutex
	queues   map[string]*queue
}

// queue is the requests of one key waiting, head first.
type queue struct {
	waiters []*waiter
}

// waiter is one request in a queue; turn is closed when it becomes the
// head.
type waiter struct {
	turn chan struct{}
}

func newShaper(cfg *Shaping) (*shaper, error) {
	if cfg.MaxDelay <= 0 {
		return nil, fmt.Errorf("%w: Shaping.MaxDelay must be positive", ErrConfig)
	}
	if cfg.MaxQueue < 0 || cfg.MaxQueue > 1<<20 {
		return nil, fmt.Errorf("%w: Shaping.MaxQueue %d is not between 0 and %d", ErrConfig, cfg.MaxQueue, 1<<20)
	}
	sh := &shaper{maxDelay: cfg.MaxDelay, maxQueue: cfg.MaxQueue, queues: make(map[string]*queue)}
	if sh.maxQueue == 0 {
		sh.maxQueue = DefaultMaxQueue
	}
	return sh, nil
}

// shaped decides s.main into s.out, waiting in the queue of its key as
// Shaping says. It returns with s.out the final decision, and whether the
// request waited in the queue; an error is a failed decision or the
// request's context ending.
func (m *middleware) shaped(ctx context.Context, s *scratch) (waited bool, err error) {
	sh := m.shaping
	start := time.Now()
	s.ckey = appendQueueKey(s.ckey[:0], s.main.descs)
	sh.mu.Lock()
	busy := sh.queues[string(s.ckey)] != nil
	sh.mu.Unlock()
	if !busy {
		if err := m.decide(ctx, s); err != nil || !m.shapeable(&s.out) {
			return false, err
		}
	}
	w, head := sh.join(string(s.ckey))
	if w == nil { // the queue is full
		if busy {
			return false, m.decide(ctx, s)
		}
		return false, nil
	}
	defer sh.leave(string(s.ckey), w)
	deadline := start.Add(sh.maxDelay)
	if !head {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		select {
		case <-w.turn:
		case <-ctx.Done():
			return true, ctx.Err()
		case <-t.C:
			// Out of time before its turn: one last decision.
			return true, m.decide(ctx, s)
		}
	}
	// At the head: decide until admitted or out of time. A request that
	// joined an empty queue holds a fresh denial already.
	fresh := head && !busy
	for {
		if !fresh {
			if err := m.decide(ctx, s); err != nil || !m.shapeable(&s.out) {
				return true, err
			}
		}
		fresh = false
		wait := s.out.Overall.RetryAfter
		if wait > time.Until(deadline) {
			return true, nil // denied: s.out says when to retry
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return true, ctx.Err()
		}
	}
}

// shapeable reports whether the outcome o is a denial that waiting up to
// MaxDelay could turn into an admission.
func (m *middleware) shapeable(o *decide.Outcome) bool {
	// A denial that names no wait is not waited for: asking again at once
	// would spin.
	return o.OverLimit() && o.Degraded == rules.FailDefault && o.Overall.RetryAfter > 0 && o.Overall.RetryAfter <= m.shaping.maxDelay
}

// join adds a waiter at the end of the queue of key and reports whether it
// is the head; nil when the queue is full.
func (sh *shaper) join(key string) (w *waiter, head bool) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	q := sh.queues[key]
	if q == nil {
		q = &queue{}
		sh.queues[key] = q
	}
	if len(q.waiters) >= sh.maxQueue {
		return nil, false
	}
	w = &waiter{turn: make(chan struct{})}
	q.waiters = append(q.waiters, w)
	return w, len(q.waiters) == 1
}

// leave takes w out of the queue of key; when w was the head, the next
// waiter's turn comes.
func (sh *shaper) leave(key string, w *waiter) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	q := sh.queues[key]
	for i, x := range q.waiters {
		if x != w {
			continue
		}
		copy(q.waiters[i:], q.waiters[i+1:])
		q.waiters[len(q.waiters)-1] = nil
		q.waiters = q.waiters[:len(q.waiters)-1]
		if i == 0 && len(q.waiters) > 0 {
			close(q.waiters[0].turn)
		}
		break
	}
	if len(q.waiters) == 0 {
		delete(sh.queues, key)
	}
}

// appendQueueKey appends the queue key of the descriptors descs: every
// entry's key and value, length-prefixed.
func appendQueueKey(b []byte, descs []rules.Descriptor) []byte {
	for _, d := range descs {
		b = append(b, '|')
		for _, e := range d.Entries {
			b = entrytext.AppendField(entrytext.AppendField(b, e.Key), e.Value)
		}
	}
	return b
}
