package main

import (
	"testing"
	"time"
)

// The tests that spend their time waiting (for a window to pass, a slow
// client, a Redis to come back) run side by side, after the tests that do
// not call beside or besideFromTheStart:
//
//   - besideFromTheStart: those that wait a minute or more (windows of a
//     minute or more, or many of a few seconds) start at once. They are
//     asleep most of the time, and started after the others they would
//     add their time to theirs.
//   - beside: the others, len(places) at a time (-parallel; TestMain).
//
// The testing package's own limit on parallel tests is lifted (TestMain),
// so that its order, which is the order in which the scheduler wakes the
// tests up, does not hold back the first kind. The time a test waits for
// a place counts in its elapsed time: it is logged. A test whose subtests
// call beside calls t.Parallel itself, so as not to hold a place they
// wait for.
//
// A test that waits but must run alone (it starts CPU hogs, or its checks
// need the machine to itself) calls neither, and says why.
var places chan struct{}

// beside runs t side by side with the other tests that wait, in one of
// the places.
func beside(t *testing.T) {
	t.Helper()
	t.Parallel()
	asked := time.Now()
	places <- struct{}{}
	t.Cleanup(func() { <-places })
	if waited := time.Since(asked); waited >= time.Second {
		t.Logf("waited %s for a place beside the other tests that wait", waited.Round(100*time.Millisecond))
	}
}

// besideFromTheStart runs t side by side with the other tests that wait,
// from the start, without a place.
func besideFromTheStart(t *testing.T) { t.Parallel() }
