package main

import (
	"context"
	"errors"
	"sync"
	"time"
)

// The real code blocks: a round waits for the ledger's answers, and a
// decision near a window's edge waits for the window to begin. sched runs
// such code in goroutines (procs), one at a time, on the virtual clock:
// a proc runs until it parks (a ledger call or a sleep, which the
// simulation turns into events) or ends, and the simulation goes on only
// once none runs. A proc is resumed by its event (the ledger's answer, a
// timeout, the end of a sleep), never by the wall clock.

// parkKind is why a proc stopped.
type parkKind int

const (
	parkCall  parkKind = iota + 1 // a call to the coordinator's ledger
	parkSleep                     // a wait of d
	parkDone                      // the proc ended
)

// park is a proc stopped, waiting for the simulation.
type park struct {
	kind   parkKind
	region int
	node   int
	d      time.Duration // parkSleep
	call   *call         // parkCall: the call, and the ledger's answer once resumed
	then   func()        // parkDone: run by the simulation
	err    error         // the call's or the sleep's error, set before resuming
	done   bool          // resumed, or given up
	resume chan struct{}
}

// sched counts the procs running and collects the parks.
type sched struct {
	mu       sync.Mutex
	cond     *sync.Cond
	running  int
	parks    []*park
	stopping bool // the run is over: calls and sleeps fail at once
}

func newSched() *sched {
	s := &sched{}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// errStopped fails what a proc asks once the run is over.
var errStopped = errors.New("regionsim: the run is over")

// errDefer is what a sleep answers to a decision taken inline (on the
// simulation's goroutine, which cannot wait): the decision is taken again
// in a proc. The real code sleeps before it changes anything.
var errDefer = errors.New("regionsim: taken again in a proc")

// inlineKey marks the context of a decision taken inline.
type inlineKey struct{}

// spawn runs f in a proc; then runs on the simulation's goroutine once f
// has returned.
func (s *sched) spawn(region, node int, f func(), then func()) {
	s.mu.Lock()
	s.running++
	s.mu.Unlock()
	go func() {
		f()
		s.mu.Lock()
		s.parks = append(s.parks, &park{kind: parkDone, region: region, node: node, then: then})
		s.running--
		s.cond.Broadcast()
		s.mu.Unlock()
	}()
}

// wait parks the calling proc on p until the simulation resumes it, and
// returns p.err.
func (s *sched) wait(p *park) error {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return errStopped
	}
	p.resume = make(chan struct{})
	s.parks = append(s.parks, p)
	s.running--
	s.cond.Broadcast()
	s.mu.Unlock()
	<-p.resume
	return p.err
}

// sleep is the real code's Sleep: a park of d, or errDefer inline.
func (s *sched) sleep(region, node int) func(context.Context, time.Duration) error {
	return func(ctx context.Context, d time.Duration) error {
		if ctx.Value(inlineKey{}) != nil {
			return errDefer
		}
		return s.wait(&park{kind: parkSleep, region: region, node: node, d: d})
	}
}

// resume lets p's proc go on, with err.
func (s *sched) resume(p *park, err error) {
	if p.done {
		return
	}
	p.done, p.err = true, err
	s.mu.Lock()
	s.running++
	s.mu.Unlock()
	close(p.resume)
}

// settle waits until no proc runs and returns the new parks, in the order
// made.
func (s *sched) settle() []*park {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.running > 0 {
		s.cond.Wait()
	}
	ps := s.parks
	s.parks = nil
	return ps
}

// stop fails every park and what the procs ask from now on, and waits for
// them to end.
func (s *sched) stop(parked []*park) {
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	for {
		for _, p := range parked {
			if p.kind != parkDone {
				s.resume(p, errStopped)
			}
		}
		parked = s.settle()
		if len(parked) == 0 {
			return
		}
	}
}
