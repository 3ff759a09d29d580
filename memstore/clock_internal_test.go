package memstore

import (
	"testing"
	"time"
)

// The default clock follows the wall clock it started from at the pace of
// the monotonic clock.
func TestMonotonicClock(t *testing.T) {
	before := time.Now()
	clock := monotonicClock()
	first := time.Unix(0, clock())
	time.Sleep(20 * time.Millisecond)
	second := time.Unix(0, clock())
	after := time.Now()
	if d := second.Sub(first); d < 20*time.Millisecond || d > time.Second {
		t.Errorf("clock advanced %v over a 20ms sleep", d)
	}
	if first.Before(before) || second.After(after) {
		t.Errorf("clock readings %v, %v outside the wall clock's %v .. %v", first, second, before, after)
	}
}
