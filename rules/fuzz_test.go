package rules_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/rules"
)

// FuzzParse: no input panics; a parsed file has valid limits and can be
// matched against; an invalid one lists its problems.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		matching, statKeysConfig, example7, globs, "", "domain: a", "domain: a\ndescriptors: [{key: k}]",
		"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		"domain: a\ncapacity: {unit: second, requests_per_unit: 9}\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, elastic_ceiling: 3}\n",
		"domain: a\ndescriptors:\n  - key: k\n    rate_limits: [{period: 90s, requests_per_unit: 3}, {unit: day, requests_per_unit: 9, algorithm: gcra, burst: 3}]\n",
		"domain: &a x\ndescriptors: &d\n  - key: *a\n    descriptors: *d\n",
		"domain: a\ndescriptors:\n  - &k {key: k, rate_limit: {<<: {unit: hour}, requests_per_unit: 0o7}}\n  - *k\n",
		"domain: a\nfailure_policy: local\n",
		"domain: a\n\tb: c\n", "[1, 2", "domain: a\n---\ndomain: b\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		d, err := rules.Parse("fuzz.yaml", []byte(src))
		if err != nil {
			var re *rules.Error
			if !errors.As(err, &re) || len(re.Problems) == 0 {
				t.Fatalf("error %v is not a *rules.Error with problems", err)
			}
			for _, p := range re.Problems {
				if p.File != "fuzz.yaml" || p.Msg == "" {
					t.Fatalf("bad problem %+v", p)
				}
			}
			return
		}
		if d.Name == "" {
			t.Fatal("empty domain parsed")
		}
		if d.Capacity != nil {
			if err := d.Capacity.Validate(); err != nil {
				t.Fatalf("capacity: %v", err)
			}
		}
		c, err := rules.NewConfig(d)
		if err != nil {
			t.Fatal(err)
		}
		var p rules.Plan
		for _, r := range d.Rules {
			for _, l := range r.Limits {
				if err := l.Validate(); err != nil {
					t.Fatalf("%s: %v", r.StatKey, err)
				}
			}
			// A request naming the rule's path reaches it (or, Envoy's
			// lookup being what it is, another rule): it must not fail
			// other than on its size.
			var entries []rules.Entry
			for x := r; x != nil; x = x.Parent {
				entries = append([]rules.Entry{{Key: x.Key, Value: strings.ReplaceAll(x.Value, "*", "")}}, entries...)
			}
			err := c.Plan(d.Name, []rules.Descriptor{{Entries: entries, Cost: 1}}, &p)
			if err != nil && !errors.Is(err, sluice.ErrInvalid) {
				t.Fatal(err)
			}
			if err == nil {
				if err := validHits(p.Hits); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}

// FuzzGlob compares the wildcard matcher with the reference, on patterns
// and values over a small alphabet (so that they match often) or any bytes.
func FuzzGlob(f *testing.F) {
	for _, s := range [][4]string{
		{"k", "a*a*a*a*b", "k", "aaaab"}, {"k", "*", "k", ""}, {"k", "ab*ba", "k", "aba"}, {"odd*", "", "oddity", "x"},
		{"a", "b_c*", "a_b", "c1"}, {"k*", "v*w", "kk", "vw"}, {"k", "x**y", "k", "x*y"}, {"k", ".*", "k", "a"},
		{"k", "*_*", "k_", "_"}, {"h", "api.*.example.com", "h", "api.example.com"},
	} {
		f.Add(s[0], s[1], s[2], s[3], false)
		f.Add(s[0], s[1], s[2], s[3], true)
	}
	f.Fuzz(func(t *testing.T, rkey, rvalue, key, value string, small bool) {
		if len(rvalue) > 64 || len(value) > 4096 {
			return
		}
		if small {
			rvalue, value = alphabet(rvalue, "ab*"), alphabet(value, "ab_*")
		}
		g := rules.CompileGlob(rkey, rvalue)
		if (g != nil) != (strings.Contains(rkey, "*") || strings.Contains(rvalue, "*")) {
			t.Fatalf("rule %q=%q: wildcard %v", rkey, rvalue, g != nil)
		}
		if g == nil {
			return
		}
		if got, want := g([]byte(key+"_"+value)), refGlob(rkey, rvalue, key, value); got != want {
			t.Fatalf("rule %q=%q, entry %q=%q: match %v, reference %v", rkey, rvalue, key, value, got, want)
		}
	})
}

// FuzzPlan compares the matching with a naive reference of Envoy's lookup
// and checks the hits and keys of random requests.
func FuzzPlan(f *testing.F) {
	c := rulestest.Config(f, matching+`
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 100}
`, statKeysConfig, example7, globs)
	for _, s := range []string{
		"host=api.v1.example.com\nhost=api.example.com\nhost=www.example.com", "route=/v1/users/2/posts\nroute=/v1/users/2/x&user=u",
		"glob=aaaab\nglob=aaab", "stars=x*y", "meta=a.b+(c)?[d]{2}^$|\\z", "k*=vw", "shared=img-1.png\nshared=img-2.png",
		"tenant=a-prod&user=u\ntenant=b-dev-1&user=u", "any=a*b", "ip=10.*",
		"ip=1.2.3.4", "ip=10.0.0.1\nip=10.0.0.2", "path=/api/x&user=u", "message_type=marketing&to_number=1\nto_number=1",
		"key=value&subkey=v", "any=", "oddity=1", "files=files/a\nfiles=files/b", "route=/a&http_method=GET&user_id=7",
		"key_1=value_1&user=bkthomps\nkey_2=value_2&user=bkthomps", "a=b=c&=x", "k\x00=\xff",
	} {
		for _, dom := range []string{"m", "st", "example7", "g", "none"} {
			f.Add(dom, s, uint8(0))
			f.Add(dom, s, uint8(3))
		}
	}
	f.Fuzz(func(t *testing.T, domain, src string, flags uint8) {
		var ds []rules.Descriptor
		for i, line := range strings.Split(src, "\n") {
			d := rules.Descriptor{Cost: int64(flags>>2) + int64(i%2)}
			if line != "" {
				for _, kv := range strings.Split(line, "&") {
					k, v, _ := strings.Cut(kv, "=")
					d.Entries = append(d.Entries, rules.Entry{Key: k, Value: v})
				}
			}
			if flags&1 != 0 && i == 0 {
				d.Override = &rules.Override{RequestsPerUnit: uint32(flags), Unit: rules.Unit(flags>>1&7) + 1}
			}
			ds = append(ds, d)
		}
		var p rules.Plan
		err := c.Plan(domain, ds, &p)
		if err != nil {
			if !errors.Is(err, sluice.ErrInvalid) {
				t.Fatal(err)
			}
			return
		}
		if len(p.Matches) != len(ds) {
			t.Fatalf("%d matches for %d descriptors", len(p.Matches), len(ds))
		}
		if err := validHits(p.Hits); err != nil {
			t.Fatal(err)
		}
		d := c.Domain(domain)
		keys := map[string]string{} // hit key -> what it counts
		for i, m := range p.Matches {
			if ds[i].Override != nil && d != nil {
				if m.Status != rules.Overridden || m.Count != 1 {
					t.Fatalf("override: %+v", m)
				}
				continue
			}
			var want *rules.Rule
			if d != nil && ds[i].Override == nil {
				want = refMatch(d, ds[i].Entries)
			}
			if m.Rule != want {
				t.Fatalf("descriptor %v matched %v, reference %v", ds[i].Entries, name(m.Rule), name(want))
			}
			if m.Status != rules.Limited {
				if m.Count != 0 {
					t.Fatalf("status %s with %d hits", m.Status, m.Count)
				}
				continue
			}
			if m.Count != len(want.Limits) {
				t.Fatalf("%d hits for %d limits", m.Count, len(want.Limits))
			}
			for j, h := range p.Hits[m.First : m.First+m.Count] {
				if h.Limit != want.Limits[j] || h.Cost != ds[i].Cost {
					t.Fatalf("hit %+v", h)
				}
				what := want.StatKey + "#" + string(rune('0'+j)) + "|" + counted(want, ds[i].Entries)
				if prev, ok := keys[h.Key]; ok && prev != what {
					t.Fatalf("key %q counts %q and %q", h.Key, prev, what)
				}
				keys[h.Key] = what
			}
		}
	})
}

// counted names what a limited match counts: its entries, with the values
// of share_threshold wildcards replaced by the wildcard.
func counted(r *rules.Rule, entries []rules.Entry) string {
	var path []*rules.Rule
	for x := r; x != nil; x = x.Parent {
		path = append([]*rules.Rule{x}, path...)
	}
	var b strings.Builder
	for i, e := range entries {
		v := e.Value
		if x := path[i]; x.ShareThreshold && wildcard(x) && e.Key+"_"+e.Value != x.Key+"_"+x.Value {
			v = "\x00shared"
		}
		b.WriteString(strings.ReplaceAll(e.Key, "\\", "\\\\") + "\\=" + strings.ReplaceAll(v, "\\", "\\\\") + "\\&")
	}
	return b.String()
}

func name(r *rules.Rule) string {
	if r == nil {
		return "nothing"
	}
	return r.StatKey
}

// refMatch is envoyproxy/ratelimit's GetLimit written naively over the
// parsed rules, with wildcards anywhere in a value.
func refMatch(d *rules.Domain, entries []rules.Entry) *rules.Rule {
	composite := func(r *rules.Rule) string {
		if r.Value == "" {
			return r.Key
		}
		return r.Key + "_" + r.Value
	}
	children := func(parent *rules.Rule) []*rules.Rule {
		var out []*rules.Rule
		for _, r := range d.Rules {
			if r.Parent == parent {
				out = append(out, r)
			}
		}
		return out
	}
	level := children(nil)
	var matched *rules.Rule
	for i, e := range entries {
		full := e.Key + "_" + e.Value
		var next *rules.Rule
		for _, r := range level {
			if composite(r) == full {
				next = r
			}
		}
		if next == nil {
			for _, r := range level {
				if wildcard(r) && refGlob(r.Key, r.Value, e.Key, e.Value) {
					next = r
					break
				}
			}
		}
		if next == nil {
			for _, r := range level {
				if composite(r) == e.Key {
					next = r
				}
			}
		}
		if next != nil && next.HasRateLimit() && i == len(entries)-1 {
			matched = next
		}
		if next == nil {
			break
		}
		level = children(next)
		if len(level) == 0 {
			break
		}
	}
	return matched
}

// globRef is a plain dynamic-programming wildcard match of a whole string,
// quadratic but obviously right: the reference for the wildcard matcher.
func globRef(pattern, s string, wild func(i int) bool) bool {
	// ok[j]: pattern[:i] matches s[:j].
	ok := make([]bool, len(s)+1)
	ok[0] = true
	for i := 0; i < len(pattern); i++ {
		next := make([]bool, len(s)+1)
		if wild(i) {
			seen := false
			for j := range ok {
				seen = seen || ok[j]
				next[j] = seen
			}
		} else {
			for j := 1; j <= len(s); j++ {
				next[j] = ok[j-1] && s[j-1] == pattern[i]
			}
		}
		ok = next
	}
	return ok[len(s)]
}

// refGlob matches the request entry (key, value) against the rule (rkey,
// rvalue) with globRef: every '*' of the value is wild, and the trailing
// '*' of a value-less key.
func refGlob(rkey, rvalue, key, value string) bool {
	pattern := rkey
	if rvalue != "" {
		pattern = rkey + "_" + rvalue
	}
	return globRef(pattern, key+"_"+value, func(i int) bool { return pattern[i] == '*' })
}

// wildcard reports whether r is a wildcard rule: a '*' anywhere in its
// key or value, as in Envoy.
func wildcard(r *rules.Rule) bool {
	return strings.Contains(r.Key, "*") || strings.Contains(r.Value, "*")
}

// alphabet maps every byte of s to one of the bytes of abc.
func alphabet(s, abc string) string {
	b := []byte(s)
	for i, c := range b {
		b[i] = abc[int(c)%len(abc)]
	}
	return string(b)
}
