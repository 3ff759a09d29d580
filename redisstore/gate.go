package redisstore

import (
	"context"
	"errors"
	"sync/atomic"
)

// errShed is a call the gate turned away: its calls in flight were at their
// bound and its queue full.
var errShed = errors.New("redis calls in flight and queue full: call shed")

// gate bounds the store's calls in flight to Redis. A call beyond the bound
// waits for a slot, in a queue of bounded length, for as long as its
// caller's context allows; beyond the queue's length it is shed at once.
// A slot is held until Redis has answered (or the connection is declared
// dead), whatever the caller does meanwhile, so the bound is on the work
// sent to Redis, not on the callers still waiting.
type gate struct {
	slots    chan struct{}
	waiting  atomic.Int64
	maxQueue int64
}

func newGate(inFlight, queue int) *gate {
	return &gate{slots: make(chan struct{}, inFlight), maxQueue: int64(queue)}
}

// enter takes a slot: nil, errShed, or ctx's error when the caller gave
// up waiting.
func (g *gate) enter(ctx context.Context) error {
	select {
	case g.slots <- struct{}{}:
		return nil
	default:
	}
	if g.waiting.Add(1) > g.maxQueue {
		g.waiting.Add(-1)
		return errShed
	}
	defer g.waiting.Add(-1)
	select {
	case g.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// leave gives back a slot taken by enter.
func (g *gate) leave() { <-g.slots }

// inFlight is the number of slots taken.
func (g *gate) inFlight() int { return len(g.slots) }

// queued is the number of callers waiting for a slot.
func (g *gate) queued() int64 { return g.waiting.Load() }
