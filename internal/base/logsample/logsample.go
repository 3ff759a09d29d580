// Package logsample spaces log lines of events that can come with every
// request (a store that is down fails them all): one line per Every, and a
// count of the lines left out. It imports only the standard library.
package logsample

import (
	"sync/atomic"
	"time"
)

// Every is the least time between two lines a Sampler lets through.
const Every = time.Second

// Sampler lets one event through per Interval and counts the others. The
// zero value is ready to use; it is safe for concurrent use.
type Sampler struct {
	// Interval is the least time between two lines; zero means Every.
	// Set it before the Sampler is used.
	Interval time.Duration

	last    atomic.Int64 // UnixNano of the last event let through
	dropped atomic.Int64
}

// Allow reports whether the event at now goes through, and how many were
// left out since the last that did.
func (s *Sampler) Allow(now time.Time) (dropped int64, ok bool) {
	t := now.UnixNano()
	last := s.last.Load()
	every := s.Interval
	if every <= 0 {
		every = Every
	}
	if last != 0 && t-last < int64(every) || !s.last.CompareAndSwap(last, t) {
		s.dropped.Add(1)
		return 0, false
	}
	return s.dropped.Swap(0), true
}
