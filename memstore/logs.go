package memstore

import (
	"sync/atomic"

	"github.com/sluicehq/sluice/internal/base/algo"
)

// logList is the sliding log of one key.
type logList struct {
	idle int64 // the list is empty at and after idle
	l    algo.Log
}

// Estimates of the memory held by a sliding log: per key (map slot, list
// header, bookkeeping) and per entry.
const (
	logKeyBytes   = 96
	logEntryBytes = 16
)

// peekLog reports whether a peek at log l is allowed: the log is not in
// debt.
func peekLog(p *algo.Params, l *algo.Log, now int64) bool {
	_, r := algo.LogStepEach(p, l, now, 0)
	return r.Allowed
}

// commitLog drops the expired entries of hit o's log and appends n hits
// (n = 0: drops only).
func (s *Store) commitLog(o *op, now, n int64) {
	sh := &s.shards[s.shardOf(o.k)]
	ll, ok := sh.logs[o.k]
	if !ok {
		if n <= 0 {
			return
		}
		sh.logBytes += logKeyBytes
	}
	c := cap(ll.l.Entries)
	ll.l.Commit(o.expired, now, n)
	if len(ll.l.Entries) == 0 {
		dropLog(sh, o.k)
		return
	}
	ll.idle = max(ll.idle, addSat(ll.l.Newest(), o.p.Period))
	sh.logs[o.k] = ll
	sh.logBytes += int64(cap(ll.l.Entries)-c) * logEntryBytes
	s.trimLogs(sh, o.k)
}

// trimLogs evicts sliding logs of sh other than keep while sh is over its
// share of the memory cap.
func (s *Store) trimLogs(sh *shard, keep uint64) {
	if b := s.budget(); b > 0 {
		trimLogsBudget(sh, keep, b, &s.evicted)
	}
}

// trimLogsBudget evicts sliding logs of sh other than keep while sh holds
// more than b bytes: each time, among evictSample logs, the one that goes
// idle first.
func trimLogsBudget(sh *shard, keep uint64, b int64, evicted *atomic.Int64) {
	for sh.bytes() > b {
		var victim uint64
		var victimIdle int64
		seen := 0
		for k, ll := range sh.logs {
			if k == keep {
				continue
			}
			if seen == 0 || ll.idle < victimIdle {
				victim, victimIdle = k, ll.idle
			}
			if seen++; seen == evictSample {
				break
			}
		}
		if seen == 0 {
			return
		}
		dropLog(sh, victim)
		evicted.Add(1)
	}
}

// dropLog deletes the sliding log of key k from sh, and its memory from
// sh's estimate.
func dropLog(sh *shard, k uint64) {
	sh.logBytes -= logKeyBytes + int64(cap(sh.logs[k].l.Entries))*logEntryBytes
	delete(sh.logs, k)
}
