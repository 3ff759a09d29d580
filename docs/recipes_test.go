// Package docs holds the tests of the documentation: every YAML block and
// Go snippet of recipes.md must be a copy of code that runs.
package docs

import (
	"bufio"
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/edges/httpconf"
	"github.com/sluicehq/sluice/rules"
)

// block is a fenced code block of a Markdown file.
type block struct {
	lang string // the first word of the info string
	from string // the from= attribute: PATH or PATH:Name, PATH relative to the repository
	text string // the contents, with a final newline
	line int    // of the opening fence
}

// blocks returns the fenced code blocks of the Markdown file at path.
func blocks(t *testing.T, path string) []block {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []block
	var cur *block
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			f := strings.Fields(strings.TrimPrefix(line, "```"))
			cur = &block{line: n}
			for i, w := range f {
				if i == 0 {
					cur.lang = w
				} else if v, ok := strings.CutPrefix(w, "from="); ok {
					cur.from = v
				}
			}
		case cur != nil && line == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		}
	}
	if cur != nil {
		t.Fatalf("%s:%d: unterminated code block", path, cur.line)
	}
	return out
}

// source returns the source of the declaration name in the Go file path
// (relative to the repository), its doc comment included, and the raw
// string literals within it. name is a function, a method as
// Type.Method, a type, or a constant or variable; empty means the whole
// file.
func source(t *testing.T, path, name string) (src string, raws []string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", path))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, data, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var found ast.Node
	var doc *ast.CommentGroup
	if name == "" {
		found = f
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			n := d.Name.Name
			if d.Recv != nil && len(d.Recv.List) == 1 {
				typ := d.Recv.List[0].Type
				if st, ok := typ.(*ast.StarExpr); ok {
					typ = st.X
				}
				if id, ok := typ.(*ast.Ident); ok {
					n = id.Name + "." + n
				}
			}
			if n == name {
				found, doc = d, d.Doc
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if s.Name.Name == name {
						found, doc = d, d.Doc
					}
				case *ast.ValueSpec:
					for _, id := range s.Names {
						if id.Name == name {
							found, doc = d, d.Doc
						}
					}
				}
			}
		}
	}
	if found == nil {
		t.Fatalf("%s has no declaration %s", path, name)
	}
	src = string(data) + "\n"
	if name != "" {
		start := found.Pos()
		if doc != nil {
			start = doc.Pos()
		}
		src = string(data[fset.Position(start).Offset:fset.Position(found.End()).Offset]) + "\n"
	}
	ast.Inspect(found, func(n ast.Node) bool {
		if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING && strings.HasPrefix(lit.Value, "`") {
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatal(err)
			}
			raws = append(raws, s)
		}
		return true
	})
	return src, raws
}

// dedent removes the leading tabs that all non-empty lines share.
func dedent(lines []string) []string {
	common := -1
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		n := len(l) - len(strings.TrimLeft(l, "\t"))
		if common < 0 || n < common {
			common = n
		}
	}
	out := make([]string, len(lines))
	for i, l := range lines {
		if len(l) >= common && common > 0 {
			l = l[common:]
		}
		out[i] = strings.TrimRight(l, " \t")
	}
	return out
}

// quotes reports whether the lines of snippet appear, in a row and
// indented alike, in src.
func quotes(src, snippet string) bool {
	want := dedent(strings.Split(strings.TrimSuffix(snippet, "\n"), "\n"))
	have := strings.Split(strings.TrimSuffix(src, "\n"), "\n")
	for i := 0; i+len(want) <= len(have); i++ {
		got := dedent(have[i : i+len(want)])
		if strings.Join(got, "\n") == strings.Join(want, "\n") {
			return true
		}
	}
	return false
}

// TestRecipes checks every yaml and go block of recipes.md against the
// code it was copied from (its from= attribute): a go block must be lines
// of that declaration (or file), a yaml block one of its raw string
// literals, which
// the declaration (an Example with its Output, or the rules of a test)
// runs. Every yaml block must also load without warnings as rules, and
// its http section, if any, with httpconf.
func TestRecipes(t *testing.T) {
	seen := map[string]int{}
	for _, b := range blocks(t, "recipes.md") {
		if b.lang != "yaml" && b.lang != "go" {
			continue
		}
		where := "recipes.md:" + strconv.Itoa(b.line)
		a := attrs(t, "recipes.md", b.line)
		_, run := a["run"]
		switch {
		case b.from == "" && b.lang == "yaml" && run && a["file"] != "":
			// A file of a script that TestShell runs: checked below as
			// rules and as an http section, not copied from code.
		case b.from == "":
			t.Errorf("%s: a %s block without from= (or, a yaml block, file= of a run= script)", where, b.lang)
			continue
		case !copied(t, where, b) || b.lang == "go":
			seen[b.lang]++
			continue
		}
		seen[b.lang]++
		d, err := rules.Parse(where, []byte(b.text))
		if err != nil {
			t.Errorf("%s: %v", where, err)
			continue
		}
		for _, w := range d.Warnings {
			t.Errorf("%s: warning: %v", where, w)
		}
		if _, err := httpconf.Parse(where, []byte(b.text)); err != nil {
			t.Errorf("%s: %v", where, err)
		}
	}
	// The page's recipes: a rules file each (the login's, the proxy's, the
	// tiers', the budget's), and their Go.
	if seen["yaml"] < 4 || seen["go"] < 5 {
		t.Errorf("recipes.md has %d yaml and %d go blocks checked; want at least 4 and 5", seen["yaml"], seen["go"])
	}
}

// guides are the pages besides recipes.md whose go blocks (and yaml blocks
// with from=) are copies of code that runs: each go block must say where
// from, and be lines of that declaration, which a test runs.
var guides = []string{"getting-started.md", "concepts.md", "client.md", "proxy.md", "leases.md", "overrides.md", "rules.md", "migrating.md"}

// TestGuidesFrom checks the go blocks and the from= yaml blocks of the
// guides as TestRecipes checks recipes.md's, and loads every yaml block
// that is a whole rules file (it starts with domain:).
func TestGuidesFrom(t *testing.T) {
	for _, page := range guides {
		for _, b := range blocks(t, page) {
			where := page + ":" + strconv.Itoa(b.line)
			if b.lang == "go" && b.from == "" {
				t.Errorf("%s: a go block without from=", where)
				continue
			}
			if b.lang == "yaml" && b.from == "" && strings.HasPrefix(b.text, "domain:") {
				// A whole rules file: it loads as serve and proxy read it.
				if _, err := rules.Parse(where, []byte(b.text)); err != nil {
					t.Errorf("%s: %v", where, err)
				}
				// A walkthrough's file (run=) may name files its script
				// writes first (a geoip database): TestShell loads it
				// there, with the real binary.
				if _, walkthrough := attrs(t, page, b.line)["run"]; walkthrough {
					continue
				}
				if _, err := httpconf.Parse(where, []byte(b.text)); err != nil {
					t.Errorf("%s: %v", where, err)
				}
				continue
			}
			if b.from == "" || (b.lang != "go" && b.lang != "yaml") {
				continue
			}
			copied(t, where, b)
		}
	}
}

// TestMigratingNamesEveryVariable: docs/migrating.md names every variable
// of envoyproxy/ratelimit that sluice reads (envoyVars, envoyRedis) or
// warns of (envoyUnmapped), as cmd/sluice/envoyenv.go lists them.
func TestMigratingNamesEveryVariable(t *testing.T) {
	data, err := os.ReadFile("migrating.md")
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`"([A-Z][A-Z0-9_]+)"`)
	n := 0
	for _, decl := range []string{"envoyVars", "envoyRedis", "envoyUnmapped"} {
		src, _ := source(t, "cmd/sluice/envoyenv.go", decl)
		for _, m := range name.FindAllStringSubmatch(src, -1) {
			n++
			if !regexp.MustCompile(`\b` + m[1] + `\b`).Match(data) {
				t.Errorf("migrating.md does not name %s (%s in cmd/sluice/envoyenv.go)", m[1], decl)
			}
		}
	}
	if n < 100 {
		t.Errorf("found %d variables in cmd/sluice/envoyenv.go; want at least 100", n)
	}
}

// copied reports whether the block b, at where, is a copy of the code its
// from= names (a go block: lines of the declaration; a yaml block: one of
// its raw strings), and says where it is not.
func copied(t *testing.T, where string, b block) bool {
	t.Helper()
	path, name, _ := strings.Cut(b.from, ":")
	src, raws := source(t, path, name)
	if b.lang == "go" {
		if !quotes(src, b.text) {
			t.Errorf("%s: the go block is not a copy of lines of %s in %s", where, name, path)
			return false
		}
		return true
	}
	for _, r := range raws {
		if r == b.text {
			return true
		}
	}
	t.Errorf("%s: the yaml block is not a raw string of %s in %s", where, name, path)
	return false
}

// TestGuidesNameEveryKey: rules.md names every key a rules file takes and
// proxy.md every key of the http section, as the parsers list them (their
// ...Keys variables), each as `key`, `parent.key` or key:.
func TestGuidesNameEveryKey(t *testing.T) {
	decl := regexp.MustCompile(`(?m)^\s*\w+Keys\s*=\s*(.*)$`)
	quoted := regexp.MustCompile(`"([a-z_]+)"`)
	for _, c := range []struct{ page, dir string }{
		{"rules.md", "rules"},
		{"proxy.md", "internal/edges/httpconf"},
	} {
		doc, err := os.ReadFile(c.page)
		if err != nil {
			t.Fatal(err)
		}
		files, err := filepath.Glob(filepath.Join("..", c.dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range decl.FindAllStringSubmatch(string(src), -1) {
				for _, k := range quoted.FindAllStringSubmatch(d[1], -1) {
					n++
					if !strings.Contains(string(doc), "`"+k[1]+"`") && !strings.Contains(string(doc), "."+k[1]+"`") && !strings.Contains(string(doc), k[1]+":") {
						t.Errorf("%s does not name the key %s (%s)", c.page, k[1], filepath.Base(f))
					}
				}
			}
		}
		if n < 10 {
			t.Errorf("%s: found %d keys in %s; want more", c.page, n, c.dir)
		}
	}
}
