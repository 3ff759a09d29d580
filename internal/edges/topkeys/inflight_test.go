package topkeys

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/edges/hitters"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

const inFlightRules = `domain: api
descriptors:
  - key: tenant
    concurrency: {max: 4}
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: wide
    concurrency: {max: 2}
    rate_limits:
      - {unit: second, requests_per_unit: 1000}
      - {unit: minute, requests_per_unit: 1000}
      - {unit: hour, requests_per_unit: 1000}
      - {unit: day, requests_per_unit: 1000}
      - {period: 90s, requests_per_unit: 1000}
      - {period: 7m, requests_per_unit: 1000}
`

// counted is a real store whose calls are counted: what InFlight asks of
// the store.
type counted struct {
	*memstore.Store
	calls atomic.Int64
}

func (c *counted) Take(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	c.calls.Add(1)
	return c.Store.Take(ctx, hits, out)
}

func (c *counted) TakeEach(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	c.calls.Add(1)
	return c.Store.TakeEach(ctx, hits, out)
}

// inFlightEnv is a Decider that takes permits (on a memstore) and one that
// reads them through a counter of its store calls, with the same rules.
type inFlightEnv struct {
	acquire, read *decide.Decider
	store         *counted
}

func newInFlightEnv(t *testing.T) *inFlightEnv {
	t.Helper()
	mem := memstore.New(memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { mem.Close() })
	dom, err := rules.Parse("api.yaml", []byte(inFlightRules))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rules.NewConfig(dom)
	if err != nil {
		t.Fatal(err)
	}
	e := &inFlightEnv{store: &counted{Store: mem}}
	if e.acquire, err = decide.New(decide.Config{Limiter: sluice.NewLimiter(mem), Rules: cfg}); err != nil {
		t.Fatal(err)
	}
	if e.read, err = decide.New(decide.Config{Limiter: sluice.NewLimiter(e.store), Rules: cfg}); err != nil {
		t.Fatal(err)
	}
	return e
}

// hold takes n permits of key=value and returns them.
func (e *inFlightEnv) hold(t *testing.T, key, value string, n int) []*sluice.Permit {
	t.Helper()
	var out []*sluice.Permit
	for range n {
		var o decide.Outcome
		err := e.acquire.Decide(context.Background(), &decide.Request{Domain: "api", Descriptors: []rules.Descriptor{{Entries: []rules.Entry{{Key: key, Value: value}}, Cost: 1}}}, &o)
		if err != nil || !o.Overall.Allowed || o.Permit == nil {
			t.Fatalf("%s=%s: %v, allowed %v, permit %v", key, value, err, o.Overall.Allowed, o.Permit)
		}
		out = append(out, o.Permit)
	}
	return out
}

// items lists keys as a top list would.
func items(keys ...string) []hitters.Item {
	var out []hitters.Item
	for _, k := range keys {
		out = append(out, hitters.Item{Key: k, High: 1, Low: 1})
	}
	return out
}

// inFlightOf is each item's in-flight count as "held/max", "-" for none.
func inFlightOf(l []hitters.Item) []string {
	var out []string
	for _, it := range l {
		if it.InFlight == nil {
			out = append(out, "-")
			continue
		}
		out = append(out, fmt.Sprintf("%d/%d", *it.InFlight, it.InFlightMax))
	}
	return out
}

// TestInFlight: the keys of a concurrency rule in top lists get the
// permits each holds now, out of max, read from the store in one call for
// the lists together (a key in two lists read once); a key cut short gets
// none; the keys of a rate-only rule get none and cost no store call.
// After the permits are released, each key holds 0.
func TestInFlight(t *testing.T) {
	ctx := context.Background()
	e := newInFlightEnv(t)
	held := append(e.hold(t, "tenant", "acme", 3), e.hold(t, "tenant", "bob", 1)...)
	reqs := items("tenant=acme", "tenant=bob", "tenant=carol", "tenant="+strings.Repeat("x", 90)+"…")
	reqs[3].Truncated = true
	denials := items("tenant=acme")
	e.store.calls.Store(0)
	InFlight(ctx, e.read, "api.tenant", reqs, denials)
	if got, want := inFlightOf(reqs), []string{"3/4", "1/4", "0/4", "-"}; !slices.Equal(got, want) {
		t.Errorf("requests' in flight %q, want %q", got, want)
	}
	if got, want := inFlightOf(denials), []string{"3/4"}; !slices.Equal(got, want) {
		t.Errorf("denials' in flight %q, want %q", got, want)
	}
	if n := e.store.calls.Load(); n != 1 {
		t.Errorf("%d store calls for 3 keys, want 1", n)
	}

	users := items("user=alice", "user=bob")
	e.store.calls.Store(0)
	InFlight(ctx, e.read, "api.user", users)
	if got := inFlightOf(users); !slices.Equal(got, []string{"-", "-"}) {
		t.Errorf("a rate-only rule's keys in flight: %q", got)
	}
	if n := e.store.calls.Load(); n != 0 {
		t.Errorf("%d store calls for a rate-only rule", n)
	}

	for _, p := range held {
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	reqs = items("tenant=acme", "tenant=bob")
	InFlight(ctx, e.read, "api.tenant", reqs)
	if got := inFlightOf(reqs); !slices.Equal(got, []string{"0/4", "0/4"}) {
		t.Errorf("after the releases: %q", got)
	}
}

// TestInFlightChunks: many keys are read heldChunk at a time; a chunk
// whose limits are over a request's bounds (7 limits a key: 16 keys make
// 112 hits, over sluice.MaxHits) is read in halves; every key gets its
// own count either way.
func TestInFlightChunks(t *testing.T) {
	ctx := context.Background()
	e := newInFlightEnv(t)
	for _, c := range []struct {
		key   string
		n     int
		calls int64
	}{
		{"tenant", 40, 3}, // 16, 16, 8
		{"wide", 16, 2},   // 16 refused before the store, then 8 and 8
	} {
		var keys []string
		for i := range c.n {
			keys = append(keys, fmt.Sprintf("%s=k%d", c.key, i))
		}
		e.hold(t, c.key, "k7", 1)
		e.hold(t, c.key, fmt.Sprintf("k%d", c.n-1), 2)
		l := items(keys...)
		e.store.calls.Store(0)
		InFlight(ctx, e.read, "api."+c.key, l)
		got := inFlightOf(l)
		for i, g := range got {
			want := 0
			switch i {
			case 7:
				want = 1
			case c.n - 1:
				want = 2
			}
			if !strings.HasPrefix(g, fmt.Sprintf("%d/", want)) {
				t.Errorf("%s: %s in flight %q, want %d", c.key, keys[i], g, want)
			}
		}
		if n := e.store.calls.Load(); n != c.calls {
			t.Errorf("%s: %d store calls for %d keys, want %d", c.key, n, c.n, c.calls)
		}
	}
}

// TestDomain: a rule of the domain "edge.api" is in that domain, not in
// "edge", which is a domain too; without the domains, the domain is what
// comes before the first dot.
func TestDomain(t *testing.T) {
	for _, c := range []struct {
		domains []string
		want    string
	}{
		{[]string{"edge", "edge.api", "edge.ap"}, "edge.api"},
		{nil, "edge"},
	} {
		if got := Domain("edge.api.tenant", c.domains); got != c.want {
			t.Errorf("Domain with %q: %q, want %q", c.domains, got, c.want)
		}
	}
}

// TestParseKey: a top key reads back into the entries it was written
// from, whatever bytes their keys and values hold: "/" and "=" (a path,
// a query), "%", and none.
func TestParseKey(t *testing.T) {
	for _, entries := range [][]rules.Entry{
		{{Key: "user", Value: "mallory"}},
		{{Key: "tenant", Value: "acme"}, {Key: "path", Value: "/v1/users"}},
		{{Key: "query", Value: "a=b&c=d"}, {Key: "x=y", Value: "p/q"}},
		{{Key: "discount", Value: "50%"}, {Key: "raw", Value: "%2F%3D"}},
		{{Key: "empty", Value: ""}, {Key: "", Value: "no key"}},
	} {
		if got := ParseKey(string(appendEntries(nil, entries))); !slices.Equal(got, entries) {
			t.Errorf("%q read back as %q, want %q", appendEntries(nil, entries), got, entries)
		}
	}
}
