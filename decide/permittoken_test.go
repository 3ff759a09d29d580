package decide_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
)

// release sends the descriptors descs, the i-th releasing with tokens[i]
// when it is not empty, and returns the outcome.
func (e *localEnv) release(t *testing.T, descs []rules.Descriptor, tokens ...string) *decide.Outcome {
	t.Helper()
	var o decide.Outcome
	if err := e.d.Decide(context.Background(), &decide.Request{Domain: "api", Descriptors: descs, Release: tokens, Token: true}, &o); err != nil {
		t.Fatal(err)
	}
	return &o
}

func one(key, value string) []rules.Descriptor {
	return []rules.Descriptor{{Entries: []rules.Entry{{Key: key, Value: value}}, Cost: 1}}
}

// TestPermitTokenRelease: a request admitted with a permit gets a token
// that names it; a request whose descriptor carries the token (as Envoy
// sends it at stream done) gives the permit back, consumes nothing and is
// OK; the slot is then free. A second release, a token for an expired
// permit, a forged token and a token replayed with other entries release
// nothing another holds.
func TestPermitTokenRelease(t *testing.T) {
	e := newLocalEnv(t, `descriptors:
  - key: k
    concurrency: {max: 2, ttl: 1m}
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: wide
    concurrency: {max: 4, ttl: 1m}
`)
	a, b := e.ask(t, "k", "x"), e.ask(t, "k", "x")
	if !a.Overall.Allowed || !b.Overall.Allowed || a.PermitToken == "" || b.PermitToken == "" || a.PermitToken == b.PermitToken {
		t.Fatalf("two of two slots: %+v %q, %+v %q", a.Overall, a.PermitToken, b.Overall, b.PermitToken)
	}
	if !strings.HasPrefix(a.PermitToken, "s") || len(a.PermitToken) != 1+34 {
		t.Fatalf("token %q: want s and one item of 34 bytes", a.PermitToken)
	}
	if c := e.ask(t, "wide", "x"); c.PermitToken == "" {
		t.Fatal("a rule with a concurrency limit and no rate: no token")
	}
	if c := e.ask(t, "k", "x"); c.Overall.Allowed || c.PermitToken != "" || c.Permit != nil {
		t.Fatalf("at the cap: %+v, token %q", c.Overall, c.PermitToken)
	}

	o := e.release(t, one("k", "x"), a.PermitToken)
	if !o.Overall.Allowed || len(o.Descriptors) != 1 || !o.Descriptors[0].Release || o.Descriptors[0].Limited || o.Released != 1 || o.ReleaseStale+o.ReleaseRefused+o.ReleaseFailed != 0 || o.PermitToken != "" {
		t.Fatalf("release: %+v %+v released %d refused %d failed %d", o.Overall, o.Descriptors, o.Released, o.ReleaseRefused, o.ReleaseFailed)
	}
	if got := ratePeek(t, e, "k", "x"); got != 98 {
		t.Fatalf("the release, or the denial, consumed from the rate: %d left, want 98", got)
	}
	d := e.ask(t, "k", "x")
	if !d.Overall.Allowed || d.PermitToken == "" {
		t.Fatalf("after the release: %+v", d.Overall)
	}
	// Twice: harmless, the slot d took stays taken, and it counts as
	// stale, not released: the store held none of its permits.
	if o := e.release(t, one("k", "x"), a.PermitToken); !o.Overall.Allowed || o.Released != 0 || o.ReleaseStale != 1 {
		t.Fatalf("a second release: %+v released %d stale %d", o.Overall, o.Released, o.ReleaseStale)
	}
	// A forged token, well formed: nothing another holds is released.
	forged := "s" + a.PermitToken[1:9] + strings.Repeat("A", 26)
	if o := e.release(t, one("k", "x"), forged); !o.Overall.Allowed || o.Released != 0 || o.ReleaseStale != 1 {
		t.Fatalf("a forged token: %+v released %d stale %d", o.Overall, o.Released, o.ReleaseStale)
	}
	// The real token of b, replayed with other entries: another key's tag.
	if o := e.release(t, one("k", "y"), b.PermitToken); !o.Overall.Allowed || o.Released != 0 || o.ReleaseRefused != 1 {
		t.Fatalf("a token replayed with other entries: %+v released %d refused %d", o.Overall, o.Released, o.ReleaseRefused)
	}
	if c := e.ask(t, "k", "x"); c.Overall.Allowed {
		t.Fatalf("the slots of b and d, released by forgeries and replays: %+v", c.Overall)
	}
	// Malformed tokens are refused and release nothing.
	for _, bad := range []string{"x", "s", a.PermitToken + "0", strings.ToLower(a.PermitToken), "l0." + a.PermitToken[1:], "l2" + a.PermitToken[1:]} {
		if o := e.release(t, one("k", "x"), bad); !o.Overall.Allowed || o.ReleaseRefused != 1 || o.Released != 0 {
			t.Fatalf("token %q: %+v released %d refused %d", bad, o.Overall, o.Released, o.ReleaseRefused)
		}
	}
	// An expired permit's token: harmless after another took its slot.
	e.now.Add(int64(2 * time.Minute)) // past the ttl of 1m: b and d expired
	f := e.ask(t, "k", "x")
	if !f.Overall.Allowed {
		t.Fatalf("after the ttl: %+v", f.Overall)
	}
	if o := e.release(t, one("k", "x"), b.PermitToken); o.Released != 0 || o.ReleaseStale != 1 {
		t.Fatalf("an expired permit's token: released %d stale %d", o.Released, o.ReleaseStale)
	}
	g := e.ask(t, "k", "x")
	if !g.Overall.Allowed {
		t.Fatalf("the second slot: %+v", g.Overall)
	}
	if h := e.ask(t, "k", "x"); h.Overall.Allowed {
		t.Fatalf("f still holds its slot after b's expired token came back: %+v", h.Overall)
	}
}

// TestPermitTokenMixedRequest: Envoy sends every apply_on_stream_done
// descriptor of a route in one request, a release beside a charge (the
// tokens an LLM answer used): the release gives its permits back, the
// other descriptors are decided as usual, each outcome in its place.
func TestPermitTokenMixedRequest(t *testing.T) {
	e := newLocalEnv(t, permitRules+"  - key: tokens\n    rate_limit: {unit: hour, requests_per_unit: 10}\n")
	a := e.ask(t, "k", "x")
	if a.PermitToken == "" {
		t.Fatal("no token")
	}
	descs := []rules.Descriptor{
		{Entries: []rules.Entry{{Key: "tokens", Value: "x"}}, Cost: 4},
		{Entries: []rules.Entry{{Key: "k", Value: "x"}}, Cost: 1},
		{Entries: []rules.Entry{{Key: "tokens", Value: "x"}}, Cost: 3},
	}
	o := e.release(t, descs, "", a.PermitToken, "")
	if !o.Overall.Allowed || o.Released != 1 || len(o.Descriptors) != 3 {
		t.Fatalf("mixed: %+v released %d, %d outcomes", o.Overall, o.Released, len(o.Descriptors))
	}
	if !o.Descriptors[1].Release || o.Descriptors[0].Release || o.Descriptors[2].Release {
		t.Fatalf("release marks: %+v", o.Descriptors)
	}
	if d := o.Descriptors[2]; !d.Limited || d.Cost != 3 || d.Decision.Remaining != 3 {
		t.Fatalf("the third descriptor's outcome: %+v", d)
	}
	for _, l := range o.Limits {
		if l.Descriptor == 1 {
			t.Fatalf("a limit of the release descriptor: %+v", l)
		}
	}
	if o.Limits[len(o.Limits)-1].Descriptor != 2 {
		t.Fatalf("limits' descriptors: %+v", o.Limits)
	}
	if got := ratePeek(t, e, "tokens", "x"); got != 3 {
		t.Fatalf("the charges: %d left, want 3", got)
	}
	if got := ratePeek(t, e, "k", "x"); got != 2 {
		t.Fatalf("the release charged the rate: %d left, want 2", got)
	}
	// Only release descriptors, one of no other entry: OK, one refused,
	// the other stale (a's permit was released above).
	o = e.release(t, []rules.Descriptor{{Cost: 1}, {Entries: []rules.Entry{{Key: "k", Value: "x"}}}}, a.PermitToken, a.PermitToken)
	if !o.Overall.Allowed || o.ReleaseRefused != 1 || o.ReleaseStale != 1 || o.Released != 0 || len(o.Limits) != 0 {
		t.Fatalf("two release descriptors: %+v refused %d stale %d released %d", o.Overall, o.ReleaseRefused, o.ReleaseStale, o.Released)
	}
	// The token on every descriptor of a request, as sluice proxy
	// --store remote sends it: a descriptor of no concurrency limit (a
	// rate only, no rule) counts in none, a malformed token on one is
	// refused.
	b := e.ask(t, "k", "x")
	descs = append(descs, rules.Descriptor{Entries: []rules.Entry{{Key: "nothing", Value: "x"}}})
	o = e.release(t, descs, b.PermitToken, b.PermitToken, b.PermitToken, b.PermitToken)
	if !o.Overall.Allowed || o.Released != 1 || o.ReleaseRefused+o.ReleaseFailed != 0 || len(o.Limits) != 0 {
		t.Fatalf("the token on every descriptor: %+v released %d refused %d failed %d", o.Overall, o.Released, o.ReleaseRefused, o.ReleaseFailed)
	}
	if got := ratePeek(t, e, "tokens", "x"); got != 3 {
		t.Fatalf("a release charged the tokens: %d left, want 3", got)
	}
	if o = e.release(t, descs[:1], "bad"); o.ReleaseRefused != 1 {
		t.Fatalf("a malformed token on a descriptor of no concurrency limit: refused %d", o.ReleaseRefused)
	}
	// Release and Descriptors must agree; a reservation cannot release.
	var out decide.Outcome
	for _, r := range []decide.Request{
		{Domain: "api", Descriptors: one("k", "x"), Release: []string{"", ""}},
		{Domain: "api", Descriptors: one("k", "x"), Release: []string{a.PermitToken}, Reserve: true},
	} {
		if err := e.d.Decide(context.Background(), &r, &out); !errors.Is(err, sluice.ErrInvalid) {
			t.Fatalf("%+v: %v, want ErrInvalid", r, err)
		}
	}
}

// TestPermitTokenLocalPolicy: a permit the local failure policy holds in
// the node's own store has a token that says so, with the node count of
// its share; its release gives it back there, and the store's token is
// released in the store when it answers again.
func TestPermitTokenLocalPolicy(t *testing.T) {
	e := newLocalEnv(t, permitRules)
	s := e.ask(t, "wide", "x") // in the store, with its copy in the node's
	e.nodes.Store(2)
	e.store.down.Store(true)
	var held []string
	policy := func() *decide.Outcome {
		t.Helper()
		o := e.ask(t, "wide", "x")
		if !o.Overall.Allowed || o.Degraded != rules.FailLocal || !strings.HasPrefix(o.PermitToken, "l2.") {
			t.Fatalf("share of 4 on 2 nodes: %+v %v %q", o.Overall, o.Degraded, o.PermitToken)
		}
		held = append(held, o.PermitToken)
		return o
	}
	policy()
	if o := e.ask(t, "wide", "x"); o.Overall.Allowed {
		t.Fatalf("a second on a node whose share is 2 and that admitted a holder of the store's: %+v", o.Overall)
	}
	// The store's permit cannot be released while the store is down; its
	// holder has ended all the same, and the node's share no longer
	// counts it.
	if o := e.release(t, one("wide", "x"), s.PermitToken); o.ReleaseFailed != 1 || o.ReleaseErr == nil {
		t.Fatalf("a release with the store down: failed %d, %v", o.ReleaseFailed, o.ReleaseErr)
	}
	policy()
	if o := e.ask(t, "wide", "x"); o.Overall.Allowed {
		t.Fatalf("a third on a node whose share is 2: %+v", o.Overall)
	}
	// The node count changed since: the token's own count finds the permit.
	e.nodes.Store(4)
	if o := e.release(t, one("wide", "x"), held[0]); o.Released != 1 {
		t.Fatalf("a local release: %+v", o)
	}
	e.nodes.Store(2)
	if o := e.ask(t, "wide", "x"); !o.Overall.Allowed || o.Degraded != rules.FailLocal {
		t.Fatalf("the local slot given back: %+v", o.Overall)
	}
	e.store.down.Store(false)
	if o := e.release(t, one("wide", "x"), s.PermitToken); o.Released != 1 || o.ReleaseErr != nil {
		t.Fatalf("the store's release: %+v", o)
	}
}

// ask decides key=value as the RLS codec asks, with the permit token.
func (e *localEnv) ask(t *testing.T, key, value string) *decide.Outcome {
	t.Helper()
	var o decide.Outcome
	r := decide.Request{Domain: "api", Descriptors: one(key, value), Token: true}
	if err := e.d.Decide(context.Background(), &r, &o); err != nil {
		t.Fatal(err)
	}
	return &o
}

// TestPermitTokenLocalPolicyHandOver: a token's permits that the local
// policy holds (sluice serve keeps no Permit) are handed to the store when
// it answers again, unless released by token before; a token release
// after the hand-over gives them back in the store.
func TestPermitTokenLocalPolicyHandOver(t *testing.T) {
	e := newLocalEnv(t, permitRules)
	e.store.down.Store(true)
	a, b := e.ask(t, "wide", "z"), e.ask(t, "wide", "z")
	for _, o := range []*decide.Outcome{a, b} {
		if !o.Overall.Allowed || o.Degraded != rules.FailLocal || !strings.HasPrefix(o.PermitToken, "l1.") {
			t.Fatalf("the local policy's: %+v %v %q", o.Overall, o.Degraded, o.PermitToken)
		}
	}
	if o := e.release(t, one("wide", "z"), a.PermitToken); o.Released != 1 {
		t.Fatalf("released by token during the outage: %+v released %d stale %d failed %d", o.Overall, o.Released, o.ReleaseStale, o.ReleaseFailed)
	}
	e.store.down.Store(false)
	if o := e.ask(t, "wide", "z"); !o.Overall.Allowed || o.Degraded != rules.FailDefault {
		t.Fatalf("the store back: %+v %v", o.Overall, o.Degraded)
	}
	// b handed over, a not: with the newcomer, 2.
	if n := storeHeld(t, e, "wide", "z"); n != 2 {
		t.Fatalf("the store holds %d, want 2 (b handed over, the newcomer)", n)
	}
	if o := e.release(t, one("wide", "z"), b.PermitToken); o.Released != 1 || o.ReleaseFailed != 0 {
		t.Fatalf("b released by token after the hand-over: released %d stale %d failed %d %v", o.Released, o.ReleaseStale, o.ReleaseFailed, o.ReleaseErr)
	}
	if n := storeHeld(t, e, "wide", "z"); n != 1 {
		t.Fatalf("after b's release: %d held, want the newcomer's 1", n)
	}
}

// TestPermitTokenLocalPolicyExpired: a token's permit that the local
// policy holds and that expired before the store returned (nothing
// renews a token's permits) is not handed over.
func TestPermitTokenLocalPolicyExpired(t *testing.T) {
	e := newLocalEnv(t, permitRules)
	e.store.down.Store(true)
	if o := e.ask(t, "wide", "z"); !o.Overall.Allowed || o.Degraded != rules.FailLocal {
		t.Fatalf("the local policy's: %+v %v", o.Overall, o.Degraded)
	}
	e.now.Add(int64(61 * time.Second)) // past its ttl of 1m
	e.store.down.Store(false)
	if o := e.ask(t, "wide", "z"); !o.Overall.Allowed || o.Degraded != rules.FailDefault {
		t.Fatalf("the store back: %+v %v", o.Overall, o.Degraded)
	}
	if n := storeHeld(t, e, "wide", "z"); n != 1 {
		t.Fatalf("the store holds %d, want the newcomer's 1 (the expired one not handed over)", n)
	}
}
