package rules_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rules"
)

func TestGlob(t *testing.T) {
	for _, tc := range []struct {
		key, value string   // the rule
		yes, no    []string // request values, for the same key
	}{
		{"k", "foo*", []string{"foo", "foo1", "foo*", "foofoo"}, []string{"fo", "xfoo", "Foo", ""}},
		{"k", "*.example.com", []string{"a.example.com", ".example.com", "a.b.example.com"}, []string{"example.com", "a.example.com.evil", "a.exampleXcom"}},
		{"k", "api.*.example.com", []string{"api.v1.example.com", "api..example.com", "api.a.b.example.com"}, []string{"api.example.com", "api.v1.example.org", "xapi.v1.example.com"}},
		{"k", "/v*/users/*/posts", []string{"/v1/users/42/posts", "/v/users//posts", "/v2/users/a/posts/users/b/posts"}, []string{"/v1/users/posts", "/v1/users/42/comments", "/v1/users/42/posts/"}},
		{"k", "a*a*a*a*b", []string{"aaaab", "a-a-a-a-b", "aaaaaaaab", "abababab"}, []string{"aaab", "ab", "aaaa", "aaaaba"}},
		{"k", "a*a*b", []string{"aab", "a-a-b", "aaaab"}, []string{"ab", "aa", "ba"}},
		{"k", "*", []string{"", "x", "*", "a*b"}, nil},
		{"k", "**", []string{"", "x"}, nil},
		{"k", "x**y", []string{"xy", "x123y", "x*y"}, []string{"yx", "x", "xy1"}},
		{"k", "ab*ba", []string{"abba", "ab-ba", "abba-ba"}, []string{"aba", "ab", "ba"}},
		{"k", "*a*", []string{"a", "bab", "aaa"}, []string{"", "bbb"}},
		{"k", `a.b+(c)?[d]{2}^$|\*`, []string{`a.b+(c)?[d]{2}^$|\`, `a.b+(c)?[d]{2}^$|\z`}, []string{`aXb+(c)?[d]{2}^$|\`, `a.bb+(c)?[d]{2}^$|\`, `a.b+c[d]{2}^$|\`}},
		{"k", ".*", []string{".", ".x"}, []string{"x", ""}},
		{"k", "é*ü", []string{"éü", "éaü", "é\xffü"}, []string{"eü", "é"}},
		{"k", "%s*%d", []string{"%s%d", "%sx%d"}, []string{"ax1"}},
	} {
		g := rules.CompileGlob(tc.key, tc.value)
		if g == nil {
			t.Fatalf("%s: not a wildcard", tc.value)
		}
		for _, v := range tc.yes {
			if !g([]byte(tc.key + "_" + v)) {
				t.Errorf("%q does not match %q", tc.value, v)
			}
			if !refGlob(tc.key, tc.value, tc.key, v) {
				t.Errorf("reference: %q does not match %q", tc.value, v)
			}
		}
		for _, v := range tc.no {
			if g([]byte(tc.key + "_" + v)) {
				t.Errorf("%q matches %q", tc.value, v)
			}
			if refGlob(tc.key, tc.value, tc.key, v) {
				t.Errorf("reference: %q matches %q", tc.value, v)
			}
		}
	}
}

// Which rules are wildcards, and the composite-key matching Envoy does.
func TestCompileGlob(t *testing.T) {
	for _, tc := range []struct {
		key, value string
		wild       bool
	}{
		{"k", "v", false}, {"k", "", false}, {"k*", "", true}, {"a*b", "", true},
		{"k*", "v", true}, {"k", "*", true}, {"k", "a*b", true}, {"k*", "v*", true},
	} {
		if g := rules.CompileGlob(tc.key, tc.value); (g != nil) != tc.wild {
			t.Errorf("%s=%s: wildcard %v, want %v", tc.key, tc.value, g != nil, tc.wild)
		}
	}
	for _, tc := range []struct {
		rkey, rvalue, key, value string
		want                     bool
	}{
		{"odd*", "", "oddity", "x", true}, // a value-less key prefix, as in Envoy
		{"odd*", "", "odd", "", true},     //
		{"k*", "v*w", "k*", "vXw", true},  // a star in a key is a wildcard too, as in Envoy
		{"k*", "v*w", "kk", "vXw", true},  //
		{"st*r", "", "st", "abcr", true},  // over the composite: "st_abcr"
		{"st*r", "", "stx", "y", false},   //
		{"kk*", "v", "kka", "v", true},    //
		{"kk*", "v", "kka", "w", false},   //
		{"a", "b_c*", "a_b", "c1", true},  // Envoy compares key_value strings
		{"a", "*_c", "a_b", "c", true},    // ... and so does an infix wildcard
		{"a", "b*", "ab", "x", false},     //
		{"a", "*", "b", "", false},        //
		{"a", "x*y", "a", "x_y", true},    //
		{"host", "*.com", "host", "a.com", true},
	} {
		g := rules.CompileGlob(tc.rkey, tc.rvalue)
		if got := g([]byte(tc.key + "_" + tc.value)); got != tc.want {
			t.Errorf("rule %s=%s, entry %s=%s: match %v, want %v", tc.rkey, tc.rvalue, tc.key, tc.value, got, tc.want)
		}
		if got := refGlob(tc.rkey, tc.rvalue, tc.key, tc.value); got != tc.want {
			t.Errorf("reference: rule %s=%s, entry %s=%s: match %v, want %v", tc.rkey, tc.rvalue, tc.key, tc.value, got, tc.want)
		}
	}
}

// Patterns that make a backtracking matcher exponential, or a naive one
// quadratic, take linear time here, and no allocation.
func TestGlobPathological(t *testing.T) {
	long := strings.Repeat("a", 1<<20)
	for _, tc := range []struct {
		value, s string
		want     bool
	}{
		{"a*a*a*a*a*a*a*a*a*a*a*a*b", long, false},
		{"a*a*a*a*a*a*a*a*a*a*a*a*b", long + "b", true},
		{strings.Repeat("*a", 200) + "*b", long, false},
		{"*" + strings.Repeat("a", 300) + "b*", long + "c", false},
		{"*" + strings.Repeat("a", 40) + "b*x", long + "x", false},
		{"*" + strings.Repeat("a", 40) + "b*", long + "b", true},
		{"*ab*ab*ab*ab*ab*x", strings.Repeat("ab", 1<<19), false},
	} {
		g := rules.CompileGlob("k", tc.value)
		s := []byte("k_" + tc.s)
		start := time.Now()
		for range 10 {
			if got := g(s); got != tc.want {
				t.Fatalf("%.20q...: match %v, want %v", tc.value, got, tc.want)
			}
		}
		// 10 MB scanned at least ten times over: well under a second
		// unless the matcher goes back over the input.
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("%.20q...: %v for 10 matches of 1 MB", tc.value, d)
		}
		if n := testing.AllocsPerRun(5, func() { g(s) }); n != 0 {
			t.Errorf("%.20q...: %v allocations", tc.value, n)
		}
	}
}

func BenchmarkGlob(b *testing.B) {
	g := rules.CompileGlob("path", "/api/*/users/*/posts*")
	s := []byte("path_/api/v1/users/" + strings.Repeat("u", 200) + "/posts/1")
	b.SetBytes(int64(len(s)))
	for b.Loop() {
		if !g(s) {
			b.Fatal("no match")
		}
	}
}
