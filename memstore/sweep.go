package memstore

import "time"

// sweepLoop calls Sweep every interval until Close.
func (s *Store) sweepLoop(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Sweep()
		}
	}
}

// sweepChunk is how many table slots Sweep examines per lock.
const sweepChunk = 4096

// Sweep drops every idle key, log, sketch, expired permit and expired penalty, shrinks
// tables that have emptied, and returns how many entries it dropped. The
// background sweep calls it every Config.SweepInterval; it holds each
// shard's lock only briefly.
func (s *Store) Sweep() int {
	removed := 0
	for i := range s.shards {
		sh := &s.shards[i]
		for from := 0; ; from += sweepChunk {
			now := s.now()
			sh.mu.Lock()
			if from >= len(sh.t.slots) {
				sh.mu.Unlock()
				break
			}
			removed += sh.t.sweep(from, from+sweepChunk, now)
			sh.mu.Unlock()
		}
		for from := 0; ; from += sweepChunk {
			now := s.now()
			sh.mu.Lock()
			t := sh.wordsOf()
			if t == nil || from >= len(t.slots) {
				sh.mu.Unlock()
				break
			}
			removed += t.sweep(from, from+sweepChunk, now)
			sh.mu.Unlock()
		}
		now := s.now()
		sh.mu.Lock()
		for k, ll := range sh.logs {
			if ll.idle <= now {
				dropLog(sh, k)
				removed++
			}
		}
		if n := sweepPerms(sh, now); n > 0 {
			removed += n
			s.permsExpired.Add(int64(n))
		}
		if c := capFor(sh.t.n); float64(len(sh.t.slots)) > float64(c)*growth*growth {
			sh.t.rebuild(c, now)
		}
		s.wCompact(sh, now)
		sh.mu.Unlock()
	}
	removed += s.sketches.sweep(s.now())
	return removed
}
