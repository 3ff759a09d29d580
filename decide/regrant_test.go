package decide_test

import (
	"testing"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
)

// TestPermitTokenRegrant: the permits the store granted for tokens (sluice
// serve keeps no Permit, and nothing renews them) are held in the store
// again when it answers after the node saw it down, as a Redis restarted
// empty needs: a newcomer is refused beside their holders, a token
// released during the outage is not held again, and the others' releases
// free their slots. Without the regrant the store that forgot them admits
// 4 newcomers beside 3 holders.
func TestPermitTokenRegrant(t *testing.T) {
	e := newLocalEnvWith(t, permitRules, func(f *decide.Failover, e *localEnv) {
		f.Health = func() error {
			if e.store.down.Load() {
				return errStoreDown
			}
			return nil
		}
	})
	var tokens []string
	for range 4 {
		o := e.ask(t, "wide", "x")
		if !o.Overall.Allowed || o.Degraded != rules.FailDefault || o.PermitToken == "" {
			t.Fatalf("from the store: %+v %v %q", o.Overall, o.Degraded, o.PermitToken)
		}
		tokens = append(tokens, o.PermitToken)
	}
	e.store.down.Store(true)
	// The node sees the outage: its policy answers (the 4 copies fill
	// its share).
	if o := e.ask(t, "wide", "x"); o.Overall.Allowed || o.Degraded != rules.FailLocal {
		t.Fatalf("during the outage: %+v %v, want the policy's denial", o.Overall, o.Degraded)
	}
	// A holder ends during the outage: the store cannot take the release.
	if o := e.release(t, one("wide", "x"), tokens[3]); o.ReleaseFailed != 1 {
		t.Fatalf("a release with the store down: %+v", o)
	}
	e.store.forget() // restarted empty
	e.store.down.Store(false)
	if o := e.ask(t, "wide", "x"); !o.Overall.Allowed || o.Degraded != rules.FailDefault {
		t.Fatalf("the store back, 3 holders of 4: %+v %v, want one admitted", o.Overall, o.Degraded)
	}
	if o := e.ask(t, "wide", "x"); o.Overall.Allowed {
		t.Fatalf("the store back, 3 holders and a newcomer: %+v, want a denial", o.Overall)
	}
	if n := storeHeld(t, e, "wide", "x"); n != 4 {
		t.Fatalf("the store holds %d, want 4 (3 held again, the newcomer)", n)
	}
	for _, tok := range tokens[:3] {
		if o := e.release(t, one("wide", "x"), tok); o.Released != 1 {
			t.Fatalf("a holder's release after the regrant: released %d stale %d failed %d", o.Released, o.ReleaseStale, o.ReleaseFailed)
		}
	}
	if n := storeHeld(t, e, "wide", "x"); n != 1 {
		t.Fatalf("after the 3 releases the store holds %d, want the newcomer's 1", n)
	}
}
