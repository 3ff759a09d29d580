package rules_test

import (
	"testing"

	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/rules"
)

// TestHashTag checks which keys share a tag in each mode, on keys built by
// Plan from a real rules file.
func TestHashTag(t *testing.T) {
	c := rulestest.Config(t, `
domain: api
capacity: {unit: second, requests_per_unit: 1000}
descriptors:
  - key: user
    rate_limits:
      - {unit: second, requests_per_unit: 5}
      - {unit: day, requests_per_unit: 500, algorithm: gcra}
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 50}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 60}
`, `
domain: other
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 5}
`)
	p := plan(t, c, "api", desc("user=bob"), desc("user=bob", "path=/a"), desc("ip=1.2.3.4"), desc("user=alice"))
	// Hits: bob/s, bob/day, bob+path, ip, alice/s, alice/day, capacity.
	keys := make([]string, len(p.Hits))
	for i, h := range p.Hits {
		keys[i] = h.Key
	}
	if len(keys) != 7 || p.Capacity != 6 {
		t.Fatalf("unexpected plan: %d hits, capacity at %d", len(keys), p.Capacity)
	}
	other := plan(t, c, "other", desc("user=bob")).Hits[0].Key

	entry := rules.HashTag(rules.TagEntry)
	same := func(tag func(string) string, a, b string) bool { return tag(a) == tag(b) }
	for _, tc := range []struct {
		name string
		a, b string
		want bool
	}{
		{"two limits of one descriptor", keys[0], keys[1], true},
		{"user and user+path", keys[0], keys[2], true},
		{"user and ip", keys[0], keys[3], false},
		{"bob and alice", keys[0], keys[4], false},
		{"alice's two limits", keys[4], keys[5], true},
		{"user and capacity", keys[0], keys[6], false},
	} {
		if got := same(entry, tc.a, tc.b); got != tc.want {
			t.Errorf("entry mode, %s: same tag %v, want %v (%q, %q)", tc.name, got, tc.want, entry(tc.a), entry(tc.b))
		}
	}
	if entry(keys[6]) != keys[6] {
		t.Errorf("entry mode: the capacity key's tag is %q, want the whole key", entry(keys[6]))
	}

	domain := rules.HashTag(rules.TagDomain)
	for i, k := range keys {
		if !same(domain, k, keys[0]) {
			t.Errorf("domain mode: key %d has tag %q, key 0 %q", i, domain(k), domain(keys[0]))
		}
	}
	if same(domain, keys[0], other) {
		t.Error("domain mode: two domains share a tag")
	}

	whole := rules.HashTag(rules.TagKey)
	for i, k := range keys {
		if whole(k) != k {
			t.Errorf("key mode: key %d is not its own tag", i)
		}
	}
	for _, k := range []string{"", "x", "r", "r5:ab", "r3:api9:xx", "c", "user:42"} {
		for _, m := range []rules.TagMode{rules.TagEntry, rules.TagKey, rules.TagDomain} {
			if got := rules.HashTag(m)(k); got != k && len(got) == 0 {
				t.Errorf("%s mode: foreign key %q gets an empty tag", m, k)
			}
		}
	}
	// A per-request override of bob's limit shares bob's tag in entry
	// mode and the domain's in domain mode.
	ov := desc("user=bob")
	ov.Override = &rules.Override{RequestsPerUnit: 7, Unit: rules.Minute}
	op := plan(t, c, "api", ov)
	okey := op.Hits[0].Key
	if okey[0] != 'o' {
		t.Fatalf("override key %q does not start with 'o'", okey)
	}
	if !same(entry, okey, keys[0]) {
		t.Errorf("entry mode: override tag %q, bob's %q", entry(okey), entry(keys[0]))
	}
	if !same(domain, okey, keys[0]) {
		t.Errorf("domain mode: override tag %q, domain's %q", domain(okey), domain(keys[0]))
	}
	for _, s := range []string{"entry", "key", "domain"} {
		m, err := rules.ParseTagMode(s)
		if err != nil || m.String() != s {
			t.Errorf("ParseTagMode(%q) = %v, %v", s, m, err)
		}
	}
	if _, err := rules.ParseTagMode("slot"); err == nil {
		t.Error("ParseTagMode accepted an unknown mode")
	}
}

// BenchmarkHashTag measures the tag of each kind of counter key Plan
// builds (a rule's, an override's and the capacity's), in each mode.
func BenchmarkHashTag(b *testing.B) {
	c := rulestest.Config(b, `
domain: api
capacity: {unit: second, requests_per_unit: 1000}
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 5}
`)
	ov := desc("user=bob")
	ov.Override = &rules.Override{RequestsPerUnit: 7, Unit: rules.Minute}
	var p rules.Plan
	if err := c.Plan("api", []rules.Descriptor{desc("user=bob"), ov}, &p); err != nil {
		b.Fatal(err)
	}
	keys := make([]string, len(p.Hits))
	for i, h := range p.Hits {
		keys[i] = h.Key
	}
	if len(keys) != 3 || keys[0][0] != 'r' || keys[1][0] != 'o' || keys[2][0] != 'c' {
		b.Fatalf("keys %q, want a rule's, an override's and the capacity's", keys)
	}
	for _, m := range []rules.TagMode{rules.TagEntry, rules.TagDomain} {
		tag := rules.HashTag(m)
		b.Run(m.String(), func(b *testing.B) {
			b.ReportAllocs()
			n := 0
			for i := 0; b.Loop(); i++ {
				n += len(tag(keys[i%len(keys)]))
			}
			if n == 0 {
				b.Fatal("empty tags")
			}
		})
	}
}
