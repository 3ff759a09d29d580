package storetest

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
	"github.com/sluicehq/sluice/internal/stores/decorator"
	"github.com/sluicehq/sluice/internal/vocab/limits"
)

// trace compares the store with the algo package on a random trace: each
// decision must be exactly the one algo computes on the committed state.
// The sketch is left out: its estimate depends on the store's key hash.
func (s suite) trace(t *testing.T) {
	cases := []*sluice.Limit{
		{Name: "fw", Algorithm: sluice.Algorithm(algo.FixedWindow), Rate: 5, Period: time.Second},
		{Name: "fw-soft", Algorithm: sluice.Algorithm(algo.FixedWindow), Rate: 5, Period: time.Second, SoftPercent: 40},
		{Name: "tb", Algorithm: sluice.Algorithm(algo.TokenBucket), Rate: 5, Period: time.Second, Burst: 8},
		{Name: "tb-discrete", Algorithm: sluice.Algorithm(algo.TokenBucket), Rate: 5, Period: time.Second, Burst: 8, RefillInterval: 200 * time.Millisecond},
		{Name: "lb", Algorithm: sluice.Algorithm(algo.LeakyBucket), Rate: 5, Period: time.Second, Burst: 8},
		{Name: "gcra", Algorithm: sluice.Algorithm(algo.GCRA), Rate: 7, Period: time.Second, Burst: 3},
		{Name: "sw", Algorithm: sluice.Algorithm(algo.SlidingWindow), Rate: 6, Period: time.Second},
		{Name: "log", Algorithm: sluice.Algorithm(algo.SlidingLog), Rate: 6, Period: time.Second},
		{Name: "log-elastic", Algorithm: sluice.Algorithm(algo.SlidingLog), Rate: 6, Period: time.Second, ElasticCeiling: 9},
	}
	for li, l := range cases {
		t.Run(l.Name, func(t *testing.T) {
			e := s.env(t)
			p := limits.Params(l)
			rng := rand.New(rand.NewPCG(uint64(li), 0x5eed))
			costs := []int64{0, 1, 1, 1, 1, 2, 3, p.Capacity + 1}
			var st algo.State
			var log algo.Log
			for i := range 500 {
				step := time.Duration(rng.Int64N(int64(400 * time.Millisecond)))
				// Time goes backwards now and then, but never back across
				// the point where the state went idle: a store may forget
				// an idle state, and then a fresh key is all it can see.
				now := e.clock.Now().UnixNano()
				idle := st.A
				if len(log.Entries) > 0 {
					idle = log.Newest() + p.Period
				}
				if rng.IntN(25) == 0 && (idle > now || idle == 0) {
					step = -step
				}
				e.clock.Advance(step)
				now = e.clock.Now().UnixNano()
				n := costs[rng.IntN(len(costs))]
				var r algo.Result
				if l.Algorithm == sluice.SlidingLog {
					r = logRef(&p, &log, now, n, false)
				} else {
					var next algo.State
					next, r = algo.Step(&p, st, now, n)
					if r.Allowed && n > 0 {
						st = next
					}
				}
				wantD := limits.Decision(l, r, &p)
				got := e.allow("trace", l, n)
				if got.Allowed != wantD.Allowed || got.Limit != wantD.Limit || got.Remaining != wantD.Remaining ||
					got.ResetAfter != wantD.ResetAfter || got.RetryAfter != wantD.RetryAfter || got.Over != wantD.Over {
					t.Fatalf("step %d (t=+%v, cost %d): store decided %+v, algo %+v",
						i, e.clock.Now().Sub(Start), n, got, wantD)
				}
			}
		})
	}
}

// eachTrace compares TakeEach with the algo package on a random trace, as
// trace does for Take: every decision exactly algo.Overdraw's (for sliding
// logs, LogStepEach with algo.Overdraws) on the state it left. A store
// without TakeEach is checked through Limiter.TakeEach's fallback, a
// Take a hit: algo.Step's (LogStep's) decisions, nothing overdrawn.
func (s suite) eachTrace(t *testing.T) {
	cases := []*sluice.Limit{
		{Name: "fw", Algorithm: sluice.Algorithm(algo.FixedWindow), Rate: 5, Period: time.Second},
		{Name: "tb", Algorithm: sluice.Algorithm(algo.TokenBucket), Rate: 5, Period: time.Second, Burst: 8},
		{Name: "tb-discrete", Algorithm: sluice.Algorithm(algo.TokenBucket), Rate: 5, Period: time.Second, Burst: 8, RefillInterval: 200 * time.Millisecond},
		{Name: "lb", Algorithm: sluice.Algorithm(algo.LeakyBucket), Rate: 5, Period: time.Second, Burst: 8},
		{Name: "gcra", Algorithm: sluice.Algorithm(algo.GCRA), Rate: 7, Period: time.Second, Burst: 3},
		{Name: "sw", Algorithm: sluice.Algorithm(algo.SlidingWindow), Rate: 6, Period: time.Second},
		{Name: "log", Algorithm: sluice.Algorithm(algo.SlidingLog), Rate: 6, Period: time.Second},
		{Name: "tb-debit", Algorithm: sluice.Algorithm(algo.TokenBucket), Rate: 5, Period: time.Second, Burst: 8, Debit: true},
		{Name: "sw-debit", Algorithm: sluice.Algorithm(algo.SlidingWindow), Rate: 6, Period: time.Second, Debit: true},
		{Name: "log-debit", Algorithm: sluice.Algorithm(algo.SlidingLog), Rate: 6, Period: time.Second, Debit: true},
	}
	for li, l := range cases {
		t.Run(l.Name, func(t *testing.T) {
			e := s.env(t)
			_, each := e.store.(decorator.EachTaker)
			p := limits.Params(l)
			rng := rand.New(rand.NewPCG(uint64(li), 0xeac4))
			costs := []int64{0, 0, 1, 1, 1, 2, 3, p.Capacity + 1}
			var st algo.State
			var log algo.Log
			for i := range 500 {
				e.clock.Advance(time.Duration(rng.Int64N(int64(300 * time.Millisecond))))
				now := e.clock.Now().UnixNano()
				n := costs[rng.IntN(len(costs))]
				var r algo.Result
				switch {
				case l.Algorithm == sluice.SlidingLog:
					r = logRef(&p, &log, now, n, each)
				case each:
					st, r = algo.Overdraw(&p, st, now, n)
				default:
					var next algo.State
					next, r = algo.Step(&p, st, now, n)
					if r.Allowed && n > 0 {
						st = next
					}
				}
				wantD := limits.Decision(l, r, &p)
				_, per := e.each(hit("trace", l, n))
				got := per[0]
				if got.Allowed != wantD.Allowed || got.Remaining != wantD.Remaining || got.Overdrawn != wantD.Overdrawn ||
					got.ResetAfter != wantD.ResetAfter || got.RetryAfter != wantD.RetryAfter {
					t.Fatalf("step %d (t=+%v, cost %d): store decided %+v, algo %+v",
						i, e.clock.Now().Sub(Start), n, got, wantD)
				}
			}
		})
	}
}

// logRef is what a sliding log decides for a hit of cost n at now, and
// commits to log: all or nothing (LogStep), or one by one (LogStepEach,
// overdrawing as algo.Overdraws and algo.OverdrawsExhausted say).
func logRef(p *algo.Params, log *algo.Log, now, n int64, each bool) algo.Result {
	if !each {
		expired, r := algo.LogStep(p, log, now, n)
		cost := int64(0)
		if r.Allowed {
			cost = n
		}
		log.Commit(expired, now, cost)
		return r
	}
	expired, r := algo.LogStepEach(p, log, now, n)
	over := algo.Overdraws(r, n) || algo.OverdrawsExhausted(p, r, n, func() bool {
		_, peek := algo.LogStepEach(p, log, now, 0)
		return !peek.Allowed
	})
	cost := int64(0)
	if r.Allowed || over {
		cost = n
	}
	log.Commit(expired, now, cost)
	if over {
		_, after := algo.LogStep(p, log, now, 1)
		r = algo.Result{ResetAfter: after.ResetAfter, RetryAfter: after.RetryAfter, Overdrawn: true}
	}
	return r
}
