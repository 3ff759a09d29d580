package rules_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/rules"
)

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, src := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestLoadDir(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"a.yaml":          "domain: a\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n",
		"b.yml":           "domain: b\n",
		"notes.txt":       "not rules",
		".hidden.yaml":    "domain: a\n",
		"sub/c.yaml":      "domain: c\n", // subdirectories are read, as envoy-rl reads its runtime directory
		"sub/.x/d.yaml":   "domain: a\n",
		"..data/a.yaml":   "domain: a\n",
		"warn.yaml":       "domain: w\ndescriptors: [{key: k, unit: second}]\n",
		"config.yaml.bak": "broken: [",
	})
	c, err := rules.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Domains(), ","); got != "a,b,c,w" {
		t.Errorf("domains %s", got)
	}
	if c.Domain("a") == nil || c.Domain("a").File != filepath.Join(dir, "a.yaml") || c.Domain("zzz") != nil {
		t.Errorf("Domain lookup")
	}
	if w := c.Warnings(); len(w) != 1 || !strings.HasPrefix(w[0].String(), filepath.Join(dir, "warn.yaml")+":2:") {
		t.Errorf("warnings %v", w)
	}
}

// Every problem of every file, and duplicate domains naming both files.
func TestLoadDirErrors(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"1.yaml": "domain: a\n",
		"2.yaml": "domain: a\n",
		"3.yaml": "domain: b\ndescriptors: [{value: x}]\n",
		"4.yaml": "domain: c\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n",
	})
	_, err := rules.LoadDir(dir)
	var re *rules.Error
	if !errors.As(err, &re) {
		t.Fatalf("err = %v", err)
	}
	msg := err.Error()
	for _, want := range []string{
		filepath.Join(dir, "3.yaml") + ":2:15: descriptor has empty key",
		filepath.Join(dir, "4.yaml") + ":4:24: invalid rate limit unit 'fortnight'",
		filepath.Join(dir, "2.yaml") + ":1: duplicate domain 'a' in config file (also in " + filepath.Join(dir, "1.yaml") + ")",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("missing %q in\n%s", want, msg)
		}
	}
	if len(re.Problems) != 3 {
		t.Errorf("%d problems:\n%s", len(re.Problems), msg)
	}
}

// The warnings of the files come with their problems: of a bad file, and
// of the good files beside it.
func TestErrorWarnings(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"bad.yaml":  "domain: a\ndescriptors:\n  - {key: k, unit: second}\n  - {value: x}\n",
		"warn.yaml": "domain: w\ndescriptors: [{key: k, unit: second}]\n",
	})
	_, err := rules.LoadDir(dir)
	var re *rules.Error
	if !errors.As(err, &re) || len(re.Problems) != 1 {
		t.Fatalf("err = %v, want one problem", err)
	}
	var got []string
	for _, w := range re.Warnings {
		got = append(got, w.String())
	}
	want := []string{filepath.Join(dir, "bad.yaml") + ":3:14:", filepath.Join(dir, "warn.yaml") + ":2:24:"}
	if len(got) != len(want) {
		t.Fatalf("warnings %q, want %q", got, want)
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("warning %d = %q, want prefix %q", i, got[i], want[i])
		}
	}
	if strings.Contains(err.Error(), "no effect") {
		t.Errorf("Error() prints the warnings:\n%s", err)
	}
}

func TestLoadFile(t *testing.T) {
	dir := writeFiles(t, map[string]string{"r.yaml": matching})
	c, err := rules.LoadFile(filepath.Join(dir, "r.yaml"))
	if err != nil || c.Domain("m") == nil {
		t.Fatalf("LoadFile: %v", err)
	}
	if _, err := rules.LoadFile(filepath.Join(dir, "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	if _, err := rules.LoadDir(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing dir: %v", err)
	}
}

// The hash depends on the content only: not on file names or load order.
func TestHash(t *testing.T) {
	a := "domain: a\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n"
	b := "domain: b\n"
	parse := func(name, src string) *rules.Domain {
		d, err := rules.Parse(name, []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	c1, _ := rules.NewConfig(parse("x.yaml", a), parse("y.yaml", b))
	c2, _ := rules.NewConfig(parse("y.yaml", b), parse("other.yaml", a))
	c3, _ := rules.NewConfig(parse("x.yaml", strings.Replace(a, "1}", "2}", 1)), parse("y.yaml", b))
	c4, _ := rules.NewConfig(parse("x.yaml", a))
	if c1.Hash() != c2.Hash() {
		t.Error("hash depends on order or file names")
	}
	if c1.Hash() == c3.Hash() || c1.Hash() == c4.Hash() || len(c1.Hash()) != 64 {
		t.Errorf("hashes %s %s %s", c1.Hash(), c3.Hash(), c4.Hash())
	}
}

// A Config is shared by concurrent requests (run with -race).
func TestConcurrentPlans(t *testing.T) {
	c := rulestest.Config(t, matching)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var p rules.Plan
			for i := range 200 {
				d := desc("ip=10.0.0." + string(rune('0'+i%10)))
				d.Override = nil
				if i%3 == g%3 {
					d.Override = &rules.Override{RequestsPerUnit: uint32(i), Unit: rules.Second}
				}
				if err := c.Plan("m", []rules.Descriptor{d, desc("to_number=1")}, &p); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestParseUnit(t *testing.T) {
	for _, s := range []string{"second", "MINUTE", "Hour", "day", "week", "month", "year"} {
		u, err := rules.ParseUnit(s)
		if err != nil || !strings.EqualFold(u.String(), s) || u.Duration() == 0 {
			t.Errorf("%s: %v %v", s, u, err)
		}
	}
	for _, s := range []string{"", "unknown", "seconds", "fortnight"} {
		if _, err := rules.ParseUnit(s); err == nil {
			t.Errorf("%q parsed", s)
		}
	}
	if rules.Week != 7 || rules.Month != 5 || rules.Year != 6 || rules.UnitUnknown.Duration() != 0 {
		t.Error("unit numbering differs from Envoy's")
	}
}

// TestLoadDirMerge: with MergeDomains (envoy-rl's MERGE_DOMAIN_CONFIG),
// files of one domain merge their descriptors; a descriptor both define,
// or different domain-wide settings, are problems naming both files.
func TestLoadDirMerge(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"a.yaml":      "domain: api\ndescriptors: [{key: user, rate_limit: {unit: second, requests_per_unit: 1}}]\n",
		"team/b.yaml": "domain: api\nfailure_policy: fail_closed\ndescriptors: [{key: ip, rate_limit: {unit: minute, requests_per_unit: 5}}]\n",
		"other.yaml":  "domain: web\n",
	})
	if _, err := rules.LoadDir(dir); err == nil || !strings.Contains(err.Error(), "duplicate domain 'api'") {
		t.Fatalf("without merging: %v, want a duplicate domain", err)
	}
	c, err := rules.LoadDirWith(dir, rules.LoadOptions{MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	d := c.Domain("api")
	if d == nil || len(d.Rules) != 2 || d.FailurePolicy != rules.FailClosed {
		t.Fatalf("merged domain %+v", d)
	}
	var p rules.Plan
	if err := c.Plan("api", []rules.Descriptor{{Entries: []rules.Entry{{Key: "ip", Value: "1"}}, Cost: 1}}, &p); err != nil || len(p.Hits) != 1 || p.Hits[0].Limit.Rate != 5 {
		t.Fatalf("a descriptor of the second file: %+v %v", p.Hits, err)
	}
	// The merged hash changes with either file.
	h := c.Hash()
	if err := os.WriteFile(filepath.Join(dir, "team/b.yaml"), []byte("domain: api\ndescriptors: [{key: ip, rate_limit: {unit: minute, requests_per_unit: 6}}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if c2, err := rules.LoadDirWith(dir, rules.LoadOptions{MergeDomains: true}); err != nil || c2.Hash() == h {
		t.Fatalf("after changing the second file: %v, hash unchanged %v", err, c2 != nil && c2.Hash() == h)
	}

	bad := writeFiles(t, map[string]string{
		"a.yaml": "domain: api\nfailure_policy: local\ndescriptors: [{key: user, rate_limit: {unit: second, requests_per_unit: 1}}]\n",
		"b.yaml": "domain: api\nfailure_policy: fail_open\ndescriptors: [{key: user, rate_limit: {unit: minute, requests_per_unit: 5}}]\n",
	})
	_, err = rules.LoadDirWith(bad, rules.LoadOptions{MergeDomains: true})
	if err == nil {
		t.Fatal("conflicting files merged")
	}
	for _, want := range []string{"b.yaml:3:15: duplicate descriptor composite key 'api.user' (also in " + filepath.Join(bad, "a.yaml") + " at line 3)", "failure_policy of domain 'api' differs"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error\n%v\nlacks %q", err, want)
		}
	}
}

// TestDirFiles: subdirectories at any depth, hidden entries skipped, a
// symlinked directory read once even in a loop.
func TestDirFiles(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"a.yaml":          "domain: a\n",
		"x/y/z/b.yml":     "domain: b\n",
		".git/c.yaml":     "domain: c\n",
		"x/..data/d.yaml": "domain: d\n",
	})
	if err := os.Symlink(dir, filepath.Join(dir, "x", "loop")); err != nil {
		t.Fatal(err)
	}
	files, dirs, err := rules.DirFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, "a.yaml"), filepath.Join(dir, "x/y/z/b.yml")}
	if strings.Join(files, " ") != strings.Join(want, " ") {
		t.Errorf("files %v, want %v", files, want)
	}
	if len(dirs) != 4 { // dir, x, x/y, x/y/z (the loop back is dir again)
		t.Errorf("dirs %v", dirs)
	}
}
