package server

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/fault"
)

// policyLogEvery spaces the log lines of requests answered by a failure
// policy: one at once, then at most one per policyLogEvery while the
// policies go on answering.
const policyLogEvery = time.Minute

// policyWindow is how long after its last answer a failure policy still
// shows as answering in /readyz.
const policyWindow = time.Minute

// policyWatch follows the requests answered by a failure policy, for
// /readyz: when the current spell began (answers less than policyWindow
// apart), how many, and the last one's time and reason. Reads and writes
// race benignly: the figures are for people.
type policyWatch struct {
	since, last atomic.Int64 // UnixNano
	count       atomic.Int64 // answers since since
	reason      atomic.Int32 // of the last answer
}

// answered records one answer at now for why.
func (w *policyWatch) answered(now time.Time, why fault.Reason) {
	t := now.UnixNano()
	if last := w.last.Swap(t); t-last > int64(policyWindow) {
		w.since.Store(t)
		w.count.Store(0)
	}
	w.count.Add(1)
	w.reason.Store(int32(why))
}

// status describes the current spell, or "" when the policies have not
// answered within policyWindow of now.
func (w *policyWatch) status(now time.Time) string {
	last := w.last.Load()
	if last == 0 || now.UnixNano()-last > int64(policyWindow) {
		return ""
	}
	since := time.Unix(0, w.since.Load())
	return fmt.Sprintf("failure policy: answered %d requests since %s (%s ago), the last %s ago, reason %s",
		w.count.Load(), since.UTC().Format(time.RFC3339), now.Sub(since).Round(time.Millisecond),
		now.Sub(time.Unix(0, last)).Round(time.Millisecond), fault.Reason(w.reason.Load()))
}
