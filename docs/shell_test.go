package docs

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A script is the blocks of one Markdown file that carry the same run=NAME
// attribute: its sh blocks run in order as one bash script, and its other
// blocks with file=NAME are written to those files first.
type script struct {
	doc, name string
	repo      bool              // cwd=repo: run at the repository root
	files     map[string]string // file name -> contents
	fileLines map[string]int
	sh        []block
}

// userDocs are the Markdown files users read: README.md and docs/*.md, not
// docs/internals/ or docs/reference/.
func userDocs(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{filepath.Join("..", "README.md")}, docs...)
}

// attrs returns the attributes (key=value words after the language, and
// bare words as keys with no value) of the fence that opens on line n of
// path.
func attrs(t *testing.T, path string, n int) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for i := 1; sc.Scan(); i++ {
		if i != n {
			continue
		}
		out := map[string]string{}
		words := strings.Fields(strings.TrimPrefix(sc.Text(), "```"))
		for _, w := range words[min(1, len(words)):] {
			k, v, _ := strings.Cut(w, "=")
			out[k] = v // a bare word is a key with no value
		}
		return out
	}
	t.Fatalf("%s:%d: no such line", path, n)
	return nil
}

// scripts gathers the run= scripts of the Markdown file path.
func scripts(t *testing.T, path string) []*script {
	t.Helper()
	byName := map[string]*script{}
	var order []string
	for _, b := range blocks(t, path) {
		a := attrs(t, path, b.line)
		name, ok := a["run"]
		if !ok {
			continue
		}
		s := byName[name]
		if s == nil {
			s = &script{doc: path, name: name, files: map[string]string{}, fileLines: map[string]int{}}
			byName[name] = s
			order = append(order, name)
		}
		if a["cwd"] == "repo" {
			s.repo = true
		}
		switch {
		case a["file"] != "":
			f := a["file"]
			if filepath.IsAbs(f) || strings.Contains(f, "..") {
				t.Fatalf("%s:%d: file=%s must be a relative name inside the script's directory", path, b.line, f)
			}
			if _, dup := s.files[f]; dup {
				t.Fatalf("%s:%d: run=%s writes file=%s twice (first at line %d)", path, b.line, name, f, s.fileLines[f])
			}
			s.files[f], s.fileLines[f] = b.text, b.line
		case b.lang == "sh" || b.lang == "bash" || b.lang == "shell":
			s.sh = append(s.sh, b)
		default:
			t.Fatalf("%s:%d: a %q block with run=%s needs file=NAME (only sh blocks are run)", path, b.line, b.lang, name)
		}
	}
	out := make([]*script, 0, len(order))
	for _, n := range order {
		s := byName[n]
		if len(s.sh) == 0 {
			t.Fatalf("%s: run=%s has files but no sh block to run", path, n)
		}
		if s.repo && len(s.files) > 0 {
			t.Fatalf("%s: run=%s runs at the repository root (cwd=repo) and cannot also write files there", path, n)
		}
		out = append(out, s)
	}
	return out
}

// TestShell runs every run= script of the user docs, side by side (see
// TestMain), each in a new directory (or at the repository root with cwd=repo), with
// the sluice binary built from this tree first on PATH, on free ports
// (moveToFreePorts) while every port the docs name is held by a server
// that is not sluice: so the scripts pass beside whatever a reader runs
// on those ports, and cannot pass by talking to it. A script fails when a
// command fails (bash -euo pipefail), and when what it started still
// runs after it ended: a walkthrough says how to stop what it starts, and
// its test stops it that way. What is left is killed.
func TestShell(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the docs' commands")
	}
	t.Parallel()
	all := docScripts(t)
	bash, bin, repo := shellTools(t)
	held := map[int]*holder{}
	for _, s := range all {
		for _, p := range docPorts(s) {
			if _, ok := held[p]; !ok {
				// 503: a script that asks it cannot take it for its own server.
				held[p] = holdPort(t, p, http.StatusServiceUnavailable) // nil when taken already: held all the same
			}
		}
	}
	for _, s := range all {
		t.Run(strings.TrimSuffix(filepath.Base(s.doc), ".md")+"/"+s.name, func(t *testing.T) {
			t.Parallel()
			before := map[int]int{}
			for p, h := range held {
				if h != nil {
					before[p] = h.count()
				}
			}
			r := moveToFreePorts(t, s)
			if err := runScript(t, bash, bin, repo, s, r, leftGrace); err != nil {
				t.Fatal(err)
			}
			for _, p := range slices.Sorted(maps.Keys(before)) {
				if asked := held[p].asked(before[p]); len(asked) > 0 {
					t.Logf("the port %d, held by the test, was asked %q while this script ran (by it, or by another program)", p, asked)
				}
			}
		})
	}
}

// docScripts are the run= scripts of the user docs; it also fails the
// test for a shell block no test runs, and for a server started in the
// background that is not waited for with sluice ready.
func docScripts(t *testing.T) []*script {
	t.Helper()
	var all []*script
	for _, doc := range userDocs(t) {
		all = append(all, scripts(t, doc)...)
		for _, p := range notRun(t, doc) {
			t.Error(p)
		}
	}
	if len(all) == 0 {
		t.Fatal("no run= blocks in the docs: their commands are not run")
	}
	for _, s := range all {
		for _, p := range notWaited(s) {
			t.Error(p)
		}
	}
	return all
}

// shellBuild is the sluice binary the scripts run, built once for the
// tests that run them, and removed by TestMain.
var shellBuild struct {
	once sync.Once
	bin  string
	err  error
}

// TestMain runs the tests that call t.Parallel (the scripts of TestShell
// and TestShellPortTaken, TestShellStop's, TestReadmeGo's builds and
// TestThreatsNameRealTests's reading) more at once than the machine has
// cores, the default of -parallel: the scripts spend their time waiting
// (for servers to start and stop, for the next window in regions.md)
// more than computing, each on ports and in a directory of its own, and
// the longest should not wait for a turn behind the others. -parallel,
// when given, wins.
func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		flag.Set("test.parallel", "16")
	}
	code := m.Run()
	if shellBuild.bin != "" {
		os.RemoveAll(shellBuild.bin)
	}
	os.Exit(code)
}

// shellTools returns bash, the directory of the sluice binary built from
// this tree (once per test binary), and the repository's root.
func shellTools(t *testing.T) (bash, bin, repo string) {
	t.Helper()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatalf("bash: %v", err)
	}
	shellBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "sluice-docs-")
		if err != nil {
			shellBuild.err = err
			return
		}
		build := exec.Command("go", "build", "-o", dir, "./cmd/sluice", "./cmd/geoipdb")
		build.Dir = ".."
		if out, err := build.CombinedOutput(); err != nil {
			shellBuild.err = fmt.Errorf("go build ./cmd/sluice ./cmd/geoipdb: %v\n%s", err, out)
		}
		shellBuild.bin = dir
	})
	if shellBuild.err != nil {
		t.Fatal(shellBuild.err)
	}
	repo, err = filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return bash, shellBuild.bin, repo
}

// background is a command sent to the background: a line ending in &
// (not &&), before any comment.
var background = regexp.MustCompile(`[^&]&\s*(#.*)?$`)

// notWaited lists the commands of s sent to the background that the
// next command does not wait for with sluice ready (a pid=$! between
// them aside): each must, so that a walkthrough never goes on while its
// server starts, or has failed to, and another answers in its place.
func notWaited(s *script) (problems []string) {
	for _, b := range s.sh {
		lines := strings.Split(b.text, "\n")
		for i, line := range lines {
			if !background.MatchString(line) {
				continue
			}
			next := ""
			for _, l := range lines[i+1:] {
				l = strings.TrimSpace(l)
				if l == "" || strings.HasPrefix(l, "#") || savePid.MatchString(l) {
					continue
				}
				next = l
				break
			}
			if !strings.Contains(next, "sluice ready ") {
				problems = append(problems, fmt.Sprintf("%s:%d: %q runs in the background, and the next command, %q, is not sluice ready: wait for it (sluice ready $!)",
					s.doc, b.line+1+i, strings.TrimSpace(line), next))
			}
		}
	}
	return problems
}

// savePid is a line that keeps $! for later: serve=$!.
var savePid = regexp.MustCompile(`^\w+=\$!$`)

// notRun lists the shell blocks of doc that no test runs: a block without
// run= must be marked ci, and be what .ci/run executes (the test suite,
// which CI runs and a test cannot run inside itself).
func notRun(t *testing.T, doc string) (problems []string) {
	t.Helper()
	ci, err := os.ReadFile(filepath.Join("..", ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks(t, doc) {
		if b.lang != "sh" && b.lang != "bash" && b.lang != "shell" && b.lang != "console" {
			continue
		}
		a := attrs(t, doc, b.line)
		if _, ok := a["run"]; ok {
			continue
		}
		if _, ok := a["ci"]; !ok {
			problems = append(problems, fmt.Sprintf("%s:%d: a shell block that no test runs (give it run=NAME)", doc, b.line))
			continue
		}
		for _, line := range strings.Split(b.text, "\n") {
			if cmd := strings.TrimSpace(line); cmd != "" && !strings.HasPrefix(cmd, "#") && !strings.Contains(string(ci), "exec "+cmd+"\n") {
				problems = append(problems, fmt.Sprintf("%s:%d: %q is marked ci, but .ci/run does not exec it", doc, b.line, cmd))
			}
		}
	}
	return problems
}

// scriptTimeout bounds one script: its servers start, answer a few
// requests and are killed.
const scriptTimeout = 3 * time.Minute

// leftGrace bounds how long a script's servers may take to stop once
// it has ended, after the stop it says.
const leftGrace = 30 * time.Second

// runScript runs s as r moves it, and says why it failed; with a grace,
// also when what it started still runs that long after it ended.
func runScript(t *testing.T, bash, bin, repo string, s *script, r *onFreePorts, grace time.Duration) error {
	if s.repo {
		// It writes at the repository root (bin/sluice, bin/xds-rules.log),
		// and TestShell and TestShellPortTaken run side by side: never
		// twice at once.
		mu := repoScript(s)
		mu.Lock()
		defer mu.Unlock()
	}
	dir := t.TempDir()
	names := make([]string, 0, len(r.files))
	for n := range r.files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		p := filepath.Join(dir, n)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(r.files[n]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var src strings.Builder
	src.WriteString("set -euo pipefail\n")
	for _, b := range r.sh {
		fmt.Fprintf(&src, "echo '>>> %s:%d' >&2\n%s", s.doc, b.line, b.text)
	}
	// The output goes to a file, not a pipe, so that a server left in the
	// background cannot hold Wait open.
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	ctx, cancel := context.WithTimeout(context.Background(), scriptTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bash, "-c", src.String())
	cmd.Dir = dir
	if s.repo {
		cmd.Dir = repo
	}
	cmd.Env = append(r.env, "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	runErr := cmd.Run()
	var left []string
	if runErr == nil && grace > 0 {
		left = leftBehind(cmd.Process.Pid, r.ports, grace)
	}
	// Whatever the script started in the background goes with it.
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	log, _ := os.ReadFile(out.Name())
	switch {
	case runErr != nil:
		if ctx.Err() != nil {
			runErr = fmt.Errorf("still running after %v", scriptTimeout)
		}
		return fmt.Errorf("%s: run=%s: %v\n%s", s.doc, s.name, runErr, tail(string(log), 80))
	case len(left) > 0:
		return fmt.Errorf("%s: run=%s: still running %v after the script ended, though it stops what it starts as the doc says:\n  %s\n%s",
			s.doc, s.name, grace, strings.Join(left, "\n  "), tail(string(log), 40))
	}
	return nil
}

// repoScripts holds a lock for each script that runs at the repository
// root (cwd=repo), by its doc and name.
var repoScripts sync.Map

func repoScript(s *script) *sync.Mutex {
	mu, _ := repoScripts.LoadOrStore(s.doc+" run="+s.name, new(sync.Mutex))
	return mu.(*sync.Mutex)
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// The runner fails a script whose command fails, names the block, and does
// not wait for what a script leaves in the background.
func TestShellRunner(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatalf("bash: %v", err)
	}
	doc := filepath.Join(t.TempDir(), "doc.md")
	md := "```yaml file=conf/a.yaml run=ok\nx: 1\n```\n\n" +
		"```sh run=ok\nsleep 600 &\ngrep -q 'x: 1' conf/a.yaml\n```\n\n" +
		"```sh run=ok\ntest \"$(pwd)\" != /\n```\n\n" +
		"```sh\nnot run\n```\n\n" +
		"```sh run=bad\ntrue\nfalse\necho unreachable\n```\n"
	if err := os.WriteFile(doc, []byte(md), 0o644); err != nil {
		t.Fatal(err)
	}
	got := scripts(t, doc)
	if len(got) != 2 || got[0].name != "ok" || len(got[0].sh) != 2 || got[0].files["conf/a.yaml"] != "x: 1\n" || got[1].name != "bad" {
		t.Fatalf("scripts: %+v", got)
	}
	noPorts := func(s *script) *onFreePorts {
		return &onFreePorts{sh: s.sh, files: s.files, env: os.Environ(), ports: map[int]int{}}
	}
	start := time.Now()
	if err := runScript(t, bash, t.TempDir(), "/", got[0], noPorts(got[0]), 0); err != nil {
		t.Errorf("run=ok: %v", err)
	}
	if d := time.Since(start); d > time.Minute {
		t.Errorf("run=ok took %v: the runner waited for its background job", d)
	}
	err = runScript(t, bash, t.TempDir(), "/", got[1], noPorts(got[1]), 0)
	if err == nil || !strings.Contains(err.Error(), "doc.md:18") || strings.Contains(err.Error(), "unreachable") {
		t.Errorf("run=bad: %v, want a failure naming the block at line 18", err)
	}
	// The block at line 14 runs nowhere; one marked ci must be .ci/run's.
	md += "\n```sh ci\nscripts/test\n```\n\n```sh ci\nmake everything\n```\n"
	if err := os.WriteFile(doc, []byte(md), 0o644); err != nil {
		t.Fatal(err)
	}
	probs := strings.Join(notRun(t, doc), "\n")
	if !strings.Contains(probs, "doc.md:14: a shell block that no test runs") || !strings.Contains(probs, `"make everything" is marked ci`) || strings.Contains(probs, "scripts/test") {
		t.Errorf("notRun:\n%s\nwant the block at line 14 and make everything, not scripts/test", probs)
	}
}
