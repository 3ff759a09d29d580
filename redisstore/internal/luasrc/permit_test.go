package luasrc_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/base/algo"
)

// permitTrace generates a trace of acquisitions, peeks, renewals and
// releases of a few IDs on one key's permits, kept in a map as a store
// keeps them (the expired dropped first, as algo.PermitExpired says, and
// counted: what a store reports as expired), through algo.PermitStep and
// algo.PermitRenew (op 2 a renewal, op 4 a hand-over), and its expected
// output (the driver's mode "permit").
func permitTrace(r *rand.Rand) *trace {
	p := genParams(r, algo.FixedWindow) // a period, realistic or extreme
	p.Kind, p.Offset = algo.Concurrency, 0
	p.Capacity = []int64{0, 1, 2, 3, 5, between(r, 0, algo.MaxPermits)}[r.IntN(6)]
	p.Rate = p.Capacity
	if r.IntN(8) == 0 {
		p.Rate = 0
	}
	now := genStart(r, p.Period)
	set := map[int64]int64{}
	var in strings.Builder
	fmt.Fprintf(&in, "%s", fmtParams(p))
	tr := &trace{}
	for range between(r, stepsLo, stepsHi) {
		op, id := int64(r.IntN(5)), int64(r.IntN(4))
		if r.IntN(3) == 0 {
			op = 1
		}
		dropped := 0
		for k, e := range set {
			if algo.PermitExpired(e, now) {
				delete(set, k)
				dropped++
			}
		}
		s := algo.PermitSet{Old: set[id]}
		for _, e := range set {
			s.Held++
			if s.Earliest == 0 || e < s.Earliest {
				s.Earliest = e
			}
		}
		line := "-"
		switch op {
		case 3:
			delete(set, id)
		default:
			var res algo.Result
			var exp int64
			if op == 2 || op == 4 {
				res, exp = algo.PermitRenew(&p, s, now, op == 4)
			} else {
				res, exp = algo.PermitStep(&p, s, now, op)
			}
			line = fmt.Sprintf("%s %d", fmtResult(res), exp)
			if exp != 0 {
				set[id] = exp
			}
		}
		held, earliest := 0, int64(0)
		for _, e := range set {
			held++
			if earliest == 0 || e < earliest {
				earliest = e
			}
		}
		fmt.Fprintf(&in, " %d %d %d", now, op, id)
		now0, s0 := now, s
		tr.step(fmt.Sprintf("%s %d %d %d", line, held, earliest, dropped), func() string {
			return fmt.Sprintf("params %+v set %+v now %d op %d id %d", p, s0, now0, op, id)
		})
		now = genNext(r, now, p.Period, max(p.Capacity, 1))
	}
	tr.in = in.String()
	return tr
}

// TestPermits runs random traces of a key's permits through
// algo.PermitStep and PermitRenew and through algo.permit_step and
// permit_renew.
func TestPermits(t *testing.T) {
	t.Parallel()
	runRandom(t, newDriver(t), 11, "permit", permitTrace)
}
