package overrides_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/decision/overrides"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

func mustOverride(t testing.TB, domain, path, limit string, expires *time.Time) *overrides.Override {
	t.Helper()
	p, err := overrides.ParsePath(path)
	if err != nil {
		t.Fatal(err)
	}
	o := &overrides.Override{Domain: domain, Path: p, Limit: json.RawMessage(limit), Expires: expires}
	if err := o.Compile(); err != nil {
		t.Fatalf("%s %s %s: %v", domain, path, limit, err)
	}
	return o
}

// TestCompileErrors: every invalid override is refused with the field at
// fault named.
func TestCompileErrors(t *testing.T) {
	for _, c := range []struct {
		o     overrides.Override
		field string
	}{
		{overrides.Override{Path: []overrides.Entry{{"k", "v"}}, Limit: json.RawMessage(`{"unit":"second","requests_per_unit":1}`)}, "domain"},
		{overrides.Override{Domain: "d", Limit: json.RawMessage(`{"unit":"second","requests_per_unit":1}`)}, "path"},
		{overrides.Override{Domain: "d", Path: []overrides.Entry{{"", "v"}}, Limit: json.RawMessage(`{"unit":"second","requests_per_unit":1}`)}, "path[0].key"},
		{overrides.Override{Domain: "d", Path: []overrides.Entry{{"k", "a*b"}}, Limit: json.RawMessage(`{"unit":"second","requests_per_unit":1}`)}, "path[0].value"},
		{overrides.Override{Domain: "d", Path: []overrides.Entry{{"k", strings.Repeat("x", 10<<10)}}, Limit: json.RawMessage(`{"unit":"second","requests_per_unit":1}`)}, "path[0]"},
		{overrides.Override{Domain: "d", Path: []overrides.Entry{{"k", "v"}}}, "limit"},
		{overrides.Override{Domain: "d", Path: []overrides.Entry{{"k", "v"}}, Limit: json.RawMessage(`[1]`)}, "limit"},
		{overrides.Override{Domain: "d", Path: []overrides.Entry{{"k", "v"}}, Limit: json.RawMessage(`{"unit":"fortnight","requests_per_unit":1}`)}, "limit"},
		{overrides.Override{Domain: "d", Path: []overrides.Entry{{"k", "v"}}, Limit: json.RawMessage(`{"unit":"second","requests_per_unit":-5}`)}, "limit"},
		{overrides.Override{Domain: "d", Path: []overrides.Entry{{"k", "v"}}, Limit: json.RawMessage(`{"blocked":false}`)}, "limit.blocked"},
		// What the rules checker only warns of in a rules file.
		{overrides.Override{Domain: "d", Path: []overrides.Entry{{"k", "v"}}, Limit: json.RawMessage(`{"unit":"minute"}`)}, "limit"},
		{overrides.Override{Domain: "d", Path: []overrides.Entry{{"k", "v"}}, Limit: json.RawMessage(`{"unit":"minute","requests_per_unit":5,"burst":3}`)}, "limit"},
		{overrides.Override{Domain: "d", Path: []overrides.Entry{{"k", "v"}}, Limit: json.RawMessage(`{"unlimited":true,"requests_per_unit":3}`)}, "limit"},
	} {
		err := c.o.Compile()
		var fe *overrides.FieldError
		if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%+v: %v, want an error on field %q", c.o, err, c.field)
		}
	}
}

func entries(path string) []rules.Entry {
	var out []rules.Entry
	for part := range strings.SplitSeq(path, "/") {
		k, v, _ := strings.Cut(part, "=")
		out = append(out, rules.Entry{Key: k, Value: v})
	}
	return out
}

// TestPrecedence: the most specific override wins, position by position
// from the left; expired ones are skipped and the next applies; a
// deleted one no longer applies.
func TestPrecedence(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	x := overrides.NewIndex(func() time.Time { return now })
	soon := now.Add(time.Minute)
	lim := `{"unit":"minute","requests_per_unit":1}`
	for _, p := range []string{"tenant=*/user=*", "tenant=acme/user=*", "tenant=a*/user=*", "tenant=acme/user=bob", "tenant=*/user=admin", "tenant=ac*/user=*", "api_key=k_*", "api_key=k_live_*", "api_key=*"} {
		x.Put(mustOverride(t, "api", p, lim, nil))
	}
	x.Put(mustOverride(t, "api", "tenant=acme/user=eve", lim, &soon))
	for _, c := range []struct{ req, want string }{
		{"tenant=acme/user=bob", "tenant=acme/user=bob"},  // all exact
		{"tenant=acme/user=ann", "tenant=acme/user=*"},    // exact tenant beats any prefix
		{"tenant=acorn/user=ann", "tenant=ac*/user=*"},    // longer prefix first
		{"tenant=apex/user=ann", "tenant=a*/user=*"},      // shorter prefix
		{"tenant=zeta/user=admin", "tenant=*/user=admin"}, // left position decides: both * there, then exact admin
		{"tenant=acme/user=admin", "tenant=acme/user=*"},  // exact at the left beats exact at the right
		{"tenant=zeta/user=ann", "tenant=*/user=*"},       // the catch-all
		{"api_key=k_live_123", "api_key=k_live_*"},        // longer prefix
		{"api_key=k_test_1", "api_key=k_*"},               // prefix
		{"api_key=other", "api_key=*"},                    // any
		{"tenant=acme/user=eve", "tenant=acme/user=eve"},  // exact, until it expires
		{"tenant=acme", ""},                               // no override of depth 1 for tenant
		{"tenant=acme/user=bob/extra=1", ""},              // nor of depth 3
	} {
		got := ""
		if o := x.Lookup("api", entries(c.req)); o != nil {
			got = overrides.PathString(o.Path)
		}
		if got != c.want {
			t.Errorf("%s: override %q, want %q", c.req, got, c.want)
		}
	}
	if o := x.Lookup("other", entries("api_key=k_1")); o != nil {
		t.Errorf("another domain matched %v", o.Path)
	}
	now = soon
	if o := x.Lookup("api", entries("tenant=acme/user=eve")); o == nil || overrides.PathString(o.Path) != "tenant=acme/user=*" {
		t.Errorf("expired exact override: got %v, want the next most specific, tenant=acme/user=*", o)
	}
	x.Delete("api", []overrides.Entry{{"tenant", "acme"}, {"user", "*"}})
	if o := x.Lookup("api", entries("tenant=acme/user=ann")); o == nil || overrides.PathString(o.Path) != "tenant=ac*/user=*" {
		t.Errorf("after deleting tenant=acme/user=*: got %v, want tenant=ac*/user=*", o)
	}
}

// TestDecisions: overrides take part in decisions through the decision
// core: an override beats the rules file, one may limit a descriptor no
// rule covers, unlimited and blocked do what they say, and a request's own
// limit (Envoy's per-descriptor limit) still wins.
func TestDecisions(t *testing.T) {
	cfg := rulestest.Config(t, `
domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 5}
`)
	store := memstore.New(memstore.Config{SweepInterval: -1})
	defer store.Close()
	x := overrides.NewIndex(nil)
	d, err := decide.New(decide.Config{Limiter: sluice.NewLimiter(store), Rules: cfg, Runtime: x})
	if err != nil {
		t.Fatal(err)
	}
	x.Put(mustOverride(t, "api", "tenant=acme", `{"unit":"hour","requests_per_unit":2}`, nil))
	x.Put(mustOverride(t, "api", "tenant=vip", `{"unlimited":true}`, nil))
	x.Put(mustOverride(t, "api", "tenant=bad", `{"blocked":true}`, nil))
	x.Put(mustOverride(t, "api", "plan=gold", `{"unit":"hour","requests_per_unit":3}`, nil))
	admitted := func(path string, n int, own *rules.Override) (int, decide.DescriptorOutcome) {
		var o decide.Outcome
		got := 0
		for range n {
			if err := d.Decide(context.Background(), &decide.Request{Domain: "api", Descriptors: []rules.Descriptor{{Entries: entries(path), Cost: 1, Override: own}}}, &o); err != nil {
				t.Fatal(err)
			}
			if o.Overall.Allowed {
				got++
			}
		}
		return got, o.Descriptors[0]
	}
	for _, c := range []struct {
		path string
		want int
	}{{"tenant=acme", 2}, {"tenant=other", 5}, {"tenant=vip", 20}, {"tenant=bad", 0}, {"plan=gold", 3}, {"plan=silver", 20}} {
		if got, do := admitted(c.path, 20, nil); got != c.want {
			t.Errorf("%s: %d of 20 admitted, want %d (%+v)", c.path, got, c.want, do)
		}
	}
	if got, _ := admitted("tenant=acme", 4, &rules.Override{RequestsPerUnit: 100, Unit: rules.Hour}); got != 4 {
		t.Errorf("tenant=acme with its own limit from Envoy: %d of 4 admitted, want 4 (the request's limit wins)", got)
	}
	// The stats stay the rule's where a rule matched; the outcome names
	// the override whose limits applied, and only then.
	if _, do := admitted("tenant=acme", 1, nil); do.StatKey != "api.tenant" || do.Rule == nil || do.Override != "api|tenant=acme" {
		t.Errorf("tenant=acme: stat key %q, rule %v, override %q; want the rule's api.tenant and api|tenant=acme", do.StatKey, do.Rule, do.Override)
	}
	if _, do := admitted("tenant=other", 1, nil); do.Override != "" {
		t.Errorf("tenant=other, under the rules: override %q", do.Override)
	}
	// Explain names an override's limit by the override, not by the
	// compiled limit it shares with every override of the same JSON.
	e, err := d.Explain(context.Background(), "api", []rules.Descriptor{{Entries: entries("tenant=acme"), Cost: 1}, {Entries: entries("tenant=other"), Cost: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if ls := e.Descriptors[0].Limits; len(ls) != 1 || ls[0].Name != "api|tenant=acme" || e.Descriptors[0].Override != "api|tenant=acme" {
		t.Errorf("explain tenant=acme: override %q, limits %+v; want both named api|tenant=acme", e.Descriptors[0].Override, ls)
	}
	if ls := e.Descriptors[1].Limits; len(ls) != 1 || ls[0].Name != "api.tenant" {
		t.Errorf("explain tenant=other: limits %+v, want the rule's api.tenant", ls)
	}
}

// BenchmarkLookup: a million exact overrides and a few wildcards; a
// lookup that finds an exact one, one that falls to a wildcard, and one
// that finds nothing. Reports the heap per override.
func BenchmarkLookup(b *testing.B) {
	const n = 1_000_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	x := overrides.NewIndex(nil)
	start := time.Now() // what loading a million overrides takes: compiling and indexing them
	for i := range n {
		x.Put(mustOverride(b, "api", fmt.Sprintf("tenant=t%d", i), `{"unit":"minute","requests_per_unit":100}`, nil))
	}
	load := time.Since(start)
	runtime.GC()
	runtime.ReadMemStats(&after)
	x.Put(mustOverride(b, "api", "tenant=t*/user=*", `{"unit":"minute","requests_per_unit":100}`, nil))
	x.Put(mustOverride(b, "api", "api_key=k_*", `{"unit":"minute","requests_per_unit":100}`, nil))
	perOverride := float64(after.HeapAlloc-before.HeapAlloc) / n
	for _, c := range []struct {
		name string
		e    []rules.Entry
		hit  bool
	}{
		{"exact", entries("tenant=t777777"), true},
		{"wildcard", entries("tenant=t1/user=u"), true},
		{"none", entries("region=eu"), false},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if (x.Lookup("api", c.e) != nil) != c.hit {
					b.Fatal("wrong answer")
				}
			}
			b.ReportMetric(perOverride, "heapB/override")
			b.ReportMetric(load.Seconds(), "load-s")
		})
	}
}

// BenchmarkLookupEmpty: a node with no overrides at all, what every
// decision pays for the hook when nobody has set one.
func BenchmarkLookupEmpty(b *testing.B) {
	x := overrides.NewIndex(nil)
	e := entries("tenant=acme")
	b.ReportAllocs()
	for b.Loop() {
		if x.Lookup("api", e) != nil {
			b.Fatal("found an override in an empty index")
		}
	}
}

// TestLookupAllocs: a lookup allocates nothing, nor does Match, what a
// decision calls (it reports the override's ID).
func TestLookupAllocs(t *testing.T) {
	x := overrides.NewIndex(nil)
	x.Put(mustOverride(t, "api", "tenant=acme", `{"unit":"minute","requests_per_unit":100}`, nil))
	x.Put(mustOverride(t, "api", "tenant=a*/user=*", `{"unit":"minute","requests_per_unit":100}`, nil))
	for _, e := range [][]rules.Entry{entries("tenant=acme"), entries("tenant=ab/user=x"), entries("tenant=none")} {
		if n := testing.AllocsPerRun(1000, func() { x.Lookup("api", e) }); n != 0 {
			t.Errorf("%v: %v allocations a lookup, want 0", e, n)
		}
		if n := testing.AllocsPerRun(1000, func() { x.Match("api", e) }); n != 0 {
			t.Errorf("%v: %v allocations a match, want 0", e, n)
		}
	}
}
