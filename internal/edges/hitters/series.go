package hitters

import "time"

// Outcome is what a rule's limits did with a request.
type Outcome uint8

const (
	Allowed      Outcome = iota
	Denied               // denied, counted in the Denials top keys
	ShadowDenied         // over a limit in shadow mode, so allowed
)

// OutcomeOf is the outcome of a descriptor over a limit (over) or not,
// and over only by limits in shadow mode (shadowOver).
func OutcomeOf(over, shadowOver bool) Outcome {
	switch {
	case shadowOver:
		return ShadowDenied
	case over:
		return Denied
	}
	return Allowed
}

// The series: what each rule allowed, denied and let through in shadow
// mode in each 10 s of the last 10 minutes.
const (
	SeriesStep = slice // 10 s: Add checks one slice for both
	SeriesLen  = 60
)

// Point is one 10 s of a rule's series.
type Point struct {
	At      int64 `json:"at"` // unix seconds, the start of the 10 s
	Allowed int64 `json:"allowed"`
	Denied  int64 `json:"denied"`
	Shadow  int64 `json:"shadow_denied"`
}

type seriesBucket struct {
	slot                    int64 // unix time / SeriesStep
	allowed, denied, shadow int64
}

// rollSeries makes the series' current 10 s that of now (unix
// nanoseconds, later than it), keeping the one before in the ring; r.mu
// is held.
func (r *ruleTrack) rollSeries(now int64) {
	slot := now / int64(SeriesStep)
	if b := &r.now; b.slot < slot {
		if b.slot != 0 {
			r.series[b.slot%SeriesLen] = *b
		}
		*b = seriesBucket{slot: slot}
	}
}

// countAt adds one outcome to the 10 s slot, the current one or, for a
// hit that read the clock before another rolled it on (or a clock set
// back), one of the ring's; r.mu is held. A slot out of the last 10
// minutes is not counted.
func (r *ruleTrack) countAt(slot int64, o Outcome) {
	b := &r.now
	if slot != b.slot {
		if slot <= b.slot-SeriesLen {
			return
		}
		b = &r.series[slot%SeriesLen]
		if b.slot < slot { // older than the window, or another slot's
			*b = seriesBucket{slot: slot}
		}
	}
	b.count(o)
}

// count adds one outcome to b.
func (b *seriesBucket) count(o Outcome) {
	switch o {
	case ShadowDenied:
		b.shadow++
	case Denied:
		b.denied++
	default:
		b.allowed++
	}
}

// Series returns rule's last 10 minutes at the tracker's time, oldest
// first (all zero for a rule not tracked).
func (t *Tracker) Series(rule string) []Point {
	slot := t.now() / int64(SeriesStep)
	r := (*t.rules.Load())[rule]
	if r != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
	}
	out := make([]Point, 0, SeriesLen)
	for s := slot - SeriesLen + 1; s <= slot; s++ {
		p := Point{At: s * int64(SeriesStep) / int64(time.Second)}
		if r != nil {
			b := r.series[s%SeriesLen]
			if r.now.slot == s {
				b = r.now
			}
			if b.slot == s {
				p.Allowed, p.Denied, p.Shadow = b.allowed, b.denied, b.shadow
			}
		}
		out = append(out, p)
	}
	return out
}
