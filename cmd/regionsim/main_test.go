package main

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"strings"
	"testing"
	"time"
)

// defaults is the command's configuration with no flags.
func defaults(t *testing.T, args ...string) config {
	t.Helper()
	c, _, err := parse(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// design is the protocol before it was built: grants of all that is free,
// no wanted set, the design's loop.
var design = []string{"-grant", "all", "-wanted=false", "-loop", "design"}

// TestBound: on every case of the sweep (regions 2, 3, 5 x round trip 50,
// 150 ms x even, 90/5/5, a region going quiet, one region only x no
// fault, a cut at the worst moment, a crash), over three windows, with the
// protocol as built and as designed, no window id admits more than L, no
// ledger entry hands out more than L, and no region holds more than its
// ledger allocation, checked at every event; and the runs press on the
// limit (the bound is exercised, not idle), cuts lose messages, and with
// a hot region the cut strikes right after a large grant whose answer is
// lost. L is 3,000 a minute here, to keep the test short. Under the race
// detector, each mix and fault once (12 of the 126 cases: raceCases).
func TestBound(t *testing.T) {
	built := defaults(t, "-limit", "3000", "-windows", "3")
	designed := defaults(t, append([]string{"-limit", "3000", "-windows", "3"}, design...)...)
	designed.mixes = "hot,shift,one" // even: the two agree
	for _, c := range raceCases(append(sweepCases(built), sweepCases(designed)...)) {
		name := fmt.Sprintf("%s/%d/%s/%s/%s", protocol(c), c.regions, c.rtt[0], c.mix, c.fault)
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := run(c)
			if r.Overshoot != 0 || r.LedgerOver != 0 || r.AboveLedger != 0 || r.Errors != 0 {
				var b bytes.Buffer
				r.print(&b, c)
				t.Fatalf("overshoot %d, ledger over L by %d, a region above its allocation by %d, %d errors\n%s", r.Overshoot, r.LedgerOver, r.AboveLedger, r.Errors, b.String())
			}
			var events int64
			for w, st := range r.Windows {
				if n := st.admitted(); n > c.limit {
					t.Errorf("window %d: %d admitted of L = %d", w, n, c.limit)
				}
				events += st.asked()
			}
			if r.Checks < events {
				t.Errorf("%d checks for %d requests: not every event was checked", r.Checks, events)
			}
			if c.fault == "none" && (c.mix == "even" || c.mix == "hot") && r.Windows[1].admitted() < c.limit*99/100 {
				t.Errorf("window 1: %d admitted of L = %d with demand 1.5 L: the limit is not pressed", r.Windows[1].admitted(), c.limit)
			}
			checkFault(t, c, r)
		})
	}
}

// raceCases is cs, the sweep's cases (regions, then round trip, then mix
// and fault) as built then as designed, or under the race detector one
// case of each mix and fault: as designed on a diagonal (hot with a cut,
// shift with a crash, one without a fault), with 2 or 3 regions and
// either round trip in turn.
func raceCases(cs []config) []config {
	if !raceEnabled {
		return cs
	}
	type what struct{ mix, fault string }
	turn := map[what]int{} // in order of first sight
	var out []config
	for _, c := range cs {
		k := what{c.mix, c.fault}
		j, ok := turn[k]
		if !ok {
			j = len(turn)
			turn[k] = j
		}
		designed := c.mix != "even" && j%3 == j/3%3
		if (protocol(c) == "design") == designed && c.regions == 2+j/2%2 && (c.rtt[0] == 50*time.Millisecond) == (j%2 == 0) {
			out = append(out, c)
		}
	}
	return out
}

// checkFault checks that r's fault struck where it is most dangerous.
func checkFault(t *testing.T, c config, r report) {
	t.Helper()
	if c.fault == "cut" && r.Lost == 0 {
		t.Error("a cut lost no message")
	}
	if c.fault != "none" && c.mix == "hot" && (!r.FaultLarge || r.FaultAt < c.window) {
		t.Errorf("the %s struck at %v, not right after a large grant in window 1", c.fault, r.FaultAt)
	}
	if c.fault == "cut" && c.mix == "hot" && r.Applied == 0 {
		t.Error("no call applied at the coordinator with its answer lost: the dangerous case is not exercised")
	}
}

// seeds is n, or 1 under the race detector.
func seeds(n uint64) uint64 {
	if raceEnabled {
		return 1
	}
	return n
}

// TestBrokenSeen: the checks see a broken protocol. Granting without the
// cap overshoots L, in the ledger and in admissions; giving back without
// spending first leaves a region holding more than the ledger allocates
// it (the bound's lemma) while the same case with the protocol as
// designed never does. Under the race detector, the give-back without
// spending first under "one" only.
func TestBrokenSeen(t *testing.T) {
	c := defaults(t, "-mix", "hot", "-windows", "3")
	c.broken = "nocap"
	r := run(c)
	if r.Overshoot <= 0 || r.LedgerOver <= 0 {
		t.Errorf("grant without the cap: overshoot %d, ledger over L by %d; want both > 0", r.Overshoot, r.LedgerOver)
	}
	t.Logf("grant without the cap: overshoot %d, ledger over by %d", r.Overshoot, r.LedgerOver)
	// Under "one", the idle regions give back only for the wanted set:
	// that give-back must be spent first too.
	mixes := []string{"hot", "one"}
	if raceEnabled {
		mixes = mixes[1:]
	}
	for _, mix := range mixes {
		for _, broken := range []string{"", "nospend"} {
			c := defaults(t, "-mix", mix, "-windows", "3")
			c.broken = broken
			r := run(c)
			if (broken != "") != (r.AboveLedger > 0) {
				t.Errorf("%s, broken %q: a region held up to %d above its ledger allocation", mix, broken, r.AboveLedger)
			}
			t.Logf("%s, broken %q: above the ledger by up to %d, overshoot %d", mix, broken, r.AboveLedger, r.Overshoot)
		}
	}
}

// TestOneRegion: with the key active in region 0 only, the wanted set
// makes the idle regions give back all they hold of it but the headroom
// (L/100 each), and region 0 admits at least 90% of L in every window
// after the first (measured: L less the idle regions' headroom, 98% with
// 3 regions, 96% with 5, over seeds 1 to 6 and round trips of 50 and
// 150 ms). Without it, as built or as designed, the idle regions never
// hear of the key and hold their safe shares: region 0 admits no more
// than its own, plus what no region holds (L − R·s, the rounding).
// Under the race detector, each protocol once, with 2, 3 and 5 regions in
// turn (3 of the 18 cases).
func TestOneRegion(t *testing.T) {
	for i, n := range []string{"2", "3", "5"} {
		for k, rtt := range []string{"50ms", "150ms"} {
			for j, proto := range [][]string{nil, {"-wanted=false"}, design} {
				if raceEnabled && (i != j || k != i%2) {
					continue
				}
				c := defaults(t, append([]string{"-mix", "one", "-regions", n, "-rtt", rtt, "-windows", "4"}, proto...)...)
				t.Run(n+"/"+rtt+"/"+protocol(c), func(t *testing.T) {
					t.Parallel()
					oneRegion(t, c, n, rtt)
				})
			}
		}
	}
}

// oneRegion is a case of TestOneRegion.
func oneRegion(t *testing.T, c config, n, rtt string) {
	r := run(c)
	var b bytes.Buffer
	r.print(&b, c)
	alone := c.limit - int64(c.regions-1)*r.Safe // all region 0 may hold without a give-back
	for w, st := range r.Windows {
		got := st.Admitted[0]
		switch {
		case c.wanted && w > 0 && got < c.limit*9/10:
			t.Errorf("%s regions, %s, %s: window %d: region 0 admitted %d, want at least 90%% of L = %d\n%s", n, rtt, protocol(c), w, got, c.limit, b.String())
		case !c.wanted && got > alone:
			t.Errorf("%s regions, %s, %s: window %d: region 0 admitted %d, more than its safe share %d and the rounding\n%s", n, rtt, protocol(c), w, got, r.Safe, b.String())
		}
	}
	if c.wanted != (r.Yielded > 0) {
		t.Errorf("%s regions, %s, %s: given back %d, for the wanted set %d", n, rtt, protocol(c), r.GivenTotal, r.Yielded)
	}
	t.Logf("%s regions, %s, %s: window 1: region 0 admitted %d of L = %d", n, rtt, protocol(c), r.Windows[1].Admitted[0], c.limit)
}

// TestFairness: with 90/5/5 demand at 1.5 L and 50 ms round trips, the
// hot region gets at least 83% of the admissions in the windows after
// the first (its max-min fair share is 85%: the others ask 7.5% each;
// measured 88.2 to 89.7% over seeds 1 to 6 as built, 85.9 to 87.1% as
// designed), the capacity is used (at least 99% of L), and it reaches 90%
// of its share within 4 s of each window's start (measured 1.4 to 3.4 s
// as built: a grant gives half of what is free, so it takes a few
// rounds; 0.3 to 0.6 s as designed). Under the race detector, seed 1
// only.
func TestFairness(t *testing.T) {
	for seed := uint64(1); seed <= seeds(3); seed++ {
		c := defaults(t, "-mix", "hot", "-rtt", "50ms", "-windows", "4")
		c.seed = seed
		r := run(c)
		s := r.summary(c)
		if s.HotAdm < 0.83 {
			t.Errorf("seed %d: the hot region got %.1f%% of the admissions, want at least 83%%", seed, 100*s.HotAdm)
		}
		if s.Waste > 0.01 {
			t.Errorf("seed %d: %.2f%% of the capacity asked for went unused", seed, 100*s.Waste)
		}
		if s.RampNever > 0 || s.Ramp > 4*time.Second {
			t.Errorf("seed %d: slowest ramp %v, windows never: %d", seed, s.Ramp, s.RampNever)
		}
		t.Logf("seed %d: hot region %.1f%% of admissions (%.1f%% of asks), waste %.2f%%, ramp %v", seed, 100*s.HotAdm, 100*s.HotAsk, 100*s.Waste, s.Ramp)
	}
}

// TestCutHeals: region 0, hot, is cut right after a large grant in
// window 1, its answer lost, for two windows. In window 1 it holds less
// than the ledger gave it (safe); in window 2, cut throughout, it holds
// its safe share exactly and the ledger counts it at that; after healing
// it asks again and holds most of L in window 4.
func TestCutHeals(t *testing.T) {
	c := defaults(t, "-mix", "hot", "-fault", "cut", "-at", "1", "-cutfor", "2m", "-windows", "5")
	r := run(c)
	var b bytes.Buffer
	r.print(&b, c)
	w1, w2, w4 := r.Windows[1], r.Windows[2], r.Windows[4]
	if !r.FaultLarge || r.Applied == 0 || w1.AEnd[0] >= w1.AllocEnd[0] {
		t.Errorf("window 1: the cut did not lose a large grant's answer (held %d, ledger %d)\n%s", w1.AEnd[0], w1.AllocEnd[0], b.String())
	}
	if w2.AMin[0] != r.Safe || w2.AMax[0] != r.Safe || w2.AllocEnd[0] != r.Safe {
		t.Errorf("window 2, cut: region 0 held %d to %d, the ledger %d; want its safe share %d\n%s", w2.AMin[0], w2.AMax[0], w2.AllocEnd[0], r.Safe, b.String())
	}
	if r.HealAt < 0 || w4.AEnd[0] < c.limit*8/10 || w4.AEnd[0] != w4.AllocEnd[0] {
		t.Errorf("window 4, healed at %v: region 0 held %d, the ledger %d; want most of L and agreement\n%s", r.HealAt, w4.AEnd[0], w4.AllocEnd[0], b.String())
	}
}

// TestCrashReturns: region 0, hot, crashes right after a large grant in
// window 1. The ledger keeps its allocation until the window ends (no
// one else may use it: the region might still be admitting), then counts
// it at its safe share in every later window.
func TestCrashReturns(t *testing.T) {
	c := defaults(t, "-mix", "hot", "-fault", "crash", "-at", "1", "-windows", "4")
	r := run(c)
	var b bytes.Buffer
	r.print(&b, c)
	if !r.FaultLarge || r.Windows[1].AllocEnd[0] < r.Safe+c.limit/12 {
		t.Errorf("window 1: the ledger holds %d for the crashed region at the end, want its large grant\n%s", r.Windows[1].AllocEnd[0], b.String())
	}
	for w := 2; w < len(r.Windows); w++ {
		st := r.Windows[w]
		if st.AllocEnd[0] != r.Safe || st.Admitted[0] != 0 {
			t.Errorf("window %d: the ledger holds %d for the crashed region (want its safe share %d), it admitted %d\n%s", w, st.AllocEnd[0], r.Safe, st.Admitted[0], b.String())
		}
	}
}

// TestFlags: bad flags are refused with a reason; the defaults run.
func TestFlags(t *testing.T) {
	for _, args := range [][]string{{"-regions", "0"}, {"-mix", "skewed"}, {"-mixes", "even,odd"}, {"-grant", "some"}, {"-loop", "fast"}, {"-fault", "flood"}, {"-rtt", "50ms,60ms"}, {"-rtt", "fast"}, {"-jitter", "1"}} {
		var b bytes.Buffer
		if _, _, err := parse(args, &b); err == nil || b.Len() == 0 {
			t.Errorf("%v: accepted (%q)", args, b.String())
		}
	}
	c := defaults(t, "-regions", "2", "-rtt", "50ms,150ms", "-windows", "2")
	var b bytes.Buffer
	run(c).print(&b, c)
	if !strings.Contains(b.String(), "max overshoot over L") {
		t.Errorf("report without the overshoot:\n%s", b.String())
	}
}

// TestEvenShares: with even demand at 1.5 L and 50 ms round trips, 3 and
// 5 regions, each region's share of the admissions over windows 1 to 4 is
// within 1 point of its share of the requests, over seeds 1 to 6 (measured
// as built: within 0.51 points, the Poisson spread of the requests; the
// regions admit a third or a fifth of L each). Before a key's rate carried
// over from the window before and it gave nothing back in its first two
// rounds, a region got 22.5% for 33% (3 regions, seed 1), up to 10.8
// points off; with the carry-over alone missing, up to 1.7 points.
// Under the race detector, seed 1 with 3 regions only.
func TestEvenShares(t *testing.T) {
	const margin = 0.01
	for _, n := range []string{"3", "5"} {
		if raceEnabled && n != "3" {
			continue
		}
		for seed := uint64(1); seed <= seeds(6); seed++ {
			c := defaults(t, "-mix", "even", "-regions", n, "-rtt", "50ms", "-windows", "5")
			c.seed = seed
			t.Run(fmt.Sprintf("%s/%d", n, seed), func(t *testing.T) {
				t.Parallel()
				evenShares(t, c, n, seed, margin)
			})
		}
	}
}

// evenShares is a case of TestEvenShares.
func evenShares(t *testing.T, c config, n string, seed uint64, margin float64) {
	r := run(c)
	adm := make([]float64, c.regions)
	ask := make([]float64, c.regions)
	var sumAdm, sumAsk float64
	for _, st := range r.Windows[1:] {
		for i := range c.regions {
			adm[i] += float64(st.Admitted[i])
			ask[i] += float64(st.Asked[i])
		}
		sumAdm += float64(st.admitted())
		sumAsk += float64(st.asked())
	}
	var worst float64
	var bad []string
	for i := range c.regions {
		a, k := frac(adm[i], sumAdm), frac(ask[i], sumAsk)
		worst = max(worst, math.Abs(a-k))
		if math.Abs(a-k) > margin {
			bad = append(bad, fmt.Sprintf("region %d got %.1f%% of the admissions for %.1f%% of the requests", i, 100*a, 100*k))
		}
	}
	if len(bad) > 0 {
		var b bytes.Buffer
		r.print(&b, c)
		t.Errorf("%s regions, seed %d: %s\n%s", n, seed, strings.Join(bad, "; "), b.String())
	}
	t.Logf("%s regions, seed %d: shares of the admissions within %.2f points of the shares of the requests", n, seed, 100*worst)
}

// TestNodes: with several nodes a region (each a regions.Store with its
// own rounds, over the region's one store), the bound holds at every
// event, faults included, and the region's nodes charge a window once
// between them: with one region active, the idle ones end each window
// holding their headroom, no less. Under the race detector, "one"
// without a fault and "hot" with a cut (2 of the 9 cases).
func TestNodes(t *testing.T) {
	for _, mix := range []string{"hot", "shift", "one"} {
		for _, fault := range []string{"none", "cut", "crash"} {
			if raceEnabled && !(mix == "one" && fault == "none") && !(mix == "hot" && fault == "cut") {
				continue
			}
			c := defaults(t, "-limit", "3000", "-windows", "3", "-nodes", "3", "-mix", mix, "-fault", fault)
			t.Run(mix+"/"+fault, func(t *testing.T) {
				t.Parallel()
				r := run(c)
				var b bytes.Buffer
				r.print(&b, c)
				if r.Overshoot != 0 || r.LedgerOver != 0 || r.AboveLedger != 0 || r.Errors != 0 {
					t.Fatalf("overshoot %d, ledger over L by %d, a region above its allocation by %d, %d errors\n%s", r.Overshoot, r.LedgerOver, r.AboveLedger, r.Errors, b.String())
				}
				if mix != "one" || fault != "none" {
					return
				}
				for w, st := range r.Windows {
					for i := 1; i < c.regions; i++ {
						if st.AEnd[i] != c.limit/100 {
							t.Errorf("window %d: idle region %d holds %d at the end, want its headroom %d\n%s", w, i, st.AEnd[i], c.limit/100, b.String())
						}
					}
				}
			})
		}
	}
}

// TestStartedBefore: the nodes started before the first window (regions'
// restart rule: a node started in a window knows nothing of what its
// region spent of it), so in window 0 each may admit its region's safe
// share while its store cannot decide (Budget), as in any other window.
func TestStartedBefore(t *testing.T) {
	c := defaults(t, "-regions", "3", "-nodes", "2")
	s := newSim(c)
	defer s.close()
	for i, r := range s.rs {
		for j, n := range r.nodes {
			if left, ok := n.st.Budget(key, s.limit); !ok || left != s.r.Safe {
				t.Errorf("region %d node %d: budget %d %v at window 0's start, want the safe share, %d", i, j, left, ok, s.r.Safe)
			}
		}
	}
}
