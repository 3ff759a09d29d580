package memstore

import (
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
	"github.com/sluicehq/sluice/internal/vocab/limits"
)

// countMin is the algo package's count-min sketch.
type countMin = algo.CMSketch

// sketchID identifies the count-min sketch of a sketch limit. Limits with
// the same identity share one sketch.
type sketchID struct {
	name                   string
	rate, period, capacity int64
	width, depth           int
}

// sketchSlot holds one sketch and its lock. seq orders the locks of the
// sketches a request touches, so that requests never deadlock.
type sketchSlot struct {
	seq uint64 // immutable
	id  sketchID

	mu   sync.Mutex
	s    *countMin
	idle int64 // the sketch is empty at and after idle
	dead bool  // dropped from the set by a sweep or a restore
}

type sketchSet struct {
	mu    sync.RWMutex
	m     map[sketchID]*sketchSlot
	seq   uint64 // guarded by mu
	bytes atomic.Int64
}

func idOf(l *sluice.Limit, p *algo.Params) sketchID {
	w, d := limits.SketchDims(l)
	return sketchID{name: l.Name, rate: p.Rate, period: p.Period, capacity: p.Capacity, width: w, depth: d}
}

// get returns the sketch of limit l, creating it if needed.
func (set *sketchSet) get(l *sluice.Limit, p *algo.Params) *sketchSlot {
	id := idOf(l, p)
	set.mu.RLock()
	sk := set.m[id]
	set.mu.RUnlock()
	if sk != nil {
		return sk
	}
	set.mu.Lock()
	defer set.mu.Unlock()
	if sk = set.m[id]; sk == nil {
		sk = set.addLocked(id, algo.NewSketch(id.width, id.depth), 0)
	}
	return sk
}

func (set *sketchSet) addLocked(id sketchID, s *countMin, idle int64) *sketchSlot {
	set.seq++
	sk := &sketchSlot{seq: set.seq, id: id, s: s, idle: idle}
	set.m[id] = sk
	set.bytes.Add(int64(s.Bytes()))
	return sk
}

// sweep drops the sketches idle at now and returns how many.
func (set *sketchSet) sweep(now int64) int {
	set.mu.Lock()
	defer set.mu.Unlock()
	n := 0
	for id, sk := range set.m {
		sk.mu.Lock()
		if sk.idle <= now {
			sk.dead = true
			delete(set.m, id)
			set.bytes.Add(-int64(sk.s.Bytes()))
			n++
		}
		sk.mu.Unlock()
	}
	return n
}

// lockSketches locks the distinct sketches of ops in ascending seq order and
// reports whether all of them are still in use (none dropped by a sweep or
// restore since the op looked it up).
func lockSketches(ops []op) bool {
	ok := true
	var last uint64
	for {
		next := nextSketch(ops, last)
		if next == nil {
			return ok
		}
		next.mu.Lock()
		if next.dead {
			ok = false
		}
		last = next.seq
	}
}

func unlockSketches(ops []op) {
	var last uint64
	for {
		next := nextSketch(ops, last)
		if next == nil {
			return
		}
		next.mu.Unlock()
		last = next.seq
	}
}

// nextSketch returns the sketch of ops with the least seq above last.
func nextSketch(ops []op, last uint64) *sketchSlot {
	var next *sketchSlot
	for i := range ops {
		if sk := ops[i].sk; sk != nil && sk.seq > last && (next == nil || sk.seq < next.seq) {
			next = sk
		}
	}
	return next
}
