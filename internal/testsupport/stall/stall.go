// Package stall measures how long the machine keeps a test's process from
// running, so that a test of a bound in time can add the machine's stalls
// (which a CPU hog makes long, and which hold back the client, the server
// and Redis alike) to what it allows, and still fail when the code under
// test waits longer than it should.
package stall

import (
	"sync/atomic"
	"testing"
	"time"
)

// A Meter records the longest a goroutine that sleeps a millisecond at a
// time overslept.
type Meter struct {
	longest atomic.Int64
	stop    chan struct{}
}

// Watch starts a Meter, stopped when the test ends.
func Watch(t testing.TB) *Meter {
	m := &Meter{stop: make(chan struct{})}
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

// Max is the longest stall seen so far.
func (m *Meter) Max() time.Duration { return time.Duration(m.longest.Load()) }
