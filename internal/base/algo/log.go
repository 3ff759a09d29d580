package algo

import "math"

// LogEntry is N hits of a sliding log logged at time At (nanoseconds since
// the Unix epoch).
type LogEntry struct{ At, N int64 }

// Log is the state of one key's sliding log, the exact rolling window. Its
// zero value is an empty log.
//
// Entries are oldest first, with strictly increasing times (hits logged at
// the time of the last entry are merged into it). Sum is the total of their
// N (saturated). Seen is the latest time at which the log changed: hits
// were appended, or expired entries dropped. A request whose now is earlier
// than Seen (time going backwards) is evaluated at Seen: entries dropped at
// Seen are gone, and it would be unsafe to judge them by the earlier time.
//
// The work per request is constant, amortized: the expired entries at the
// front are read once and dropped by Commit; a denial reads the oldest
// entries only as far as the hits that must leave before the request fits
// (at most n entries). Stores keep Sum and the newest time beside the
// entries so that nothing else of the log need be read.
type Log struct {
	Entries []LogEntry
	Sum     int64
	Seen    int64
}

// Newest returns the time of the newest entry, or 0 for an empty log.
func (l *Log) Newest() int64 {
	if len(l.Entries) == 0 {
		return 0
	}
	return l.Entries[len(l.Entries)-1].At
}

// LogStep evaluates a request of cost n at time now against the sliding
// log l: the request is admitted when the hits logged in (t − Period, t],
// plus n, are at most Capacity, where t = max(now, l.Seen). So no window
// of length Period ever holds more than Capacity logged hits; rejected
// requests are not logged.
//
// LogStep does not modify l. expired is the number of leading entries out
// of the window (At <= t − Period); Commit drops them, and after an
// allowed request appends the hits.
//
// Remaining is Capacity minus the hits in the window (after this request
// when allowed); ResetAfter the time until the log empties (its newest
// entry leaves the window); RetryAfter on deny the exact time until enough
// old entries have left for the same request, or Never for n > Capacity or
// a zero limit (Rate 0 or Capacity 0). n = 0 is a peek, always allowed; a
// negative n is treated as 0. Durations are measured from the given now.
//
// Time going backwards: the request is judged at t = l.Seen, so it is
// never more permissive than the same request at that later time, and its
// hits are logged at t, keeping the log sorted. An entry with a negative N
// counts as 0.
func LogStep(p *Params, l *Log, now, n int64) (expired int, r Result) {
	return logStep(p, l, now, n, false)
}

// LogStepEach is LogStep for a hit decided on its own (see Overdraw): a
// peek at a log holding more than its capacity, a debt, is denied until
// enough entries have left.
func LogStepEach(p *Params, l *Log, now, n int64) (expired int, r Result) {
	return logStep(p, l, now, n, true)
}

func logStep(p *Params, l *Log, now, n int64, debt bool) (expired int, r Result) {
	if n < 0 {
		n = 0
	}
	now = clampNow(now)
	if p.Period <= 0 {
		return 0, zeroLimit(n, 0)
	}
	t := max(now, l.Seen)
	cut := t - p.Period // no overflow: t >= 0 and Period > 0
	es := l.Entries
	sum := l.Sum
	for expired < len(es) && es[expired].At <= cut {
		sum = max(sum-max(es[expired].N, 0), 0)
		expired++
	}
	live := es[expired:]
	var reset int64
	if len(live) > 0 {
		reset = max(addSat(live[len(live)-1].At, p.Period)-now, 0)
	}
	if p.Rate == 0 {
		return expired, zeroLimit(n, reset)
	}
	c := p.Capacity
	r = Result{Allowed: true, Remaining: max(c-sum, 0), ResetAfter: reset}
	if n == 0 && (!debt || sum <= c) {
		return expired, r
	}
	// A request, or a peek at a log in debt, which waits until enough
	// entries have left.
	r.Allowed = false
	switch {
	case n > c:
		r.RetryAfter = Never
		return expired, r
	case sum > c-n:
		// Wait until the oldest entries holding sum − (c − n) hits have
		// left the window.
		drop := sum - (c - n)
		var gone, at int64
		for i := range live {
			gone = addSat(gone, max(live[i].N, 0))
			at = max(at, live[i].At)
			if gone >= drop {
				break
			}
		}
		if u := addSat(at, p.Period); u == math.MaxInt64 {
			r.RetryAfter = Never
		} else {
			r.RetryAfter = u - now // > 0: some entry read is in the window
		}
		return expired, r
	}
	return expired, Result{
		Allowed:    true,
		Remaining:  c - sum - n,
		ResetAfter: addSat(t, p.Period) - now,
	}
}

// Commit applies to l what LogStep found for the same now: it drops the
// first expired entries and, for n > 0 (an admitted request's cost),
// appends n hits at max(now, l.Seen), merged into the last entry when it
// has that time. Seen becomes that time when anything changed, except that
// a log left empty is a fresh log again (Seen 0), which a store may
// forget; Commit reports whether anything changed. Dropping expired entries changes nothing the
// log answers at Seen or later, so a store may commit them after a denied
// request or a peek too: that is what keeps the work per request constant.
// The entries' storage is reused where it can be; dropped entries are
// sliced off the front.
func (l *Log) Commit(expired int, now, n int64) bool {
	expired = min(max(expired, 0), len(l.Entries))
	if expired == 0 && n <= 0 {
		return false
	}
	t := max(clampNow(now), l.Seen)
	if expired == len(l.Entries) {
		l.Entries, l.Sum = l.Entries[:0], 0
	} else {
		for _, e := range l.Entries[:expired] {
			l.Sum = max(l.Sum-max(e.N, 0), 0)
		}
		l.Entries = l.Entries[expired:]
	}
	if n <= 0 {
		if len(l.Entries) == 0 {
			// Empty, the log is a fresh one again: a store forgets it.
			l.Seen = 0
			return true
		}
		l.Seen = t
		return true
	}
	l.Seen = t
	l.Sum = addSat(l.Sum, n)
	if k := len(l.Entries); k > 0 && l.Entries[k-1].At >= t {
		l.Entries[k-1].N = addSat(l.Entries[k-1].N, n)
		return true
	}
	l.Entries = append(l.Entries, LogEntry{At: t, N: n})
	return true
}

// Recount sets Sum from the entries, for a log restored from elsewhere.
func (l *Log) Recount() {
	l.Sum = 0
	for _, e := range l.Entries {
		l.Sum = addSat(l.Sum, max(e.N, 0))
	}
}
