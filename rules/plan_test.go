package rules_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/rules"
)

// desc builds a descriptor from "k=v" pairs, cost 1.
func desc(kvs ...string) rules.Descriptor {
	d := rules.Descriptor{Cost: 1}
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		d.Entries = append(d.Entries, rules.Entry{Key: k, Value: v})
	}
	return d
}

func plan(t *testing.T, c *rules.Config, domain string, ds ...rules.Descriptor) *rules.Plan {
	t.Helper()
	var p rules.Plan
	if err := c.Plan(domain, ds, &p); err != nil {
		t.Fatalf("Plan: %v", err)
	}
	return &p
}

// matched returns the stats key of the rule the single descriptor matched,
// or its status when it matched none.
func matched(t *testing.T, c *rules.Config, domain string, d rules.Descriptor) string {
	t.Helper()
	p := plan(t, c, domain, d)
	m := p.Matches[0]
	if m.Rule == nil {
		return m.Status.String()
	}
	return m.Rule.StatKey
}

// A request (one descriptor, as "k=v" entries) and what it should give.
type reqCase struct {
	entries []string
	want    string
}

// checkMatches checks the rule each request reaches (its stats key, or the
// status when it reaches none).
func checkMatches(t *testing.T, c *rules.Config, domain string, cases []reqCase) {
	t.Helper()
	for _, tc := range cases {
		if got := matched(t, c, domain, desc(tc.entries...)); got != tc.want {
			t.Errorf("%v matched %s, want %s", tc.entries, got, tc.want)
		}
	}
}

// checkStatKeys checks the stats key each request reports.
func checkStatKeys(t *testing.T, c *rules.Config, domain string, cases []reqCase) {
	t.Helper()
	for _, tc := range cases {
		p := plan(t, c, domain, desc(tc.entries...))
		if got := p.Matches[0].StatKey; got != tc.want {
			t.Errorf("%v: stat key %q, want %q", tc.entries, got, tc.want)
		}
	}
}

// hitKey returns the counter key of a request that matches one limit.
func hitKey(t *testing.T, c *rules.Config, domain string, entries ...string) string {
	t.Helper()
	p := plan(t, c, domain, desc(entries...))
	if len(p.Hits) != 1 {
		t.Fatalf("%v: %d hits", entries, len(p.Hits))
	}
	return p.Hits[0].Key
}

// checkDistinct checks that no two of the requests share a counter.
func checkDistinct(t *testing.T, c *rules.Config, domain string, reqs [][]string) {
	t.Helper()
	seen := map[string][]string{}
	for _, e := range reqs {
		k := hitKey(t, c, domain, e...)
		if prev, dup := seen[k]; dup {
			t.Errorf("%v and %v share key %q", e, prev, k)
		}
		seen[k] = e
	}
}

const matching = `
domain: m
descriptors:
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: ip
    value: 10.0.0.1
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: ip
    value: 10.0.*
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: ip
    value: 10.*
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: path
    value: /api/*
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    descriptors:
      - key: user
        value: admin
        rate_limit: {unlimited: true}
  - key: any
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
  - key: key
    value: value
    rate_limit: {unit: second, requests_per_unit: 300}
  - key: outer
    descriptors:
      - key: subkey
        rate_limit: {unit: second, requests_per_unit: 300}
  - key: odd*
    rate_limit: {unit: second, requests_per_unit: 7}
`

// Envoy's lookup at each level: exact key and value, then wildcards in file
// order (the first prefix that matches, not the longest), then the
// value-less rule; the rule of the last entry applies, with no
// backtracking.
func TestMatching(t *testing.T) {
	checkMatches(t, rulestest.Config(t, matching), "m", []reqCase{
		{[]string{"ip=1.2.3.4"}, "m.ip"},
		{[]string{"ip=10.0.0.1"}, "m.ip_10.0.0.1"},
		{[]string{"ip=10.0.0.2"}, "m.ip_10.0.*"},
		{[]string{"ip=10.0.1.1"}, "m.ip_10.0.*"},
		{[]string{"ip=10.9.9.9"}, "m.ip_10.*"},
		{[]string{"ip=10.0.*"}, "m.ip_10.0.*"}, // a literal value equal to a wildcard matches it exactly
		{[]string{"ip="}, "m.ip"},
		{[]string{"path=/api/v1", "user=bob"}, "m.path_/api/*.user"},
		{[]string{"path=/api/v1", "user=admin"}, "m.path_/api/*.user"}, // no backtracking to the value-less path
		{[]string{"path=/web", "user=admin"}, "m.path.user_admin"},
		{[]string{"path=/web", "user=bob"}, "no_match"},
		{[]string{"path=/web"}, "no_match"}, // the rule reached has no rate_limit
		{[]string{"any=x"}, "m.any_*"},
		{[]string{"any="}, "m.any_*"}, // "*" matches the empty value too
		{[]string{"message_type=marketing", "to_number=2061111111"}, "m.message_type_marketing.to_number"},
		{[]string{"to_number=2061111111"}, "m.to_number"},
		{[]string{"message_type=other", "to_number=2061111111"}, "no_match"},
		{[]string{"key=value"}, "m.key_value"},
		{[]string{"key=value", "subkey=subvalue"}, "no_match"}, // Example 4: depth must match
		{[]string{"outer=value", "subkey=subvalue"}, "m.outer.subkey"},
		{[]string{"outer=value"}, "no_match"},
		{[]string{"ip=1.2.3.4", "extra=1"}, "no_match"},
		{[]string{"nothing=here"}, "no_match"},
		{[]string{"oddity=x"}, "m.odd*"}, // a trailing '*' on a value-less key is a key prefix, as in Envoy
	})
}

func TestUnknownDomain(t *testing.T) {
	c := rulestest.Config(t, matching)
	p := plan(t, c, "nope", desc("ip=1.2.3.4"), desc("to_number=1"))
	if p.Domain != nil || len(p.Hits) != 0 || len(p.Matches) != 2 || p.Capacity != -1 {
		t.Fatalf("plan %+v", p)
	}
	for _, m := range p.Matches {
		if m.Status != rules.NoMatch || m.StatKey != "" {
			t.Errorf("match %+v", m)
		}
	}
}

// Value-less and wildcard rules count each request value apart; exact rules
// and shared wildcards count together.
func TestCounters(t *testing.T) {
	c := rulestest.Config(t, matching+`
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 100}
`)
	key := func(entries ...string) string { return hitKey(t, c, "m", entries...) }
	checkDistinct(t, c, "m", [][]string{
		{"ip=1.2.3.4"}, {"ip=1.2.3.5"}, {"ip=10.0.0.2"}, {"ip=10.0.0.3"}, {"ip=10.9.0.1"},
		{"to_number=1"}, {"to_number=2"},
		{"message_type=marketing", "to_number=1"}, {"message_type=marketing", "to_number=2"},
		{"files=files/a.pdf"}, {"any=x"}, {"any=y"},
	})
	if a, b := key("ip=1.2.3.4"), key("ip=1.2.3.4"); a != b {
		t.Errorf("same request, different keys %q and %q", a, b)
	}
	if a, b := key("files=files/a.pdf"), key("files=files/b.csv"); a != b {
		t.Errorf("share_threshold: %q != %q", a, b)
	}
	if a, b := key("files=files/a.pdf"), key("files=files/*"); a == b {
		t.Errorf("a shared wildcard and the literal value share key %q", a)
	}
}

// No value, however it uses separators, makes two descriptors share a key.
func TestKeyCollisions(t *testing.T) {
	c := rulestest.Config(t, `
domain: "d"
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: a_b
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: x
    value: "*"
    descriptors:
      - key: "y"
        rate_limit: {unit: second, requests_per_unit: 1}
`, `
domain: "d1"
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
`)
	type req struct {
		domain  string
		entries []string
	}
	reqs := []req{
		{"d", []string{"a=1:v"}}, {"d", []string{"a=1"}}, {"d", []string{"a=1:v1:x"}},
		{"d", []string{"a=b_c"}}, {"d", []string{"a_b=c"}},
		{"d", []string{"x=1", "y=2"}}, {"d", []string{"x=12", "y="}}, {"d", []string{"x=1", "y=2v"}},
		{"d", []string{"x=1v", "y=2"}}, {"d", []string{"x=", "y=12"}},
		{"d", []string{"x=1v2:y", "y=3"}}, {"d", []string{"x=1v2", "y=y3"}},
		{"d1", []string{"a=1"}}, {"d", []string{"a=d1"}},
	}
	seen := map[string]req{}
	for _, r := range reqs {
		p := plan(t, c, r.domain, desc(r.entries...))
		if len(p.Hits) != 1 {
			t.Fatalf("%v: %d hits", r, len(p.Hits))
		}
		k := p.Hits[0].Key
		if prev, dup := seen[k]; dup {
			t.Errorf("%v and %v share key %q", r, prev, k)
		}
		seen[k] = r
	}
}

// Limits of one rule, and rules of one request, have distinct keys.
func TestMultipleLimits(t *testing.T) {
	c := rulestest.Config(t, `
domain: api
descriptors:
  - key: post
    rate_limits:
      - {unit: second, requests_per_unit: 1}
      - {unit: day, requests_per_unit: 150}
      - {unit: second, requests_per_unit: 5, algorithm: gcra}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
`)
	p := plan(t, c, "api", desc("post=x"), desc("user=u"), desc("none=1"))
	if len(p.Hits) != 4 {
		t.Fatalf("%d hits", len(p.Hits))
	}
	m := p.Matches
	if m[0].Status != rules.Limited || m[0].First != 0 || m[0].Count != 3 || m[1].First != 3 || m[1].Count != 1 || m[2].Status != rules.NoMatch || m[2].Count != 0 {
		t.Errorf("matches %+v", m)
	}
	keys := map[string]bool{}
	for _, h := range p.Hits {
		keys[h.Key] = true
		if h.Cost != 1 {
			t.Errorf("cost %d", h.Cost)
		}
	}
	if len(keys) != 4 {
		t.Errorf("keys not distinct: %v", keys)
	}
	if p.Hits[1].Limit.Period != 24*time.Hour || p.Hits[2].Limit.Algorithm != sluice.GCRA {
		t.Errorf("hit order: %+v", p.Hits)
	}
	if err := validHits(p.Hits); err != nil {
		t.Error(err)
	}
}

// Example 7 of Envoy's README, and unlimited rules replacing too.
func TestReplaces(t *testing.T) {
	c := rulestest.Config(t, example7+`
  - key: vip
    rate_limit:
      unlimited: true
      replaces: [{name: specific_limit}]
`)
	d1 := desc("key_1=value_1", "user=bkthomps")
	d2 := desc("key_2=value_2", "user=bkthomps")

	p := plan(t, c, "example7", d1)
	if len(p.Hits) != 1 || p.Hits[0].Limit.Rate != 5 {
		t.Errorf("alone: %+v", p.Hits)
	}
	p = plan(t, c, "example7", d1, d2)
	if len(p.Hits) != 1 || p.Hits[0].Limit.Rate != 10 || p.Matches[0].Status != rules.Replaced || p.Matches[0].Count != 0 || p.Matches[1].First != 0 {
		t.Errorf("both: hits %+v matches %+v", p.Hits, p.Matches)
	}
	if p.Matches[0].StatKey != "example7.key_1_value_1.user_bkthomps" {
		t.Errorf("replaced stat key %q", p.Matches[0].StatKey)
	}
	p = plan(t, c, "example7", desc("vip=1"), d1)
	if len(p.Hits) != 0 || p.Matches[0].Status != rules.Unlimited || p.Matches[1].Status != rules.Replaced {
		t.Errorf("unlimited replacing: %+v", p.Matches)
	}
}

func TestShadowAndUnlimited(t *testing.T) {
	c := rulestest.Config(t, `
domain: s
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        shadow_mode: true
        rate_limit: {requests_per_unit: 10, unit: second}
  - key: ldap
    rate_limit: {unlimited: true}
`)
	p := plan(t, c, "s", desc("service=auth", "user=user-a"), desc("ldap=x"))
	if len(p.Hits) != 1 || !p.Hits[0].Limit.Shadow || p.Matches[0].Rule.ShadowMode != true {
		t.Errorf("shadow: %+v", p.Hits)
	}
	if m := p.Matches[1]; m.Status != rules.Unlimited || m.Count != 0 || m.StatKey != "s.ldap" {
		t.Errorf("unlimited: %+v", m)
	}
}

// The domain capacity is one hit per request, whatever matched, with the
// largest cost of the request.
func TestCapacity(t *testing.T) {
	c := rulestest.Config(t, `
domain: api
capacity: {unit: second, requests_per_unit: 5000}
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100, elastic_ceiling: 200}
`)
	a, b := desc("user=u"), desc("other=x")
	a.Cost, b.Cost = 3, 7
	p := plan(t, c, "api", a, b)
	if len(p.Hits) != 2 || p.Capacity != 1 {
		t.Fatalf("hits %+v capacity %d", p.Hits, p.Capacity)
	}
	h := p.Hits[p.Capacity]
	if h.Limit.Rate != 5000 || h.Cost != 7 || h.Key == p.Hits[0].Key {
		t.Errorf("capacity hit %+v", h)
	}
	p = plan(t, c, "api", desc("other=x"))
	if len(p.Hits) != 1 || p.Capacity != 0 {
		t.Errorf("unmatched request: %+v", p.Hits)
	}
	if err := validHits(p.Hits); err != nil {
		t.Error(err)
	}
}

// Envoy's per-descriptor limit override: a fixed window on its own key,
// ignoring the rules; overrides of the same rate share a compiled limit.
func TestOverride(t *testing.T) {
	c := rulestest.Config(t, matching)
	d := desc("ip=10.0.0.1", "x=y")
	d.Override = &rules.Override{RequestsPerUnit: 42, Unit: rules.Minute}
	p := plan(t, c, "m", d)
	if len(p.Hits) != 1 || p.Matches[0].Status != rules.Overridden || p.Matches[0].Rule != nil {
		t.Fatalf("plan %+v", p)
	}
	l := p.Hits[0].Limit
	if l.Rate != 42 || l.Period != time.Minute || l.Algorithm != sluice.FixedWindow || l.Shadow {
		t.Errorf("limit %+v", l)
	}
	if p.Matches[0].StatKey != "m.ip_10.0.0.1.x_y" {
		t.Errorf("stat key %q", p.Matches[0].StatKey)
	}
	plain := plan(t, c, "m", desc("ip=10.0.0.1"))
	if plain.Hits[0].Key == p.Hits[0].Key {
		t.Error("override and rule share a key")
	}
	d2 := desc("ip=10.0.0.2")
	d2.Override = &rules.Override{RequestsPerUnit: 42, Unit: rules.Second, UnitMultiplier: 60}
	p2 := plan(t, c, "m", d2)
	if p2.Hits[0].Limit != l {
		t.Error("equal overrides compiled twice")
	}
	if p2.Hits[0].Key == p.Hits[0].Key {
		t.Error("overrides of different entries share a key")
	}
}

const statKeysConfig = `
domain: st
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: key1
    value: value1
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: wildv
    value: foo*
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: files
    value: files/*
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: sharedd
    value: s*
    share_threshold: true
    descriptors:
      - key: user
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 20}
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: user_id
            rate_limit: {unit: minute, requests_per_unit: 60}
  - key: nested
    descriptors:
      - key: user
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: odd*
    rate_limit: {unit: second, requests_per_unit: 7}
`

// Stats keys exactly as envoyproxy/ratelimit names them.
func TestStatKeys(t *testing.T) {
	checkStatKeys(t, rulestest.Config(t, statKeysConfig), "st", []reqCase{
		{[]string{"key1=unspecified_value"}, "st.key1_unspecified_value"},
		{[]string{"key1=value1"}, "st.key1_value1"},
		{[]string{"key1="}, "st.key1_"},
		{[]string{"wild=foo1"}, "st.wild_foo*"},
		{[]string{"wildv=foo1"}, "st.wildv_foo1"},
		{[]string{"files=files/a.pdf"}, "st.files_files/*"},
		{[]string{"sharedd=s1", "user=bob"}, "st.sharedd_s*.user_bob"},
		{[]string{"route=/a", "http_method=GET", "user_id=7"}, "st.route_/a.http_method_GET.user_id"},
		{[]string{"nested=n", "user=bob"}, "st.nested_n.user_bob"},
		{[]string{"oddity=x"}, "st.oddity_odd*"},
	})
}

func TestBadRequests(t *testing.T) {
	c := rulestest.Config(t, matching)
	long := strings.Repeat("x", rules.MaxEntryLen+1)
	var many []string
	for range 40 {
		many = append(many, "k="+strings.Repeat("v", 200))
	}
	for _, tc := range []struct {
		name   string
		domain string
		descs  []rules.Descriptor
		want   string
	}{
		{"empty domain", "", []rules.Descriptor{desc("a=b")}, "domain must not be empty"},
		{"no descriptors", "m", nil, "descriptor list must not be empty"},
		{"no entries", "m", []rules.Descriptor{{Cost: 1}}, "descriptor 0 has no entries"},
		{"empty key", "m", []rules.Descriptor{desc("a=b", "=c")}, "descriptor 0 entry 1 has an empty key"},
		{"long key", "m", []rules.Descriptor{desc(long + "=v")}, "longer than 1024 bytes"},
		{"long value", "m", []rules.Descriptor{desc("ip=" + long)}, "longer than 1024 bytes"},
		{"negative cost", "m", []rules.Descriptor{{Entries: []rules.Entry{{Key: "a"}}, Cost: -1}}, "cost -1 out of range"},
		{"unknown override unit", "m", []rules.Descriptor{{Entries: []rules.Entry{{Key: "a"}}, Override: &rules.Override{RequestsPerUnit: 1}}}, "limit override has unit unknown"},
		{"override too long", "m", []rules.Descriptor{{Entries: []rules.Entry{{Key: "a"}}, Override: &rules.Override{RequestsPerUnit: 1, Unit: rules.Year, UnitMultiplier: 1000}}}, "too long"},
		{"key too long", "m", []rules.Descriptor{desc("a=b"), {Entries: desc(many...).Entries, Override: &rules.Override{RequestsPerUnit: 1, Unit: rules.Second}}}, "counter key of"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p rules.Plan
			err := c.Plan(tc.domain, tc.descs, &p)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, sluice.ErrInvalid) {
				t.Errorf("err = %v, want %q wrapping ErrInvalid", err, tc.want)
			}
		})
	}
}

func TestTooManyHits(t *testing.T) {
	c := rulestest.Config(t, matching)
	var ds []rules.Descriptor
	for range sluice.MaxHits + 1 {
		ds = append(ds, desc("ip=1.1.1.1"))
	}
	var p rules.Plan
	if err := c.Plan("m", ds, &p); err == nil || !errors.Is(err, sluice.ErrInvalid) {
		t.Errorf("err = %v", err)
	}
}

// A reused Plan allocates only the one string holding the request's keys,
// wildcards anywhere in values included (long values against many-starred
// patterns too).
func TestPlanAllocs(t *testing.T) {
	long := strings.Repeat("a", rules.MaxEntryLen)
	for _, tc := range []struct {
		c      *rules.Config
		domain string
		ds     []rules.Descriptor
		want   []string // the rules matched
	}{
		{rulestest.Config(t, matching), "m",
			[]rules.Descriptor{desc("ip=1.2.3.4"), desc("message_type=marketing", "to_number=1"), desc("path=/api/x", "user=u")},
			[]string{"m.ip", "m.message_type_marketing.to_number", "m.path_/api/*.user"}},
		{rulestest.Config(t, globs), "g",
			[]rules.Descriptor{desc("glob=" + long), desc("host=" + long), desc("route=/v"+long[3:], "user=u"), desc("tenant="+long[5:]+"-prod", "user=u")},
			[]string{"nothing", "g.host", "g.route_/v*.user", "g.tenant_*-prod.user"}},
	} {
		var p rules.Plan
		allocs := testing.AllocsPerRun(100, func() {
			if err := tc.c.Plan(tc.domain, tc.ds, &p); err != nil {
				t.Fatal(err)
			}
		})
		if allocs > 1 {
			t.Errorf("%s: %v allocations per Plan, want at most 1", tc.domain, allocs)
		}
		for i, m := range p.Matches {
			if got := name(m.Rule); got != tc.want[i] {
				t.Errorf("%s: descriptor %d matched %s, want %s", tc.domain, i, got, tc.want[i])
			}
		}
	}
}

func BenchmarkPlan(b *testing.B) {
	c := rulestest.Config(b, matching)
	ds := []rules.Descriptor{desc("ip=1.2.3.4"), desc("message_type=marketing", "to_number=1"), desc("path=/api/x", "user=u")}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var p rules.Plan
		for pb.Next() {
			if err := c.Plan("m", ds, &p); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// Wildcards anywhere in a value: each '*' matches any run of characters.
const globs = `
domain: g
descriptors:
  - key: host
    value: api.*.example.com
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: host
    value: "*.example.com"
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: host
    value: www.example.com
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: host
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: route
    value: /v*/users/*/posts
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: route
    value: /v*
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 6}
  - key: route
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 7}
  - key: glob
    value: a*a*a*a*b
    rate_limit: {unit: second, requests_per_unit: 8}
  - key: stars
    value: x**y
    rate_limit: {unit: second, requests_per_unit: 9}
  - key: meta
    value: 'a.b+(c)?[d]{2}^$|\*'
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: k*
    value: v*w
    rate_limit: {unit: second, requests_per_unit: 11}
  - key: shared
    value: img-*.png
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 12}
  - key: tenant
    value: "*-prod"
    share_threshold: true
    descriptors:
      - key: user
        detailed_metric: true
        rate_limit: {unit: second, requests_per_unit: 13}
  - key: tenant
    value: "*-dev*"
    value_to_metric: true
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 14}
`

// Exact first, then wildcards in file order (the first that matches, not
// the most specific), then the value-less rule.
func TestInfixWildcards(t *testing.T) {
	checkMatches(t, rulestest.Config(t, globs), "g", []reqCase{
		{[]string{"host=www.example.com"}, "g.host_www.example.com"}, // exact beats the earlier wildcards
		{[]string{"host=api.v1.example.com"}, "g.host_api.*.example.com"},
		{[]string{"host=api..example.com"}, "g.host_api.*.example.com"}, // '*' matches the empty run
		{[]string{"host=api.example.com"}, "g.host_*.example.com"},      // "api." and ".example.com" would overlap
		{[]string{"host=cdn.example.com"}, "g.host_*.example.com"},
		{[]string{"host=.example.com"}, "g.host_*.example.com"},
		{[]string{"host=*.example.com"}, "g.host_*.example.com"}, // the literal value, matched exactly
		{[]string{"host=example.com"}, "g.host"},
		{[]string{"host=a.example.com.evil"}, "g.host"},
		{[]string{"route=/v1/users/42/posts"}, "g.route_/v*/users/*/posts"},
		{[]string{"route=/v/users//posts"}, "g.route_/v*/users/*/posts"},
		{[]string{"route=/v1/users/42/posts", "user=u"}, "no_match"}, // that rule has no nested descriptors
		{[]string{"route=/v1/users/42/comments", "user=u"}, "g.route_/v*.user"},
		{[]string{"route=/v1/users/42/comments"}, "no_match"}, // the rule reached has no rate_limit
		{[]string{"route=/x", "user=u"}, "g.route.user"},
		{[]string{"glob=aaaab"}, "g.glob_a*a*a*a*b"},
		{[]string{"glob=a-a-a-a-b"}, "g.glob_a*a*a*a*b"},
		{[]string{"glob=aaab"}, "no_match"},
		{[]string{"stars=xy"}, "g.stars_x**y"},
		{[]string{"stars=x*y"}, "g.stars_x**y"},
		{[]string{"stars=yx"}, "no_match"},
		{[]string{`meta=a.b+(c)?[d]{2}^$|\`}, `g.meta_a.b+(c)?[d]{2}^$|\*`},
		{[]string{`meta=a.b+(c)?[d]{2}^$|\anything`}, `g.meta_a.b+(c)?[d]{2}^$|\*`},
		{[]string{`meta=aXb+(c)?[d]{2}^$|\`}, "no_match"},  // '.' is literal
		{[]string{`meta=a.bb+(c)?[d]{2}^$|\`}, "no_match"}, // '+' too
		{[]string{"k*=vXw"}, "g.k*_v*w"},
		{[]string{"kk=vXw"}, "g.k*_v*w"}, // a key's '*' is a wildcard too, as in Envoy
		{[]string{"shared=img-1.png"}, "g.shared_img-*.png"},
		{[]string{"tenant=acme-prod", "user=bob"}, "g.tenant_*-prod.user"},
		{[]string{"tenant=acme-dev-2", "user=bob"}, "g.tenant_*-dev*.user"},
		{[]string{"tenant=acme-qa", "user=bob"}, "no_match"},
	})
}

// Stats keys and counters of infix wildcards follow those of trailing ones:
// the pattern in the stats key, one counter per request value unless
// share_threshold.
func TestInfixWildcardKeys(t *testing.T) {
	c := rulestest.Config(t, globs)
	checkStatKeys(t, c, "g", []reqCase{
		{[]string{"host=cdn.example.com"}, "g.host_*.example.com"},
		{[]string{"shared=img-1.png"}, "g.shared_img-*.png"},
		{[]string{"tenant=acme-prod", "user=bob"}, "g.tenant_*-prod.user_bob"},
		{[]string{"tenant=acme-dev-2", "user=bob"}, "g.tenant_acme-dev-2.user"},
	})
	checkDistinct(t, c, "g", [][]string{
		{"host=a.example.com"}, {"host=b.example.com"}, {"host=api.a.example.com"}, {"host=api.b.example.com"},
		{"route=/v1/users/1/posts"}, {"route=/v1/users/2/posts"}, {"glob=aaaab"}, {"glob=aaaaab"},
		{"shared=img-1.png"}, {"shared=img-*.png"},
		{"tenant=a-prod", "user=bob"}, {"tenant=a-prod", "user=eve"},
		{"tenant=a-dev", "user=bob"}, {"tenant=b-dev", "user=bob"},
	})
	for _, same := range [][2][]string{
		{{"shared=img-1.png"}, {"shared=img-.png"}},
		{{"tenant=a-prod", "user=bob"}, {"tenant=b-prod", "user=bob"}},
	} {
		if a, b := hitKey(t, c, "g", same[0]...), hitKey(t, c, "g", same[1]...); a != b {
			t.Errorf("share_threshold: %v and %v count apart (%q, %q)", same[0], same[1], a, b)
		}
	}
}

// validHits reports what the limiter refuses of hits, wrapping
// sluice.ErrInvalid: it asks the store nothing more.
func validHits(hits []sluice.Hit) error {
	out := make([]sluice.Decision, len(hits))
	_, err := sluice.NewLimiter(nopStore{}).Take(context.Background(), hits, out)
	return err
}

// nopStore decides nothing.
type nopStore struct{}

func (nopStore) Take(context.Context, []sluice.Hit, []sluice.Decision) error { return nil }
