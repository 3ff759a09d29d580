package algo

import "math"

// LogEntry is N hits of a sliding log logged at time At (nanoseconds since
// the Unix epoch). A log is a slice of entries, oldest first.
type LogEntry struct{ At, N int64 }

// LogStep evaluates a request of cost n at time now against a sliding log,
// the exact rolling window: the request is admitted when the hits logged in
// (now − Period, now], plus n, are at most Capacity. So no window of length
// Period ever holds more than Capacity logged hits; rejected requests are not
// logged.
//
// LogStep does not modify entries. expired is the number of leading entries
// that are out of the window (At <= now − Period); the caller may drop them,
// and after an allowed request appends the hits with [LogAppend].
//
// Remaining is Capacity minus the hits in the window (after this request when
// allowed); ResetAfter the time until the log empties (the newest entry
// leaves the window); RetryAfter on deny the exact time until enough old
// entries have left for the same request, or Never for n > Capacity or a
// zero limit (Rate 0 or Capacity 0). n = 0 is a peek, always allowed; a
// negative n is treated as 0.
//
// Time going backwards: entries newer than now still count (nothing expires
// early, so the earlier now is never more permissive), and LogAppend logs the
// hits at the newest entry's time rather than now, keeping the log sorted.
// Entries that are not sorted, or have a negative N, are read
// conservatively: every entry after the expired prefix counts, a negative N
// as 0.
func LogStep(p *Params, entries []LogEntry, now, n int64) (expired int, r Result) {
	if n < 0 {
		n = 0
	}
	now = clampNow(now)
	if p.Period <= 0 {
		return 0, zeroLimit(n, 0)
	}
	cut := now - p.Period // no overflow: now >= 0 and Period > 0
	for expired < len(entries) && entries[expired].At <= cut {
		expired++
	}
	live := entries[expired:]
	var sum, newest int64
	for i := range live {
		sum = addSat(sum, max(live[i].N, 0))
		newest = max(newest, live[i].At)
	}
	var reset int64
	if len(live) > 0 {
		reset = max(addSat(newest, p.Period)-now, 0)
	}
	if p.Rate == 0 {
		return expired, zeroLimit(n, reset)
	}
	c := p.Capacity
	r = Result{Allowed: true, Remaining: max(c-sum, 0), ResetAfter: reset}
	if n == 0 {
		return expired, r
	}
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
		t := addSat(at, p.Period)
		if t == math.MaxInt64 {
			r.RetryAfter = Never
		} else {
			r.RetryAfter = t - now
		}
		return expired, r
	}
	return expired, Result{
		Allowed:    true,
		Remaining:  c - sum - n,
		ResetAfter: addSat(max(now, newest), p.Period) - now,
	}
}

// LogAppend records an allowed request of cost n > 0 at now: it drops the
// first expired entries (as returned by LogStep for the same now and n) and
// appends the hits, merged into the last entry when it has the same time,
// reusing the slice's capacity. If the last entry is newer than now (time
// went backwards), the hits are merged into it, so that the log stays sorted
// and nothing expires earlier than it would have.
//
// n <= 0 returns entries unchanged: a peek drops nothing, because entries
// expired at the peek's now may still be in the window of a later request
// whose now is earlier (time going backwards).
func LogAppend(entries []LogEntry, expired int, now, n int64) []LogEntry {
	if n <= 0 {
		return entries
	}
	expired = min(max(expired, 0), len(entries))
	if expired > 0 {
		entries = entries[:copy(entries, entries[expired:])]
	}
	now = clampNow(now)
	if k := len(entries); k > 0 && entries[k-1].At >= now {
		entries[k-1].N = addSat(entries[k-1].N, n)
		return entries
	}
	return append(entries, LogEntry{At: now, N: n})
}
