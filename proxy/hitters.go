package proxy

import (
	"context"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/hitters"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/rules"
)

// recording is a Decider that tells a hitters.Tracker every limited
// descriptor it decided: its rule (the stats key), its entries (hashed
// here, written out only when they take a counter) and its outcome: in
// the http section's shadow mode (shadow), a denial is let through, so it
// is shadow-denied. It allocates nothing of its own.
type recording struct {
	httplimit.Decider
	top    *hitters.Tracker
	shadow bool
}

func (d recording) DecideInto(ctx context.Context, domain string, descs []rules.Descriptor, o *decide.Outcome) error {
	err := d.Decider.DecideInto(ctx, domain, descs, o)
	if err != nil {
		return err
	}
	for i := range o.Descriptors {
		do := &o.Descriptors[i]
		if !do.Limited || i >= len(descs) {
			continue
		}
		entries := descs[i].Entries
		d.top.Add(do.StatKey, entriesHash(entries), hitters.OutcomeOf(do.Over, do.ShadowOver || d.shadow && do.Over), func(b []byte) []byte { return appendEntries(b, entries) })
	}
	return nil
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
