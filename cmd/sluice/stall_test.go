package main

import (
	"sync/atomic"
	"testing"
	"time"
)

// stallMeter measures how long the machine keeps this test's process
// from running: a goroutine that sleeps a millisecond at a time records
// the longest it overslept. A bound on how long sluice takes to answer
// (the Redis timeout and a margin) is a bound on sluice's own waits; the
// machine's stalls, which hold back the client, the server and Redis alike
// and which a CPU hog makes long, come on top of it.
type stallMeter struct {
	longest atomic.Int64
	stop    chan struct{}
}

// watchStalls starts a stallMeter, stopped when the test ends.
func watchStalls(t *testing.T) *stallMeter {
	m := &stallMeter{stop: make(chan struct{})}
	go func() {
		for {
			before := time.Now()
			select {
			case <-m.stop:
				return
			case <-time.After(time.Millisecond):
			}
			if over := int64(time.Since(before) - time.Millisecond); over > m.longest.Load() {
				m.longest.Store(over)
			}
		}
	}()
	t.Cleanup(func() { close(m.stop) })
	return m
}

// max is the longest stall seen so far.
func (m *stallMeter) max() time.Duration { return time.Duration(m.longest.Load()) }
