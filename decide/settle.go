package decide

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
)

// Reservations (Request.Reserve): a request whose costs are estimates, each
// settled once its real cost is known (Decider.Settle), as the tokens of an
// LLM's answer are.
//
// Decide notes, for a request with Reserve set, what a settlement needs: the
// hits as taken (their keys copied), whether each consumed its reservation,
// a time at or before the take on the store's clock (Config.Earliest) and
// an ID per hit. Settle then charges or refunds the difference on the same
// key and limit (sluice.Limiter.Settle), exactly once: a store failure is
// retried in the background with the same ID, which a store that may apply
// a call whose reply is lost (Redis) applies once.
//
// A retry waits for the store while the settlement still means something:
// two periods of the limit after the reservation (a refund later finds its
// window over, or its bucket refilled, and returns nothing). A charge
// still failing then is recorded with what the local failure policy
// admitted, written back when the store answers again (see the ledger); a
// refund is dropped, which errs towards denying.

// reservation is what Decide notes about a Reserve request, for Settle.
type reservation struct {
	hits     []sluice.Hit // as taken, keys owned
	consumed []bool       // hit i consumed its cost
	at       time.Time    // at or before the take, on the store's clock
	id       uint64       // the first hit's settlement ID; hit i's is id+i
	degraded rules.FailurePolicy
	settled  []bool // hit i settled (or given to the retries)
}

// settleIDs makes the IDs of settlements: a random start per process, a
// counter after it, in steps of MaxHits.
var settleIDs = func() *atomic.Uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	var n atomic.Uint64
	n.Store(binary.LittleEndian.Uint64(b[:]) | 1)
	return &n
}()

// note records in o what Settle needs of a Reserve request: hits as decided
// into out; each, whether they were decided one by one; allowed, the
// take's overall decision; degraded, the failure policy that answered.
func (o *Outcome) note(hits []sluice.Hit, out []sluice.Decision, each, allowed bool, at time.Time, degraded rules.FailurePolicy) {
	r := &o.res
	r.at, r.degraded = at, degraded
	r.id = settleIDs.Add(sluice.MaxHits)
	r.hits = grow(r.hits, len(hits))
	r.consumed = grow(r.consumed, len(hits))
	r.settled = grow(r.settled, len(hits))
	var keys strings.Builder
	for i := range hits {
		keys.WriteString(hits[i].Key)
	}
	all, start := keys.String(), 0
	for i := range hits {
		h := hits[i]
		h.Key = all[start : start+len(h.Key)]
		start += len(hits[i].Key)
		r.hits[i] = h
		d := &out[i]
		r.consumed[i] = h.Cost > 0 && (each && (d.Allowed || d.Overdrawn) || !each && allowed && d.Allowed)
		r.settled[i] = false
	}
}

// errNotReserved is wrapped by Settle's error for an outcome without a
// reservation to settle: a request without Reserve, or one answered by a
// remote.
var errNotReserved = errors.New("decide: nothing reserved to settle")

// Settle settles descriptor i of a request with Reserve set, which Decide
// answered with o (not reset since): spent is the descriptor's real cost,
// its Cost having been the reservation. Every limit of the descriptor is
// settled on the key and limit that took the reservation, whatever rules
// are in force now: charged what was spent beyond it, or refunded what was
// not spent, as far as the limit still holds it (sluice.Limiter.Settle). A
// limit that did not consume the reservation (a request let through by
// global shadow mode) is charged all of spent.
//
// Call it once per descriptor, when the response has ended. A store failure
// is not returned: the settlement is retried in the background (see above).
// Under a failure policy, nothing was taken from the store: a charge is
// recorded for the write-back of the local policy (fail_local), or dropped
// (fail_open, which counts nothing); a refund is dropped. It returns an
// error for a descriptor with nothing to settle, or spent out of range.
func (d *Decider) Settle(ctx context.Context, o *Outcome, i int, spent int64) error {
	r := &o.res
	if i < 0 || i >= len(o.Descriptors) || len(r.hits) == 0 {
		return fmt.Errorf("%w: %w", sluice.ErrInvalid, errNotReserved)
	}
	if spent < 0 || spent > sluice.MaxCost {
		return fmt.Errorf("%w: spent %d out of range (0 to %d)", sluice.ErrInvalid, spent, int64(sluice.MaxCost))
	}
	for j := range o.Limits {
		if o.Limits[j].Descriptor != i || j >= len(r.hits) || r.settled[j] {
			continue
		}
		r.settled[j] = true
		h := r.hits[j]
		reserved := h.Cost
		if !r.consumed[j] {
			reserved = 0
		}
		switch r.degraded {
		case rules.FailDefault:
		case rules.FailLocal:
			if spent > reserved {
				d.spent.record([]sluice.Hit{{Key: h.Key, Limit: h.Limit, Cost: spent - reserved}}, func(int) bool { return true }, d.now())
			}
			continue
		default:
			continue
		}
		if r.at.IsZero() && spent < reserved {
			continue // the store's clock unknown: nothing is refunded
		}
		st := sluice.Settlement{Hit: h, Spent: spent, ResetAfter: o.Limits[j].Decision.ResetAfter, At: r.at, ID: r.id + uint64(j)}
		st.Hit.Cost = reserved
		if _, err := d.limiter.Settle(ctx, &st); err != nil {
			switch {
			case errors.Is(err, sluice.ErrInvalid), errors.Is(err, errors.ErrUnsupported):
				return err
			}
			if d.log != nil {
				d.log.Debug("settlement failed; retrying in the background", "limit", h.Limit.Name, "err", err)
			}
			d.retries.add(d, st)
		}
	}
	return nil
}

// settleRetries holds the settlements the store failed to apply, retried in
// the background.
type settleRetries struct {
	mu      sync.Mutex
	items   []retryItem
	running bool
	dropped atomic.Int64 // refunds given up
}

type retryItem struct {
	st       sluice.Settlement
	deadline time.Time // on this process's clock
}

// maxRetries bounds the settlements waiting for the store; beyond it, as
// after a retry's deadline, a charge goes to the ledger and a refund is
// dropped.
const maxRetries = 1 << 16

// Retry pacing: from the first interval, doubling up to the last.
const (
	retryFirst = 100 * time.Millisecond
	retryLast  = 2 * time.Second
)

// add queues st for retries, starting the retrying goroutine if needed.
func (q *settleRetries) add(d *Decider, st sluice.Settlement) {
	st.Hit.Key = strings.Clone(st.Hit.Key)
	it := retryItem{st: st, deadline: time.Now().Add(2 * st.Hit.Limit.Period)}
	q.mu.Lock()
	if len(q.items) >= maxRetries {
		q.mu.Unlock()
		q.giveUp(d, &it.st)
		return
	}
	q.items = append(q.items, it)
	start := !q.running
	q.running = true
	q.mu.Unlock()
	if start {
		go q.run(d)
	}
}

// run retries the queued settlements until none is left.
func (q *settleRetries) run(d *Decider) {
	wait := retryFirst
	for {
		time.Sleep(wait)
		q.mu.Lock()
		items := q.items
		q.items = nil
		q.mu.Unlock()
		var left []retryItem
		for _, it := range items {
			if time.Now().After(it.deadline) {
				q.giveUp(d, &it.st)
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), retryLast)
			moved, err := d.limiter.Settle(ctx, &it.st)
			cancel()
			switch {
			case err != nil && !errors.Is(err, sluice.ErrInvalid) && !errors.Is(err, errors.ErrUnsupported):
				left = append(left, it)
			case err != nil:
				if d.log != nil {
					d.log.Warn("settlement refused on retry", "limit", it.st.Hit.Limit.Name, "err", err)
				}
			case d.log != nil:
				d.log.Debug("settlement applied on retry", "limit", it.st.Hit.Limit.Name, "moved", moved)
			}
		}
		q.mu.Lock()
		q.items = append(left, q.items...)
		if len(q.items) == 0 {
			q.running = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		if len(left) < len(items) {
			wait = retryFirst
		} else {
			wait = min(2*wait, retryLast)
		}
	}
}

// giveUp ends the retries of st: a charge is recorded for the local
// policy's write-back, a refund dropped.
func (q *settleRetries) giveUp(d *Decider, st *sluice.Settlement) {
	if st.Spent > st.Hit.Cost {
		d.spent.record([]sluice.Hit{{Key: st.Hit.Key, Limit: st.Hit.Limit, Cost: st.Spent - st.Hit.Cost}}, func(int) bool { return true }, d.now())
		return
	}
	q.dropped.Add(st.Hit.Cost - st.Spent)
}
