package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

func runCmd(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestCheck(t *testing.T) {
	code, out, _ := runCmd(t, "", "check", "--config", "../../examples/rules.yaml")
	if code != 0 || !strings.Contains(out, "OK") {
		t.Fatalf("example rules: exit %d, %q", code, out)
	}
	bad := writeFile(t, "bad.yaml", `domain: d
descriptors:
  - key: a
    rate_limit: {unit: fortnight, requests_per_unit: 1}
  - key: b
    rate_limit: {unit: second, requests_per_unit: -4}
    colour: blue
`)
	code, _, errOut := runCmd(t, "", "check", "--config", bad)
	if code != 1 {
		t.Fatalf("bad rules: exit %d", code)
	}
	for _, want := range []string{"bad.yaml:4:", "fortnight", "bad.yaml:6:", "bad.yaml:7:", "colour"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	// A file's http section is checked too.
	badHTTP := writeFile(t, "http.yaml", "domain: d\nhttp:\n  routes:\n    - pattern: get /x\n")
	if code, _, errOut := runCmd(t, "", "check", "--config", badHTTP); code != 1 || !strings.Contains(errOut, "http.yaml:4:16: pattern") {
		t.Errorf("bad http section: exit %d, %q", code, errOut)
	}
	if code, _, _ := runCmd(t, "", "check"); code != 2 {
		t.Errorf("no --config: exit %d, want 2", code)
	}
	if code, _, _ := runCmd(t, "", "check", "--config", filepath.Join(t.TempDir(), "missing.yaml")); code != 1 {
		t.Errorf("missing file: exit %d, want 1", code)
	}
	// Two files of one domain: refused, unless merged as serve merges.
	dir := t.TempDir()
	writeRules(t, filepath.Join(dir, "a.yaml"), "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	writeRules(t, filepath.Join(dir, "b.yaml"), "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	if code, _, errOut := runCmd(t, "", "check", "--config", dir); code != 1 || !strings.Contains(errOut, "duplicate domain 'd'") {
		t.Errorf("one domain in two files: exit %d, %q", code, errOut)
	}
	if code, out, errOut := runCmd(t, "", "check", "--config", dir, "--merge-domains"); code != 0 || !strings.Contains(out, "1 domain(s): [d]") {
		t.Errorf("--merge-domains: exit %d, %q %q", code, out, errOut)
	}
}

func TestSimulateFromStdin(t *testing.T) {
	rules := writeFile(t, "r.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	trace := `{"at":0,"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}
{"at":10,"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}
`
	code, out, errOut := runCmd(t, trace, "simulate", "--config", rules, "--trace", "-")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"overallCode":"OK"`) || !strings.Contains(lines[1], `"overallCode":"OVER_LIMIT"`) {
		t.Errorf("stdout:\n%s", out)
	}
	if !strings.Contains(errOut, "2 requests: 1 allowed, 1 denied") || !strings.Contains(errOut, "d.k") {
		t.Errorf("summary:\n%s", errOut)
	}

	code, out, errOut = runCmd(t, trace+"{oops\n", "simulate", "--config", rules, "--trace", "-")
	if code != 1 || out != "" || !strings.Contains(errOut, "line 3") {
		t.Errorf("malformed trace: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestSimulateExample(t *testing.T) {
	code, out, errOut := runCmd(t, "", "simulate", "--config", "../../examples/rules.yaml", "--trace", "../../examples/trace.jsonl")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if n := strings.Count(out, "\n"); n != 11 {
		t.Errorf("%d output lines, want 11", n)
	}
	plot := filepath.Join(t.TempDir(), "plot.svg")
	if code, _, errOut := runCmd(t, "", "simulate", "--config", "../../examples/rules.yaml", "--trace", "../../examples/trace.jsonl", "--plot", plot); code != 0 {
		t.Fatalf("--plot: exit %d: %s", code, errOut)
	}
	svg, err := os.ReadFile(plot)
	if err != nil || !strings.HasPrefix(string(svg), "<svg ") || !strings.Contains(string(svg), `data-rule="auth.user"`) {
		t.Errorf("--plot wrote %d bytes (%v), want an SVG with the rule auth.user", len(svg), err)
	}
	// The docs show this plot: it is kept as the command draws it.
	const shown = "../../docs/images/simulate-example.svg"
	if *updateImages {
		if err := os.WriteFile(shown, svg, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if doc, err := os.ReadFile(shown); err != nil || string(doc) != string(svg) {
		t.Errorf("%s is not what simulate --plot draws of the examples (%v): go test ./cmd/sluice -run TestSimulateExample -update-images", shown, err)
	}
}

// updateImages rewrites the docs' images that tests draw.
var updateImages = flag.Bool("update-images", false, "rewrite docs/images from what the tests draw")

func TestUsage(t *testing.T) {
	if code, _, _ := runCmd(t, ""); code != 2 {
		t.Errorf("no command: exit %d", code)
	}
	if code, _, _ := runCmd(t, "", "frobnicate"); code != 2 {
		t.Errorf("unknown command: exit %d", code)
	}
	if code, _, _ := runCmd(t, "", "simulate", "--help"); code != 0 {
		t.Errorf("--help: exit %d", code)
	}
	if code, _, _ := runCmd(t, "", "simulate", "--config", "x", "--trace", "y", "extra"); code != 2 {
		t.Errorf("extra argument: exit %d", code)
	}
}

// TestBadFlagIsOneLine: a bad flag, a missing required flag or a stray
// argument prints the problem and a hint, not the whole usage, which only
// -h prints.
func TestBadFlagIsOneLine(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--bogus"},
		{"serve", "--config"},
		{"serve"},
		{"proxy", "--listen"},
		{"proxy", "--nope", "1"},
		{"check", "--config", "x", "stray"},
		{"simulate", "--trace"},
		{"bench", "--bogus"},
		{"nullserver", "--bogus"},
		{"nullapi", "--bogus"},
		{"plainproxy", "--bogus"},
		{"explain", "--bogus"},
		{"check", "--bogus"},
		{"version", "--bogus"},
	} {
		code, stdout, stderr := runCmd(t, "", args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		hint := "Run 'sluice " + args[0] + " -h' for its flags."
		if code != 2 || stdout != "" || len(lines) != 2 || !strings.HasPrefix(lines[0], "sluice "+args[0]+": ") || lines[1] != hint {
			t.Errorf("%q: exit %d, stdout %q, stderr:\n%s\nwant exit 2, a line and %q", args, code, stdout, stderr, hint)
		}
	}
}

// TestHelp: every command's --help (and -h, -help, and sluice help
// COMMAND) exits 0 and prints on stdout a usage in the one style of
// sluice's: "Usage: sluice COMMAND", then the flags as --name under a
// heading, never the flag package's "Usage of", in at most 80 lines of at
// most 80 columns; so do sluice override's subcommands.
func TestHelp(t *testing.T) {
	check := func(args []string, name string, wantFlags bool) {
		t.Helper()
		code, stdout, stderr := runCmd(t, "", args...)
		switch {
		case code != 0 || stderr != "":
			t.Errorf("%q: exit %d, stderr %q; want 0 and nothing", args, code, stderr)
		case !strings.HasPrefix(stdout, "Usage: sluice "+name):
			t.Errorf("%q: stdout does not start with %q:\n%s", args, "Usage: sluice "+name, stdout)
		case strings.Contains(stdout, "Usage of") || strings.Contains(stdout, "\n  -") && !strings.Contains(stdout, "\n  --"):
			t.Errorf("%q: the flag package's usage:\n%s", args, stdout)
		case wantFlags && !regexp.MustCompile(`\n\n[A-Z][^\n]*:\n  --`).MatchString(stdout):
			t.Errorf("%q: no flags listed under a heading:\n%s", args, stdout)
		case strings.Count(stdout, "\n") > 80:
			t.Errorf("%q: %d lines, want at most 80:\n%s", args, strings.Count(stdout, "\n"), stdout)
		}
		for _, line := range strings.Split(stdout, "\n") {
			if len([]rune(line)) > 80 && strings.Contains(strings.TrimSpace(line), " ") { // a word too long stays whole
				t.Errorf("%q: a line of %d columns, want at most 80: %q", args, len([]rune(line)), line)
			}
		}
	}
	names := append(slices.Sorted(maps.Keys(commands)), "version")
	for _, name := range names {
		flags := name != "version" && name != "override"
		for _, h := range []string{"--help", "-h", "-help"} {
			check([]string{name, h}, name, flags)
		}
		check([]string{"help", name}, name, flags)
	}
	subs := []string{"set", "get", "list", "rm", "import", "export"}
	for _, sub := range subs {
		check([]string{"override", sub, "--help"}, "override "+sub, true)
		check([]string{"override", "help", sub}, "override "+sub, true)
	}
	_, stdout, _ := runCmd(t, "", "override", "--help")
	for _, sub := range subs {
		if !strings.Contains(stdout, "sluice override "+sub) {
			t.Errorf("sluice override --help does not list %s:\n%s", sub, stdout)
		}
	}
	_, usage, _ := runCmd(t, "", "--help")
	for _, line := range strings.Split(usage, "\n") {
		if len([]rune(line)) > 80 {
			t.Errorf("sluice --help: a line of %d columns, want at most 80: %q", len([]rune(line)), line)
		}
	}
	if code, _, stderr := runCmd(t, ""); code != 2 || !strings.Contains(stderr, "Usage:") {
		t.Errorf("no command: exit %d, stderr %q; want 2 and the usage", code, stderr)
	}
	if code, _, stderr := runCmd(t, "", "override"); code != 2 || !strings.Contains(stderr, "Usage: sluice override") {
		t.Errorf("override alone: exit %d, stderr %q; want 2 and its usage", code, stderr)
	}
	if code, _, stderr := runCmd(t, "", "override", "frob"); code != 2 || !strings.Contains(stderr, `unknown subcommand "frob"`) {
		t.Errorf("override frob: exit %d, stderr %q", code, stderr)
	}
	if code, _, stderr := runCmd(t, "", "help", "frob"); code != 2 || !strings.Contains(stderr, `unknown command "frob"`) {
		t.Errorf("help frob: exit %d, stderr %q", code, stderr)
	}
}

// TestHelpAll: every command's --help-all (and sluice override's
// subcommands') exits 0 and lists on stdout every flag of the FlagSet the
// command parses with, with its environment variables where the command
// reads them; --help lists those it does not show as so many more.
func TestHelpAll(t *testing.T) {
	for _, name := range slices.Sorted(maps.Keys(commands)) {
		for _, h := range commandHelps(name) {
			args := append(strings.Fields(h.fs.Name()), "--help-all")
			code, stdout, stderr := runCmd(t, "", args...)
			if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "Usage: sluice "+h.fs.Name()) {
				t.Errorf("%q: exit %d, stderr %q, stdout:\n%s", args, code, stderr, stdout)
				continue
			}
			n := 0
			h.fs.VisitAll(func(f *flag.Flag) {
				n++
				if !regexp.MustCompile(`\n  --` + f.Name + `( |\n)`).MatchString(stdout) {
					t.Errorf("%q does not list --%s", args, f.Name)
				}
				if v := h.env.variable(f.Name); v != "" && !strings.Contains(stdout, v) {
					t.Errorf("%q does not name %s, the variable of --%s", args, v, f.Name)
				}
				for _, v := range h.env.envoy[f.Name].names {
					if !strings.Contains(stdout, v) {
						t.Errorf("%q does not name %s, a variable of --%s", args, v, f.Name)
					}
				}
			})
			_, short, _ := runCmd(t, "", append(args[:len(args)-1], "--help")...)
			shown := strings.Count(short, "\n  --")
			more := fmt.Sprintf("\n%d more flags", n-shown)
			if shown < n && !strings.Contains(short, more) {
				t.Errorf("%s --help shows %d of %d flags and does not say %q:\n%s", h.fs.Name(), shown, n, more, short)
			}
		}
	}
}

// TestCheckSyntaxErrorLine: sluice check reports a YAML syntax error at
// the line of the fault, for the rules and for a proxy's file alike.
func TestCheckSyntaxErrorLine(t *testing.T) {
	for _, c := range []struct {
		src  string
		want string
	}{
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second\n", "f.yaml:4: invalid YAML"},
		{"domain: d\ndescriptors:\n  - key: a\n   bad: x\n", "f.yaml:4: invalid YAML"},
		{"# rules\ndomain: d\ndescriptors:\n  - key: a\n    value: x\n  - key: b\n value: y\n", "f.yaml:7: invalid YAML"},
		{"domain: d\nhttp:\n  routes:\n   - pattern: /a\n  x\n", "f.yaml:5: invalid YAML"},
		{"domain: d: e\n", "f.yaml:1: invalid YAML"},
	} {
		code, _, errOut := runCmd(t, "", "check", "--config", writeFile(t, "f.yaml", c.src))
		if code != 1 || !strings.Contains(errOut, c.want) {
			t.Errorf("%q: exit %d, stderr %q, want %q", c.src, code, errOut, c.want)
		}
	}
}

// TestCheckWarningsWithErrors: sluice check prints the warnings of the
// rules even when they have errors, of a bad file and of the good files
// beside it.
func TestCheckWarningsWithErrors(t *testing.T) {
	bad := writeFile(t, "bad.yaml", `domain: d
descriptors:
  - key: a
    rate_limit: {unit: fortnight, requests_per_unit: 1}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 1, burst: 5}
`)
	code, _, errOut := runCmd(t, "", "check", "--config", bad)
	if code != 1 || !strings.Contains(errOut, "bad.yaml:4:") || !strings.Contains(errOut, "warning: "+bad+":6:") {
		t.Errorf("one file: exit %d, stderr:\n%s\nwant the problem of line 4 and the warning of line 6", code, errOut)
	}
	dir := t.TempDir()
	writeRules(t, filepath.Join(dir, "a.yaml"), "domain: a\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	writeRules(t, filepath.Join(dir, "b.yaml"), "domain: b\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 5}\n")
	code, _, errOut = runCmd(t, "", "check", "--config", dir)
	if code != 1 || !strings.Contains(errOut, "a.yaml:4:") || !strings.Contains(errOut, "warning: "+filepath.Join(dir, "b.yaml")+":4:") {
		t.Errorf("directory: exit %d, stderr:\n%s\nwant a.yaml's problem and b.yaml's warning", code, errOut)
	}
	proxyFile := writeFile(t, "proxy.yaml", "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 5}\nhttp:\n  routes:\n    - pattern: get /x\n")
	code, _, errOut = runCmd(t, "", "check", "--config", proxyFile)
	if code != 1 || !strings.Contains(errOut, "proxy.yaml:7:") || !strings.Contains(errOut, "warning: "+proxyFile+":4:") {
		t.Errorf("a bad http section: exit %d, stderr:\n%s\nwant its problem and the rules' warning", code, errOut)
	}
}

// TestCheckConcurrency: a rule with a concurrency limit checks OK (exit
// 0: sluice proxy takes it) with a warning naming the rule and the switch
// sluice serve needs for it, --stream-done-release, without which serve
// refuses the same file.
func TestCheckConcurrency(t *testing.T) {
	file := writeFile(t, "conc.yaml", `domain: llm
descriptors:
  - key: api_key
    concurrency: {max: 4}
    rate_limit: {unit: minute, requests_per_unit: 600}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 60}
`)
	code, out, errOut := runCmd(t, "", "check", "--config", file)
	if code != 0 || !strings.Contains(out, "OK") {
		t.Errorf("exit %d, %q", code, out)
	}
	if !strings.Contains(errOut, "warning: "+file+":3:") || !strings.Contains(errOut, "rule llm.api_key has a concurrency limit") ||
		!strings.Contains(errOut, "--stream-done-release") || strings.Count(errOut, "warning:") != 1 {
		t.Errorf("stderr:\n%s\nwant one warning naming line 3, llm.api_key and --stream-done-release", errOut)
	}
	if code, _, errOut := runCmd(t, "", "serve", "--config", file, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", "127.0.0.1:0"); code != 1 || !strings.Contains(errOut, "--stream-done-release") {
		t.Errorf("sluice serve without --stream-done-release: exit %d, %q", code, errOut)
	}
}

// TestCheckFailureConcurrency: a route whose failure descriptor reaches a
// rule with a concurrency limit is a problem of the file (exit 1) for
// sluice check, at the descriptor's line, naming the route, the
// descriptor and the rule; and sluice proxy refuses to start on it.
func TestCheckFailureConcurrency(t *testing.T) {
	file := writeFile(t, "login.yaml", strings.Replace(failureRoutes, "RULES", failureConcurrency, 1))
	want := []string{file + ":8:23:", `route "login": failures.descriptors[0] {failed_login: <request>} can reach rule api.failed_login (line 10), which has a concurrency limit`}
	code, _, errOut := runCmd(t, "", "check", "--config", file)
	for _, w := range want {
		if code != 1 || !strings.Contains(errOut, w) {
			t.Errorf("sluice check: exit %d, stderr:\n%s\nwant exit 1 and %q", code, errOut, w)
		}
	}
	// A proxy that started would run until its context ends.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	code = run(ctx, []string{"proxy", "--config", file, "--upstream", "http://127.0.0.1:1", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, strings.NewReader(""), io.Discard, &stderr)
	if errOut = stderr.String(); code != 1 || !strings.Contains(errOut, want[1]) {
		t.Errorf("sluice proxy: exit %d, stderr:\n%s\nwant exit 1 and %q", code, errOut, want[1])
	}
}

// TestMissingConfigFailsBeforeStarting: serve and proxy stop on a
// --config that does not exist before they log that they start, and say
// which.
func TestMissingConfigFailsBeforeStarting(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nonexistent.yaml")
	for _, args := range [][]string{
		{"serve", "--config", missing},
		{"serve", "--config", missing, "--log-format", "json"},
		{"proxy", "--config", missing, "--upstream", "http://127.0.0.1:1"},
	} {
		code, _, stderr := runCmd(t, "", args...)
		if code != 1 || strings.Contains(stderr, "starting") || !strings.Contains(stderr, "--config "+missing+": no such file or directory") {
			t.Errorf("%q: exit %d, stderr:\n%s\nwant exit 1, the missing file named, and no \"starting\"", args, code, stderr)
		}
	}
}

// TestReadmeListsEveryCommand: the README's table of commands names every
// command sluice --help lists, and no other.
func TestReadmeListsEveryCommand(t *testing.T) {
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Commands\n")
	if !ok {
		t.Fatal("README.md has no ## Commands section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var inReadme []string
	for _, line := range strings.Split(section, "\n") {
		if rest, ok := strings.CutPrefix(line, "| `sluice "); ok {
			name, _, _ := strings.Cut(rest, " ")
			name, _, _ = strings.Cut(name, "`")
			inReadme = append(inReadme, name)
		}
	}
	_, help, _ := runCmd(t, "", "--help")
	var listed []string
	for _, line := range strings.Split(help, "\n") {
		if rest, ok := strings.CutPrefix(line, "  sluice "); ok {
			name, _, _ := strings.Cut(rest, " ")
			listed = append(listed, name)
		}
	}
	slices.Sort(inReadme)
	slices.Sort(listed)
	if len(listed) < len(commands) || !slices.Equal(inReadme, listed) {
		t.Errorf("README.md's commands %q, sluice --help's %q", inReadme, listed)
	}
}

// TestExplainFromRules: sluice explain --config explains from a rules file
// alone, with no server, token or overrides file: the rule reached, its
// limits, and with --at the schedule window in force then; a bad file or
// time is refused with the reason.
func TestExplainFromRules(t *testing.T) {
	rules := writeFile(t, "rules.yaml", `domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
    schedules:
      - name: night
        from: "01:00"
        to: "06:00"
        tz: UTC
        rate_limit: {unit: minute, requests_per_unit: 5}
`)
	explain := func(args ...string) (int, map[string]any, string) {
		t.Helper()
		code, out, errOut := runCmd(t, "", append([]string{"explain", "--config", rules, "--domain", "api"}, args...)...)
		var got map[string]any
		if code == 0 {
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("output is not JSON: %v\n%s", err, out)
			}
		}
		return code, got, errOut
	}
	limitOf := func(e map[string]any) map[string]any {
		t.Helper()
		descs, _ := e["descriptors"].([]any)
		if len(descs) != 1 {
			t.Fatalf("descriptors: %v", e)
		}
		d := descs[0].(map[string]any)
		ls, _ := d["limits"].([]any)
		if d["status"] != "limited" || d["stat_key"] != "api.user" || len(ls) != 1 {
			t.Fatalf("descriptor: %v", d)
		}
		l := ls[0].(map[string]any)
		if _, ok := l["state"]; ok {
			t.Errorf("a rules file has no counters, but a state is shown: %v", l)
		}
		return l
	}
	code, day, errOut := explain("--at", "2026-12-01T12:00:00Z", "user=bob")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if l := limitOf(day); l["rate"] != 100.0 {
		t.Errorf("at noon: %v, want the rule's 100", l)
	}
	code, night, errOut := explain("--at", "2026-12-01T02:00:00Z", "user=bob")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if l := limitOf(night); l["rate"] != 5.0 {
		t.Errorf("at 02:00: %v, want the night window's 5", l)
	}
	if code, _, errOut := explain("--at", "tomorrow", "user=bob"); code == 0 || !strings.Contains(errOut, "--at") {
		t.Errorf("a bad --at: exit %d, %q", code, errOut)
	}
	bad := writeFile(t, "bad.yaml", "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	if code, _, errOut := runCmd(t, "", "explain", "--config", bad, "--domain", "api", "user=bob"); code != 1 || !strings.Contains(errOut, "sluice check --config") {
		t.Errorf("a bad rules file: exit %d, %q", code, errOut)
	}
	if code, _, errOut := runCmd(t, "", "explain", "--domain", "api", "--at", "2026-12-01T02:00:00Z", "user=bob"); code != 2 || !strings.Contains(errOut, "--at needs --config") {
		t.Errorf("--at without --config: exit %d, %q", code, errOut)
	}
}

// TestNoRulesFilesRefused: a rules directory without a rules file (empty,
// or holding "rules" without an extension) stops sluice serve before it
// listens, and sluice check exits 1, naming the files it ignored, as a
// reload to that state is refused; started as ratelimit, with envoy-rl's
// RUNTIME_ROOT and RUNTIME_SUBDIRECTORY, likewise.
func TestNoRulesFilesRefused(t *testing.T) {
	empty := t.TempDir()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "rl", "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeRules(t, filepath.Join(root, "rl", "config", "rules"), "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	named := filepath.Join(root, "rl", "config")
	for _, dir := range []string{empty, named} {
		code, out, errOut := runCmd(t, "", "check", "--config", dir)
		if code != 1 || strings.Contains(out, "OK") || !strings.Contains(errOut, "no rules files") {
			t.Errorf("check %s: exit %d, stdout %q, stderr %q; want exit 1 and no rules files", dir, code, out, errOut)
		}
		code, _, errOut = runCmd(t, "", "serve", "--config", dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", "")
		if code != 1 || strings.Contains(errOut, "listening") || !strings.Contains(errOut, "no rules files") {
			t.Errorf("serve %s: exit %d, stderr:\n%s\nwant exit 1 before listening", dir, code, errOut)
		}
	}
	var stderr bytes.Buffer
	err := cmdServe(context.Background(), nil, envMap(map[string]string{
		"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "rl", "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0", "HOST": "127.0.0.1", "PORT": "0",
	}), &stderr)
	if err == nil || !strings.Contains(err.Error(), `"rules" has no .yaml or .yml extension`) || strings.Contains(stderr.String(), "listening") {
		t.Errorf("ratelimit with RUNTIME_ROOT: %v, log:\n%s\nwant the ignored file named, before listening", err, &stderr)
	}
}
