package yamlwalk

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func load(t *testing.T, src string) *yaml.Node {
	t.Helper()
	doc, err := Load([]byte(src))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return doc.Root
}

func TestMappingMergesAndReports(t *testing.T) {
	root := load(t, "base: &b {a: 1, b: 2}\nother: &o {b: 3, c: 4}\nm:\n  <<: [*b, *o]\n  a: 9\n  a: 10\n  1: x\n")
	w := New(DefaultBudget)
	pairs, ok := w.Mapping(root.Content[5], "m")
	if !ok {
		t.Fatal("not a mapping")
	}
	got := map[string]string{}
	for _, kv := range pairs {
		got[kv.K.Value] = w.Deref(kv.V).Value
	}
	// The mapping's own a beats the merged one; the earlier merged
	// mapping's b beats the later one's.
	want := map[string]string{"a": "9", "b": "2", "c": "4"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("pairs = %v, want %v", got, want)
	}
	wantErrs := []string{`6:3 key "a" repeated (first at line 5)`, `7:3 key is not a string: "1"`}
	if len(w.Errs) != len(wantErrs) {
		t.Fatalf("problems = %v, want %v", w.Errs, wantErrs)
	}
	for i, e := range w.Errs {
		if s := fmt.Sprintf("%d:%d %s", e.Line, e.Column, e.Msg); s != wantErrs[i] {
			t.Errorf("problem %d = %s, want %s", i, s, wantErrs[i])
		}
	}
}

func TestFieldsStrict(t *testing.T) {
	root := load(t, "x: 1\ny: 2\nz: 3\n")
	w := New(DefaultBudget)
	var seen []string
	w.Fields(root, "the thing", []string{"x", "z"}, func(kv Pair) { seen = append(seen, kv.K.Value) })
	if strings.Join(seen, ",") != "x,z" {
		t.Errorf("fields seen = %v, want x,z", seen)
	}
	if len(w.Errs) != 1 || w.Errs[0].Msg != `unknown key "y" in the thing (want one of x, z)` || w.Errs[0].Line != 2 {
		t.Errorf("problems = %+v", w.Errs)
	}
}

// TestBudgetBoundsAliasBomb walks a billion-laughs document completely:
// the walk stops at the budget with one problem, whatever the document
// expands to.
func TestBudgetBoundsAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i < 9; i++ {
		fmt.Fprintf(&b, "a%d: &a%d [", i, i)
		for j := 0; j < 10; j++ {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "*a%d", i-1)
		}
		b.WriteString("]\n")
	}
	root := load(t, b.String())
	const budget = 10_000
	w := New(budget)
	visits := 0
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		n = w.Deref(n)
		if n == nil {
			return
		}
		visits++
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(root)
	if visits > budget {
		t.Errorf("visited %d nodes with a budget of %d", visits, budget)
	}
	if len(w.Errs) != 1 || w.Errs[0].Msg != "file too large or too deeply aliased" {
		t.Errorf("problems = %+v, want the one budget problem", w.Errs)
	}
	w.Errorf(root, "later")
	if len(w.Errs) != 1 {
		t.Errorf("a problem after the budget was recorded: %+v", w.Errs)
	}
}

// TestProblemsBounded walks a document in which every node is a
// problem, many times over through aliases: the walk records at most
// MaxProblems of them and one that says it stopped, and stops walking
// there, so that a file of a few hundred bytes cannot make a reader
// report (and a server log) a million problems.
func TestProblemsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i < 7; i++ {
		fmt.Fprintf(&b, "a%d: &a%d [", i, i)
		for j := 0; j < 10; j++ {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "*a%d", i-1)
		}
		b.WriteString("]\n")
	}
	root := load(t, b.String())
	w := New(DefaultBudget)
	visits := 0
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		n = w.Deref(n)
		if n == nil {
			return
		}
		visits++
		if n.Kind == yaml.ScalarNode {
			w.Errorf(n, "%q is not welcome", n.Value)
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(root)
	if len(w.Errs) != MaxProblems+1 || !strings.Contains(w.Errs[MaxProblems].Msg, "more than") {
		t.Errorf("%d problems recorded, the last %q; want %d and one saying the walk stopped", len(w.Errs), w.Errs[len(w.Errs)-1].Msg, MaxProblems+1)
	}
	if visits > 2*MaxProblems {
		t.Errorf("%d nodes visited after the problems were %d, want the walk stopped", visits, MaxProblems)
	}
}

func TestLoad(t *testing.T) {
	for _, c := range []struct {
		src        string
		root       bool
		second     bool
		secondLine int
	}{
		{"", false, false, 0},
		{"# only a comment\n", false, false, 0},
		{"a: 1\n", true, false, 0},
		{"a: 1\n---\nb: 2\n", true, true, 2},
		{"a: 1\n---\nb: [\n", true, true, 2}, // where it starts, broken or not
		{"a: 1\n# end\n\n---\nb: 2\nc:\n  - x\n d: 3\n", true, true, 4},
	} {
		doc, err := Load([]byte(c.src))
		if err != nil {
			t.Errorf("%q: %v", c.src, err)
			continue
		}
		if (doc.Root != nil) != c.root || doc.Second != c.second || doc.SecondLine != c.secondLine {
			t.Errorf("%q: root %v second %v line %d, want %v %v %d", c.src, doc.Root != nil, doc.Second, doc.SecondLine, c.root, c.second, c.secondLine)
		}
	}
	var se *SyntaxError
	if _, err := Load([]byte("a: [\n")); !errors.As(err, &se) || se.Line != 1 {
		t.Errorf("syntax error: %v, want a *SyntaxError on line 1", err)
	}
}

// TestSyntaxErrorLine: a syntax error is reported at the line of the
// fault, whether go.yaml.in/yaml/v3's scanner or its parser finds it,
// whatever encloses it, on the first line or the last.
func TestSyntaxErrorLine(t *testing.T) {
	for _, c := range []struct {
		name string
		src  string
		line int
	}{
		{"unclosed flow mapping", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second\n  - key: b\n", 4},
		{"unclosed flow list", "domain: d\ndescriptors:\n  - key: [a\n  - key: b\n", 3},
		{"list item out of line", "domain: d\ndescriptors:\n  - key: a\n   bad: x\n", 4},
		{"mapping after a list", "domain: d\ndescriptors:\n  - key: a\n value: x\n", 4},
		{"list item in a mapping", "domain: d\n- x\n", 2},
		{"after a comment header", "# rules\n# of the api\ndomain: d\ndescriptors:\n  - key: a\n   bad\n", 6},
		{"stray closing brace", "a: 1\nb: 2\nc: 3\nd: }\n", 4},
		{"open at the end", "a: 1\nb: 2\nc: 3\n? [\n", 4},
		{"no final line break", "a: 1\nb: 2\nc: [x", 3},
		{"colon in a value", "domain: d\ndescriptors:\n  - key: a\n    value: a: b\n", 4},
		{"tab", "domain: d\ndescriptors:\n  - key: a\n\tvalue: b\n", 4},
		{"reserved character", "domain: d\ndescriptors:\n  - key: a\n    value: @x\n", 4},
		{"unterminated quote", "a: 1\nb: 2\nc: 3\nd: 'x\n", 4},
		{"bad escape in a long quote", "a: 1\nb: \"x\n  y\n  \\q\"\n", 4},
		{"unknown alias", "a: 1\nb: 2\nc: *nowhere\n", 3},
		{"first line", "domain: d: e\n", 1},
		{"first line, parser", "[a\nb: c\n", 1},
		{"crlf", "a: 1\r\nb: 2\r\nc: {\r\n", 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Load([]byte(c.src))
			var se *SyntaxError
			if !errors.As(err, &se) {
				t.Fatalf("%q: %v, want a *SyntaxError", c.src, err)
			}
			if se.Line != c.line {
				t.Errorf("%q: line %d (%v), want %d", c.src, se.Line, err, c.line)
			}
		})
	}
}
