// Package topkeys feeds the top keys of each rule (package hitters) from
// the decision core's outcomes: one recording, shared by sluice serve (a
// decide.Hook) and the proxy (the answer that settled each request). When
// a list is shown, it reads for the keys of a concurrency limit the
// permits they hold (InFlight), through the decision core.
//
// It imports hitters, decide, rules and the root package; it must not
// import a transport or a store.
package topkeys

import (
	"context"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/edges/hitters"
	"github.com/sluicehq/sluice/rules"
)

// Record tells t every limited descriptor of an answered request: its rule
// (the stats key), its entries (hashed here, written out only when they
// take a counter) and what became of it. Peeks (cost 0) are not hits. In
// global shadow mode (shadow), a denial was let through, so it is
// shadow-denied. It allocates nothing of its own.
func Record(t *hitters.Tracker, descs []rules.Descriptor, o *decide.Outcome, shadow bool) {
	for i := range o.Descriptors {
		do := &o.Descriptors[i]
		if !do.Limited || do.Cost == 0 || i >= len(descs) {
			continue
		}
		entries := descs[i].Entries
		t.Add(do.StatKey, hash(entries), hitters.OutcomeOf(do.Over, do.ShadowOver || shadow && do.Over), func(b []byte) []byte { return appendEntries(b, entries) })
	}
}

// Hook returns the decide.Hook that records every answered request in t;
// shadow is the global shadow mode.
func Hook(t *hitters.Tracker, shadow bool) decide.Hook {
	return func(_ context.Context, r *decide.Request, o *decide.Outcome, err error) {
		if err == nil {
			Record(t, r.Descriptors, o, shadow)
		}
	}
}

// hash is the hitters.KeyHash of the entries.
func hash(entries []rules.Entry) uint64 {
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
