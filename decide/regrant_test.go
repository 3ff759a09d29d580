package decide_test

import (
	"strconv"
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

// TestPermitTokenGrantsBounded: the token Permits a node records to hold
// again are at most maxLedger, whatever the tokens never released: past
// it they are counted, not kept, and a token's release still works. (The
// copies mirror stops making at the same count are not checked here.)
func TestPermitTokenGrantsBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("70,000 decisions")
	}
	e := newLocalEnvWith(t, permitRules, func(f *decide.Failover, e *localEnv) {
		f.Health = func() error { return nil }
	})
	_, _, most := decide.TokenGrants(e.d)
	var last string
	for i := range most + 4000 {
		o := e.ask(t, "wide", strconv.Itoa(i))
		if !o.Overall.Allowed || o.PermitToken == "" {
			t.Fatalf("request %d: %+v", i, o.Overall)
		}
		last = o.PermitToken
	}
	live, dropped, _ := decide.TokenGrants(e.d)
	if live > int64(most) || dropped == 0 {
		t.Fatalf("%d recorded, %d not, want at most %d recorded and the rest counted", live, dropped, most)
	}
	if o := e.release(t, one("wide", strconv.Itoa(most+3999)), last); o.Released != 1 {
		t.Fatalf("the last token's release: %+v", o)
	}
}
