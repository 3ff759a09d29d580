package sluice_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The tiers of the module, lowest first. A package imports packages of its
// own tier or lower ones, never of a higher one: data flows one way, from
// the commands through the front doors and the decision core to the stores
// and the arithmetic. The folders show them: the private packages of a tier
// live in internal/<tier>/; the public ones keep their short paths, and
// are placed here.
//
//  1. base:     the arithmetic and pure helpers (no I/O, now passed in)
//  2. vocab:    the vocabulary (the root: Limit, Decision, Store, Limiter)
//     and the rules
//  3. stores:   the stores and the decorators over them, and the package
//     that assembles them
//  4. decision: the decision core
//  5. edges:    the front doors: codecs, servers, the proxy, the
//     middleware, the client, dashboards
//  6. commands: cmd/ and the examples
//
// Test support (internal/testsupport/) is imported by tests only.
var tiers = []struct {
	name  string
	paths []string // module-relative: an exact path, or a prefix ending in /
}{
	{"base", []string{"internal/base/"}},
	{"vocab", []string{"", "fault", "rules", "internal/vocab/"}},
	{"stores", []string{"memstore", "memstore/", "redisstore", "redisstore/", "lease", "localcache", "storetest", "internal/stores/"}},
	{"decision", []string{"decide", "internal/decision/"}},
	{"edges", []string{"httplimit", "httpretry", "internal/edges/"}},
	{"commands", []string{"cmd/", "examples/", "docs", "deploy"}},
}

const testSupport = "internal/testsupport/"

// toolsOfTests are the commands that may import test support: tools for
// trials and tests, not parts of the product.
var toolsOfTests = map[string]bool{"cmd/geoipdb": true}

// tierOf returns the index in tiers of the module-relative package rel, or
// -1 for test support and -2 for a package in no tier.
func tierOf(rel string) int {
	if strings.HasPrefix(rel, testSupport) {
		return -1
	}
	best, bestLen := -2, -1
	for i, t := range tiers {
		for _, p := range t.paths {
			match := rel == p || strings.HasSuffix(p, "/") && strings.HasPrefix(rel, p)
			if match && len(p) > bestLen {
				best, bestLen = i, len(p)
			}
		}
	}
	return best
}

// TestTiers holds every package of the module, the sluice binary's
// included, to the tiers: no import runs up a tier, and no production
// code imports test support.
func TestTiers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	const mod = "github.com/sluicehq/sluice"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	rel := func(pkg string) (string, bool) {
		if pkg == mod {
			return "", true
		}
		r, ok := strings.CutPrefix(pkg, mod+"/")
		return r, ok
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		from, _ := rel(fields[0])
		ft := tierOf(from)
		if ft == -2 {
			t.Errorf("%s is in no tier (tiers_test.go): place it", fields[0])
			continue
		}
		for _, imp := range fields[1:] {
			to, ok := rel(imp)
			if !ok {
				continue
			}
			switch tt := tierOf(to); {
			case tt == -1 && ft != -1 && !toolsOfTests[from]:
				t.Errorf("%s imports the test support %s", fields[0], imp)
			case tt == -2:
				t.Errorf("%s imports %s, which is in no tier", fields[0], imp)
			case ft >= 0 && tt > ft:
				t.Errorf("%s (%s) imports %s (%s): an import up a tier", fields[0], tiers[ft].name, imp, tiers[tt].name)
			}
		}
	}
}

// maxFileLines is the most lines a non-test Go file may hold: a file
// longer than this holds more than one thing, and should be split by
// responsibility.
const maxFileLines = 600

// TestFileSizes: no non-test Go file of the module is over maxFileLines.
func TestFileSizes(t *testing.T) {
	out, err := exec.Command("git", "ls-files", "*.go").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	for name := range strings.FieldsSeq(string(out)) {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), "\n"); n > maxFileLines {
			t.Errorf("%s: %d lines, more than %d", name, n, maxFileLines)
		}
	}
}
