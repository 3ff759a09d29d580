package storetest

import (
	"sync"
	"time"
)

// Start is where every Clock of the suite starts: a Unix-day boundary, so
// that windows of a second, a minute, an hour and a day all begin there.
var Start = time.Date(2030, time.January, 1, 0, 0, 0, 0, time.UTC)

// Clock is a manual clock that the suite advances. It is safe for concurrent
// use. A store under test must read it for every decision (memstore takes
// clock.Now as its Config.Now).
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a Clock reading t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d (backward if d is negative).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// Set sets the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}
