package luasrc_test

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/base/algo"
)

// reservation is the last hit a settle trace's Step admitted: what a
// settlement of it names.
type reservation struct {
	at, reset, n int64
	ok           bool
}

// settleTally counts what a settle trace's settlements did, so that the
// test can tell that its cases reach every branch.
type settleTally struct {
	settles, charges, refunds, none int
}

// genSettle returns the at, ResetAfter, reserved and spent of a
// settlement at now: most often of the last reservation (at its take's
// time or up to a period before, the ResetAfter it was answered), and
// otherwise, or with none, values drawn at random, the edges included.
func genSettle(r *rand.Rand, p *algo.Params, now int64, last reservation) (at, reset, reserved, spent int64) {
	at, reset, reserved = last.at, last.reset, last.n
	if !last.ok {
		at, reset, reserved = subSat(now, between(r, 0, min(p.Period, maxI/2))), between(r, 0, min(p.Period, maxI/2)), genN(r, p.Capacity)
	}
	switch r.IntN(8) {
	case 0, 1:
	case 2, 3, 4:
		at = subSat(at, between(r, 0, min(p.Period-1, 5e9)))
	case 5:
		at = subSat(at, between(r, 0, 2*min(p.Period, maxI/2)))
	case 6:
		at = addSat(now, between(r, 0, min(p.Period, maxI/2))) // later than now
	default:
		at = []int64{0, anyBits(r, 63), specials[r.IntN(len(specials))]}[r.IntN(3)]
	}
	switch r.IntN(10) {
	case 0:
		reset = specials[r.IntN(len(specials))]
	case 1:
		reset = between(r, 0, 2*min(p.Period, maxI/2))
	}
	if r.IntN(8) == 0 {
		reserved = genN(r, p.Capacity)
	}
	switch r.IntN(8) {
	case 0:
		spent = 0
	case 1:
		spent = reserved
	case 2, 3:
		spent = between(r, 0, reserved)
	case 4, 5:
		spent = addSat(reserved, between(r, 0, max(reserved, 1)))
	case 6:
		spent = specials[r.IntN(len(specials))]
	default:
		spent = anyBits(r, 40)
	}
	return at, reset, reserved, spent
}

// tickTokens returns the tokens a discrete bucket adds a tick (0 for
// none, or for a product beyond 64 bits, which adds none).
func tickTokens(p *algo.Params) uint64 {
	if p.Kind != algo.TokenBucket || p.Interval <= 0 || p.Period <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(p.Rate), uint64(p.Interval))
	if hi != 0 {
		return 0
	}
	return lo / uint64(p.Period)
}

// settleTrace generates a trace of algo.Step and algo.Settle on one
// state: steps that reserve, settlements of the last reservation (or of
// values drawn at random), and its expected output.
func settleTrace(r *rand.Rand, kind algo.Kind, tally *settleTally) *trace {
	p := genParams(r, kind)
	for tickTokens(&p) > maxI {
		// algo.Step writes such a bucket's remainder, up to the tokens
		// of a tick, into the int64 B, where it wraps negative (and Go
		// then reads it as 0); algo.lua keeps it: a divergence of Step,
		// not of Settle, that TestStep rarely draws.
		p = genParams(r, kind)
	}
	if kind == algo.SlidingWindow && r.IntN(10) != 0 {
		p.Offset = 0 // a calendar period: Settles says no, now and then
	}
	now := genStart(r, p.Period)
	s := genState(r, p, now)
	var in strings.Builder
	in.WriteString(fmtParams(p) + " " + fmtState(kind, s))
	tr := &trace{}
	var last reservation
	for range between(r, stepsLo, stepsHi) {
		s0, now0 := s, now
		if r.IntN(5) < 3 {
			n := genN(r, p.Capacity)
			s2, res := algo.Step(&p, s, now, n)
			if res.Allowed {
				s = s2
				if n > 0 {
					last = reservation{at: now, reset: res.ResetAfter, n: n, ok: true}
				}
			}
			writeInts(&in, 0, now, n)
			tr.step(fmtResult(res)+" "+fmtState(kind, s), func() string {
				return fmt.Sprintf("step: params %+v state %+v now %d n %d", p, s0, now0, n)
			})
		} else {
			at, reset, reserved, spent := genSettle(r, &p, now, last)
			s2, moved := algo.Settle(&p, s, now, at, reset, reserved, spent)
			s = s2
			tally.settles++
			switch {
			case moved > 0:
				tally.charges++
			case moved < 0:
				tally.refunds++
			default:
				tally.none++
			}
			writeInts(&in, 1, now, at, reset, reserved, spent)
			tr.step(ints(moved)+" "+fmtState(kind, s), func() string {
				return fmt.Sprintf("settle: params %+v state %+v now %d at %d reset %d reserved %d spent %d", p, s0, now0, at, reset, reserved, spent)
			})
		}
		now = genNext(r, now, p.Period, p.Rate)
	}
	tr.in = in.String()
	return tr
}

// TestSettle runs random traces of reservations and their settlements
// through algo.Step and algo.Settle and through algo.step and
// algo.settle, on the five algorithms with a State (the token bucket with
// and without discrete refill): every result, every hit moved and every
// state must be identical.
func TestSettle(t *testing.T) {
	t.Parallel()
	d := newDriver(t)
	for i, kind := range []algo.Kind{algo.FixedWindow, algo.TokenBucket, algo.LeakyBucket, algo.GCRA, algo.SlidingWindow} {
		t.Run(kind.String(), func(t *testing.T) {
			var tally settleTally
			runRandom(t, d, uint64(201+i), "settle", func(r *rand.Rand) *trace { return settleTrace(r, kind, &tally) })
			t.Logf("%d settlements: %d charges, %d refunds, %d moved nothing", tally.settles, tally.charges, tally.refunds, tally.none)
			// The cases must reach both arithmetic paths often.
			if tally.charges < tally.settles/10 || tally.refunds < tally.settles/20 {
				t.Errorf("too few charges or refunds among the cases: %+v", tally)
			}
		})
	}
}
