package redisstore

import (
	"context"
	"time"
)

// probe keeps the store's health current while no request calls Redis. A
// store's health is its circuit breaker's state, which calls move: an
// idle node whose Redis died would report itself up (and ready) until
// enough requests had failed, and one whose Redis came back would report
// itself down until a request probed it. So every interval in which no
// call completed, probe sends a PING through the breaker, as a request
// would: a failure counts towards opening it (and the next PING follows
// soon, so that a dead Redis is seen within BreakerFailures quick
// PINGs), and when the breaker is open, the PING is its half-open probe.
// A PING answered is followed by a question: has Redis still the function
// library? A Redis restarted between two PINGs answers them all, but has
// lost it (Stats.Forgot). A node that decides requests sends none: its
// calls say as much.
func (s *Store) probe(every time.Duration) {
	defer close(s.probeDone)
	t := time.NewTimer(every)
	defer t.Stop()
	seen := int64(-1)
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		next := every
		calls := s.metrics.ok.Load() + s.metrics.failed.Load()
		if calls == seen {
			if err := s.ping(); err != nil {
				next = min(every, probeRetry)
			}
			calls = s.metrics.ok.Load() + s.metrics.failed.Load()
		}
		seen = calls
		t.Reset(next)
	}
}

// probeRetry is the wait before the next PING after one failed.
const probeRetry = 100 * time.Millisecond

// ping sends one PING through the breaker, reporting its outcome. It
// returns the PING's error, or nil when the breaker did not let it go or
// the store is not connected (reconnect then reports the state).
func (s *Store) ping() error {
	c := s.client.Load()
	if c == nil || s.br.Allow() != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
	defer cancel()
	err := c.c.Do(ctx, c.c.B().Ping().Build().Pin()).Error()
	if s.ctx.Err() != nil {
		return nil // closed under the PING: that says nothing of Redis
	}
	s.br.Done(err)
	if err != nil {
		s.metrics.probeFailed.Add(1)
		return err
	}
	// A Redis restarted between two PINGs answers them all: the library
	// it lost tells (Stats.Forgot), and is loaded again.
	if s.forgotten(ctx, c) {
		s.forgot()
		_ = s.load(ctx, c)
	}
	return nil
}
