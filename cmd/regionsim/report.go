package main

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// report is what a simulation measured.
type report struct {
	Windows      []windowStat
	Safe         int64 // s_r
	Overshoot    int64 // the most admitted in one window id beyond L (the bound: 0)
	LedgerOver   int64 // the most Σ alloc_r beyond L in one ledger entry (the invariant: 0)
	AboveLedger  int64 // the most a region held (a_r less what it spent to give back) beyond its ledger allocation (the lemma: 0)
	Checks       int64 // events at which the invariants were checked
	FaultAt      time.Duration
	FaultLarge   bool          // the fault struck right after a large grant, not at the fallback
	HealAt       time.Duration // a cut's end; -1: none
	Shift        time.Duration // when the last region went quiet; -1: never
	Calls, Lost  int64         // calls sent; messages lost to the cut
	Applied      int64         // calls applied at the coordinator whose answer was lost
	Reads        int64         // reads of the wanted set
	GrantedTotal int64
	GivenTotal   int64
	Yielded      int64 // of GivenTotal, given back for the wanted set
	Errors       int64 // decisions the region tier failed (none expected)
}

// windowStat is one window id's tally.
type windowStat struct {
	Asked, Admitted []int64 // per region
	LedgerMax       int64   // the most Σ alloc_r seen in its ledger entry
	AEnd, AllocEnd  []int64 // what each region held (a_r less spent) and the ledger's alloc_r at the window's end
	AMin, AMax      []int64 // the least and most each region held during the window
	Cut             []bool  // the region's link was cut at some time in the window
	Down            []bool  // the region was down at the window's end
	From            time.Duration
	Target          []float64       // each region's max-min fair allocation from From
	Held0           []int64         // what each region held at From
	RampR           []time.Duration // from From until the region had 90% of the way from Held0 to its target; -2: target not above Held0 by more than the threshold; -1: never
	Ramp            time.Duration   // the slowest of RampR; -1: some region never
}

func (w *windowStat) asked() (n int64) {
	for _, x := range w.Asked {
		n += x
	}
	return n
}

func (w *windowStat) admitted() (n int64) {
	for _, x := range w.Admitted {
		n += x
	}
	return n
}

// summary is a run's figures over the windows from the second on (the
// first starts with no demand estimate) and its bound over all windows.
type summary struct {
	Admitted, Asked int64   // all windows
	HotAdm, HotAsk  float64 // region 0's share of admissions and of asks, windows after the first
	Waste           float64 // capacity left unused although asked for, windows after the first: Σ(min(asked, L) − admitted) / Σ min(asked, L)
	Unused          float64 // L − admitted over L, windows after the first
	Ramp            time.Duration
	RampNever       int           // windows after the first in which some region never reached 90% of its target
	ShiftFirst      time.Duration // after the shift, the first and the last region to hold 90% of its target; -1: never, -2: no shift
	ShiftLast       time.Duration
}

func (r report) summary(c config) summary {
	s := summary{ShiftFirst: -2, ShiftLast: -2}
	var hotAdm, adm, hotAsk, ask, room, waste, unused float64
	for w, st := range r.Windows {
		s.Admitted += st.admitted()
		s.Asked += st.asked()
		if w == 0 {
			continue
		}
		a, k := float64(st.admitted()), float64(st.asked())
		hotAdm += float64(st.Admitted[0])
		hotAsk += float64(st.Asked[0])
		adm += a
		ask += k
		room += math.Min(k, float64(c.limit))
		waste += math.Min(k, float64(c.limit)) - a
		unused += float64(c.limit) - a
		if st.Ramp < 0 {
			s.RampNever++
		}
		s.Ramp = max(s.Ramp, st.Ramp)
		if r.Shift >= 0 && st.From == r.Shift {
			s.ShiftFirst, s.ShiftLast = -1, st.Ramp
			for _, d := range st.RampR {
				if d >= 0 && (s.ShiftFirst < 0 || d < s.ShiftFirst) {
					s.ShiftFirst = d
				}
			}
		}
	}
	s.HotAdm, s.HotAsk = frac(hotAdm, adm), frac(hotAsk, ask)
	s.Waste = frac(waste, room)
	s.Unused = frac(unused, float64(c.limit)*float64(len(r.Windows)-1))
	return s
}

func frac(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func ms(d time.Duration) string {
	switch {
	case d == -2:
		return "-"
	case d < 0:
		return "never"
	}
	return d.Round(time.Millisecond).String()
}

func (r report) print(w io.Writer, c config) {
	c = c.defaults()
	fmt.Fprintf(w, "%d regions, L = %d per %s, safe share %d, round trips %v (jitter %.0f%%), τ %s, estimate over %d τ, headroom %.1f τ (at least %d), give-back threshold %d\n",
		c.regions, c.limit, c.window, r.Safe, c.rtt, 100*c.jitter, c.tau, c.estimate, c.headroom, c.minHead, c.threshold)
	fmt.Fprintf(w, "protocol %s; demand %.2f L a window, mix %s, fault %s, %d windows, seed %d", protocol(c), c.demand, c.mix, c.fault, c.windows, c.seed)
	if c.broken != "" {
		fmt.Fprintf(w, ", BROKEN protocol: %s", c.broken)
	}
	fmt.Fprintln(w)
	if r.FaultAt >= 0 {
		moment := "at the window's middle (no large grant before)"
		if r.FaultLarge {
			moment = "right after a large grant"
		}
		fmt.Fprintf(w, "fault on region 0 at %s, %s", ms(r.FaultAt), moment)
		if r.HealAt >= 0 {
			fmt.Fprintf(w, "; healed at %s", ms(r.HealAt))
		}
		fmt.Fprintln(w)
	}
	if r.Shift >= 0 {
		fmt.Fprintf(w, "region %d went quiet at %s\n", c.regions-1, ms(r.Shift))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-3s %7s %9s %6s %8s %7s  %-*s  %-*s  %s\n", "w", "asked", "admitted", "over", "ledger", "waste",
		11*c.regions, "admitted/asked share % per region", 8*c.regions, "held at end", "ramp to 90% of target, per region")
	for i, st := range r.Windows {
		var shares, ends, ramps strings.Builder
		a, k := float64(st.admitted()), float64(st.asked())
		for j := range st.Asked {
			fmt.Fprintf(&shares, "%4.1f/%4.1f  ", 100*frac(float64(st.Admitted[j]), a), 100*frac(float64(st.Asked[j]), k))
			mark := ""
			switch {
			case st.Down[j]:
				mark = "x"
			case st.Cut[j]:
				mark = "~"
			}
			fmt.Fprintf(&ends, "%6d%-1s ", st.AEnd[j], mark)
			ramps.WriteString(ms(st.RampR[j]) + " ")
		}
		waste := min(st.asked(), c.limit) - st.admitted()
		fmt.Fprintf(w, "%-3d %7d %9d %6d %8d %7d  %-*s  %-*s  %s\n", i, st.asked(), st.admitted(), max(st.admitted()-c.limit, 0),
			st.LedgerMax, waste, 11*c.regions, shares.String(), 8*c.regions, ends.String(), ramps.String())
	}
	s := r.summary(c)
	fmt.Fprintln(w)
	row := func(k, v string) { fmt.Fprintf(w, "%-52s %s\n", k, v) }
	row("admitted, all windows", fmt.Sprintf("%d of %d asked (L x windows = %d)", s.Admitted, s.Asked, c.limit*int64(c.windows)))
	row("max overshoot over L in a window id (bound: 0)", fmt.Sprint(r.Overshoot))
	row("max Σ alloc_r over L in the ledger (invariant: 0)", fmt.Sprint(r.LedgerOver))
	row("max a_r - spent over the ledger's alloc_r (lemma: 0)", fmt.Sprint(r.AboveLedger))
	row("events checked", fmt.Sprint(r.Checks))
	row("region 0: share of admitted, of asked (w >= 1)", fmt.Sprintf("%.1f%%, %.1f%%", 100*s.HotAdm, 100*s.HotAsk))
	row("capacity unused though asked for (w >= 1)", fmt.Sprintf("%.2f%%", 100*s.Waste))
	row("capacity unused (w >= 1)", fmt.Sprintf("%.2f%%", 100*s.Unused))
	row("slowest ramp to 90% of max-min share (w >= 1)", fmt.Sprintf("%s (windows where a region never did: %d)", ms(s.Ramp), s.RampNever))
	if r.Shift >= 0 {
		row("after the shift: first, last region at 90%", fmt.Sprintf("%s, %s", ms(s.ShiftFirst), ms(s.ShiftLast)))
	}
	row("calls; wanted reads; lost; applied, answer lost", fmt.Sprintf("%d; %d; %d; %d", r.Calls, r.Reads, r.Lost, r.Applied))
	row("granted, given back (of it, for the wanted set)", fmt.Sprintf("%d, %d (%d)", r.GrantedTotal, r.GivenTotal, r.Yielded))
	fmt.Fprintln(w, "\n(held: a_r less what was spent to give back; ~ cut during the window, x down at its end; waste: min(asked, L) - admitted;\n ramp: from the window's start, the shift or the crash, until the region came 90% of the way from what it held to its max-min fair share, - if that is within the give-back threshold)")
}

// sweepCases are the sweep's simulations, from base: regions 2, 3, 5 x
// round trip 50, 150 ms x base's mixes x fault none, cut, crash.
func sweepCases(base config) []config {
	var cs []config
	for _, n := range []int{2, 3, 5} {
		for _, rtt := range []time.Duration{50 * time.Millisecond, 150 * time.Millisecond} {
			for _, mix := range strings.Split(base.defaults().mixes, ",") {
				for _, fault := range []string{"none", "cut", "crash"} {
					c := base
					c.regions, c.rtt, c.mix, c.fault = n, []time.Duration{rtt}, mix, fault
					cs = append(cs, c)
				}
			}
		}
	}
	return cs
}

func runSweep(w io.Writer, base config) {
	b := base.defaults()
	fmt.Fprintf(w, "L = %d per %s, %d windows, demand %.2f L, τ %s, estimate %d τ, headroom %.1f τ (>= %d), threshold %s, jitter %.0f%%, seed %d\n",
		b.limit, b.window, b.windows, b.demand, b.tau, b.estimate, b.headroom, b.minHead, thresholdText(base), 100*b.jitter, b.seed)
	fmt.Fprintf(w, "protocol %s; shares, waste, unused and ramp over windows 1 and later; over, ledger and a>alloc over all windows and events\n", protocol(b))
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| R | rtt | mix | fault | admitted / L·windows | over | ledger over | a_r > alloc | r0 admitted / asked | waste | unused | slowest ramp (windows never) | after shift: first, last | fault at |")
	fmt.Fprintln(w, "|---|-----|-----|-------|------|---|---|---|------|---|---|---|---|---|")
	for _, c := range sweepCases(base) {
		r := run(c)
		s := r.summary(c)
		at := "-"
		if r.FaultAt >= 0 {
			at = ms(r.FaultAt)
			if !r.FaultLarge {
				at += " (mid)"
			}
		}
		fmt.Fprintf(w, "| %d | %s | %s | %s | %d / %d | %d | %d | %d | %.1f%% / %.1f%% | %.2f%% | %.2f%% | %s (%d) | %s, %s | %s |\n",
			c.regions, c.rtt[0], c.mix, c.fault, s.Admitted, c.limit*int64(c.windows), r.Overshoot, r.LedgerOver, r.AboveLedger,
			100*s.HotAdm, 100*s.HotAsk, 100*s.Waste, 100*s.Unused, ms(s.Ramp), s.RampNever, ms(s.ShiftFirst), ms(s.ShiftLast), at)
	}
}

// protocol names c's protocol: built, design, or its three choices.
func protocol(c config) string {
	switch {
	case c.grant == "half" && c.wanted && c.loop == "built":
		return "built"
	case c.grant == "all" && !c.wanted && c.loop == "design":
		return "design"
	}
	return fmt.Sprintf("grant %s, wanted %t, loop %s", c.grant, c.wanted, c.loop)
}

func thresholdText(c config) string {
	if c.threshold == 0 {
		return "L/100"
	}
	return fmt.Sprint(c.threshold)
}
