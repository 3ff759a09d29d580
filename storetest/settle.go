package storetest

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
	"github.com/sluicehq/sluice/internal/stores/decorator"
	"github.com/sluicehq/sluice/internal/vocab/limits"
)

// settleLimits are the limits settled in the suite: every algorithm that
// can be settled (algo.Settles), a discrete bucket and an offset window.
func settleLimits() []*sluice.Limit {
	return []*sluice.Limit{
		{Name: "fw", Algorithm: sluice.Algorithm(algo.FixedWindow), Rate: 100, Period: time.Second},
		{Name: "fw-offset", Algorithm: sluice.Algorithm(algo.FixedWindow), Rate: 100, Period: time.Second, WindowOffset: 300 * time.Millisecond},
		{Name: "sw", Algorithm: sluice.Algorithm(algo.SlidingWindow), Rate: 100, Period: time.Second},
		{Name: "tb", Algorithm: sluice.Algorithm(algo.TokenBucket), Rate: 100, Period: time.Second},
		{Name: "tb-discrete", Algorithm: sluice.Algorithm(algo.TokenBucket), Rate: 100, Period: time.Second, RefillInterval: 100 * time.Millisecond},
		{Name: "lb", Algorithm: sluice.Algorithm(algo.LeakyBucket), Rate: 100, Period: time.Second, Burst: 80},
		{Name: "gcra", Algorithm: sluice.Algorithm(algo.GCRA), Rate: 100, Period: time.Second, Burst: 60},
		{Name: "fw-debit", Algorithm: sluice.Algorithm(algo.FixedWindow), Rate: 100, Period: time.Minute, Debit: true},
	}
}

// settlement is the settlement of the reservation h, taken at at with the
// decision d, now that spent is known.
func settlement(h sluice.Hit, d sluice.Decision, at time.Time, spent int64, id uint64) *sluice.Settlement {
	return &sluice.Settlement{Hit: h, Spent: spent, ResetAfter: d.ResetAfter, At: at, ID: id}
}

// settle checks Limiter.Settle on a store with a Settle method: a refund
// at once gives back exactly what was not spent, a charge past the limit
// is a debt the next request sees, a refund after the reservation's window
// (or once a bucket has refilled it) gives nothing back, and a random trace
// of reservations, settlements and other requests is decided exactly as
// algo.Step and algo.Settle decide it. A store without the method must
// refuse with errors.ErrUnsupported.
func (s suite) settle(t *testing.T) {
	for _, l := range settleLimits() {
		t.Run(l.Name, func(t *testing.T) {
			e := s.env(t)
			if _, ok := e.store.(decorator.Settler); !ok {
				h := hit("k", l, 5)
				_, err := e.lim.Settle(context.Background(), settlement(h, sluice.Decision{}, e.clock.Now(), 1, 1))
				if !errors.Is(err, errors.ErrUnsupported) {
					t.Fatalf("Settle on a store without it: %v, want errors.ErrUnsupported", err)
				}
				return
			}
			settleRefund(t, s.env(t), l)
			settleCharge(t, s.env(t), l)
			settleLate(t, s.env(t), l)
			settleTrace(t, e, l)
		})
	}
	t.Run("Unsupported", func(t *testing.T) {
		e := s.env(t)
		l := &sluice.Limit{Algorithm: sluice.Algorithm(algo.SlidingLog), Rate: 10, Period: time.Second}
		h := hit("log", l, 5)
		_, err := e.lim.Settle(context.Background(), settlement(h, sluice.Decision{}, e.clock.Now(), 1, 1))
		if !errors.Is(err, errors.ErrUnsupported) {
			t.Fatalf("settling a sliding log: %v, want errors.ErrUnsupported", err)
		}
	})
}

// settleRefund: reserve 60, spend 20, at once: 80 remain, as if 20 had
// been taken.
func settleRefund(t *testing.T, e *env, l *sluice.Limit) {
	t.Helper()
	at := e.clock.Now()
	h := hit("refund", l, 60)
	d, _ := e.take(h)
	want(t, "reservation", d, true, algo.Nominal(algo.Kind(l.Algorithm), l.Rate, l.Burst)-60)
	moved, err := e.lim.Settle(context.Background(), settlement(h, d, at, 20, 1))
	if err != nil || moved != -40 {
		t.Fatalf("settling 20 of 60: moved %d, %v; want -40", moved, err)
	}
	want(t, "after the refund", e.allow("refund", l, 0), true, algo.Nominal(algo.Kind(l.Algorithm), l.Rate, l.Burst)-20)
}

// settleCharge: reserve 30, spend 90 on a limit of at most 100 with 20
// taken before: 110 counted, a debt that denies the next request.
func settleCharge(t *testing.T, e *env, l *sluice.Limit) {
	t.Helper()
	e.allow("charge", l, 20)
	at := e.clock.Now()
	h := hit("charge", l, 30)
	d, _ := e.take(h)
	moved, err := e.lim.Settle(context.Background(), settlement(h, d, at, 90, 2))
	if err != nil || moved != 60 {
		t.Fatalf("settling 90 of 30: moved %d, %v; want 60", moved, err)
	}
	if d := e.allow("charge", l, 1); d.Allowed || d.Remaining != 0 {
		t.Fatalf("a request after a charge past the limit: %+v, want denied", d)
	}
}

// settleLate: a refund two periods after the reservation gives nothing
// back: its window is over, or the bucket has refilled it.
func settleLate(t *testing.T, e *env, l *sluice.Limit) {
	t.Helper()
	at := e.clock.Now()
	h := hit("late", l, 50)
	d, _ := e.take(h)
	e.clock.Advance(2*l.Period + l.RefillInterval)
	e.allow("late", l, 10)
	moved, err := e.lim.Settle(context.Background(), settlement(h, d, at, 0, 3))
	if err != nil || moved != 0 {
		t.Fatalf("settling two periods late: moved %d, %v; want 0", moved, err)
	}
	want(t, "after a late settlement", e.allow("late", l, 0), true, algo.Nominal(algo.Kind(l.Algorithm), l.Rate, l.Burst)-10)
}

// settleTrace runs a random trace of requests, reservations and their
// settlements (some at once, some later, some charges) on one key, and
// checks each decision and each settlement against algo.
func settleTrace(t *testing.T, e *env, l *sluice.Limit) {
	t.Helper()
	p := limits.Params(l)
	rng := rand.New(rand.NewPCG(uint64(len(l.Name)), 0x5e77))
	type pending struct {
		h  sluice.Hit
		d  sluice.Decision
		at time.Time
	}
	var open []pending
	var st algo.State
	for i := range 400 {
		e.clock.Advance(time.Duration(rng.Int64N(int64(l.Period / 5))))
		now := e.clock.Now().UnixNano()
		if len(open) > 0 && rng.IntN(2) == 0 {
			j := rng.IntN(len(open))
			r := open[j]
			open = append(open[:j], open[j+1:]...)
			spent := rng.Int64N(2*r.h.Cost + 1)
			var want int64
			st, want = algo.Settle(&p, st, now, r.at.UnixNano(), int64(r.d.ResetAfter), r.h.Cost, spent)
			moved, err := e.lim.Settle(context.Background(), settlement(r.h, r.d, r.at, spent, uint64(i+1)))
			if err != nil || moved != want {
				t.Fatalf("step %d: settling %d of %d: moved %d, %v; algo moves %d", i, spent, r.h.Cost, moved, err, want)
			}
			continue
		}
		n := rng.Int64N(p.Capacity/3 + 1)
		next, r := algo.Step(&p, st, now, n)
		if r.Allowed && n > 0 {
			st = next
		}
		wantD := limits.Decision(l, r, &p)
		h := hit("trace", l, n)
		got, _ := e.take(h)
		if got.Allowed != wantD.Allowed || got.Remaining != wantD.Remaining || got.ResetAfter != wantD.ResetAfter {
			t.Fatalf("step %d (cost %d): store decided %+v, algo %+v", i, n, got, wantD)
		}
		if got.Allowed && n > 0 {
			open = append(open, pending{h: h, d: got, at: e.clock.Now()})
		}
	}
}
