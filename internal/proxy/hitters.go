package proxy

import (
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/hitters"
	"github.com/sluicehq/sluice/rules"
)

// topKeysRecorder tells a hitters.Tracker every limited descriptor of the
// decision that settled a request (httplimit.Config.OnOutcome): its rule
// (the stats key), its entries (hashed here, written out only when they
// take a counter) and its outcome. Peeks (cost 0) are not hits. In the
// http section's shadow mode (shadow), a denial is let through, so it is
// shadow-denied. It allocates nothing of its own.
func topKeysRecorder(top *hitters.Tracker, shadow bool) func([]rules.Descriptor, *decide.Outcome) {
	return func(descs []rules.Descriptor, o *decide.Outcome) {
		for i := range o.Descriptors {
			do := &o.Descriptors[i]
			if !do.Limited || do.Cost == 0 || i >= len(descs) {
				continue
			}
			entries := descs[i].Entries
			top.Add(do.StatKey, entriesHash(entries), hitters.OutcomeOf(do.Over, do.ShadowOver || shadow && do.Over), func(b []byte) []byte { return appendEntries(b, entries) })
		}
	}
}

// entriesHash is the hitters.KeyHash of the entries, as sluice serve's.
func entriesHash(entries []rules.Entry) uint64 {
	h := hitters.NewKeyHash
	for _, e := range entries {
		h = h.Entry(e.Key, e.Value)
	}
	return uint64(h)
}

// appendEntries writes the entries as key=value pairs joined by "/", the
// form the dashboard reads back.
func appendEntries(b []byte, entries []rules.Entry) []byte {
	for i, e := range entries {
		b = hitters.AppendEntry(b, i, e.Key, e.Value)
	}
	return b
}
