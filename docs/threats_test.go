package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The threat model, docs/internals/threats.md, names for each input of
// each door the test that proves its bound. TestThreatsNameRealTests keeps
// the page true as code moves: every test it names exists, and every row
// of its tables names one (or says plainly that there is none).

// threatsPage is the threat model, from the docs directory.
const threatsPage = "internals/threats.md"

// testRef is a test named on the page as `dir.TestName` or
// `dir.TestName/subtest`: dir is the package's directory from the
// repository's root ("sluice" is the root package), the subtest as go test
// spells it (spaces as underscores).
var testRef = regexp.MustCompile("`([a-z0-9_./-]+)\\.((?:Test|Fuzz|Example)[A-Za-z0-9_]*)((?:/[^`/]+)*)`")

func TestThreatsNameRealTests(t *testing.T) {
	t.Parallel()
	page := readDoc(t, threatsPage)
	refs := testRef.FindAllStringSubmatch(page, -1)
	if len(refs) < 20 {
		t.Fatalf("%s names %d tests: is it still written as `dir.TestName`?", threatsPage, len(refs))
	}
	pkgs := map[string]*testPackage{}
	for _, m := range refs {
		dir, name, subs := m[1], m[2], m[3]
		p, ok := pkgs[dir]
		if !ok {
			p = loadTestPackage(t, dir)
			pkgs[dir] = p
		}
		switch {
		case p == nil:
			t.Errorf("%s: %s: no package %s in the tree", threatsPage, m[0], dir)
		case !p.funcs[name]:
			t.Errorf("%s: %s: no test %s in %s", threatsPage, m[0], name, dir)
		default:
			for _, sub := range strings.Split(strings.TrimPrefix(subs, "/"), "/") {
				if sub != "" && !p.strings[sub] {
					t.Errorf("%s: %s: no subtest %q in %s's tests (no string literal spells it)", threatsPage, m[0], sub, dir)
				}
			}
		}
	}
	for _, p := range threatRowProblems(page) {
		t.Errorf("%s: %s", threatsPage, p)
	}
}

// threatRowProblems returns the rows of the page's tables whose test
// column names no test and does not say "**none**".
func threatRowProblems(page string) []string {
	var probs []string
	for i, line := range strings.Split(page, "\n") {
		if !strings.HasPrefix(line, "|") || strings.HasPrefix(line, "|---") || strings.HasPrefix(line, "| input ") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) != 4 {
			probs = append(probs, "line "+strconv.Itoa(i+1)+": a row of "+strconv.Itoa(len(cells))+" cells, want 4 (input, controlled by, bound, test)")
			continue
		}
		if test := cells[3]; !testRef.MatchString(test) && !strings.HasPrefix(test, "**none**") {
			probs = append(probs, "line "+strconv.Itoa(i+1)+": no test named in the row's last cell, and not **none**")
		}
	}
	return probs
}

// testPackage is what the page may name of one package: its test
// functions, and the string literals of its test files (subtest names,
// spaces as underscores).
type testPackage struct {
	funcs   map[string]bool
	strings map[string]bool
}

// loadTestPackage parses the test files of dir (from the repository's
// root); nil when there is no such directory.
func loadTestPackage(t *testing.T, dir string) *testPackage {
	t.Helper()
	path := filepath.Join("..", filepath.FromSlash(dir))
	if dir == "sluice" {
		path = ".."
	}
	if fi, err := os.Stat(path); err != nil || !fi.IsDir() {
		return nil
	}
	files, err := filepath.Glob(filepath.Join(path, "*_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	p := &testPackage{funcs: map[string]bool{}, strings: map[string]bool{}}
	fset := token.NewFileSet()
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil {
				p.funcs[fd.Name.Name] = true
			}
		}
		ast.Inspect(file, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil {
					p.strings[strings.ReplaceAll(s, " ", "_")] = true
				}
			}
			return true
		})
	}
	return p
}
