package reload

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rules"
)

// The watcher reacts to real file system events, which testing/synctest
// cannot fake: the tests wait for its callbacks, each wait bounded.
const patience = 10 * time.Second

// rulesFor is a rules file of domain whose one rule allows rate per second.
func rulesFor(domain string, rate int) string {
	return fmt.Sprintf("domain: %s\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: %d}\n", domain, rate)
}

// rateOf returns the rate of the one rule of domain in c, or -1.
func rateOf(c *rules.Config, domain string) int64 {
	d := c.Domain(domain)
	if d == nil || len(d.Rules) == 0 || len(d.Rules[0].Limits) == 0 {
		return -1
	}
	return d.Rules[0].Limits[0].Rate
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// logBuffer collects the watcher's log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type harness struct {
	w     *Watcher
	loads chan *rules.Config
	errs  chan error
	logs  *logBuffer
}

// start runs a watcher of path until the test ends.
func start(t *testing.T, path string, tune func(*Config)) *harness {
	t.Helper()
	h := &harness{loads: make(chan *rules.Config, 16), errs: make(chan error, 16), logs: &logBuffer{}}
	cfg := Config{
		Path:     path,
		Logger:   slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		OnLoad:   func(c *rules.Config) { h.loads <- c },
		OnError:  func(err error) { h.errs <- err },
		Debounce: 20 * time.Millisecond,
		Resync:   -1, // the tests prove the events, not the safety net
	}
	if tune != nil {
		tune(&cfg)
	}
	w, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.w = w
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		if t.Failed() {
			t.Logf("watcher log:\n%s", h.logs)
		}
	})
	return h
}

// waitLoad waits for a new config for which ok holds, skipping others (a
// burst may load an intermediate state).
func (h *harness) waitLoad(t *testing.T, ok func(*rules.Config) bool) *rules.Config {
	t.Helper()
	deadline := time.After(patience)
	for {
		select {
		case c := <-h.loads:
			if ok(c) {
				if h.w.Current() != c {
					t.Fatal("OnLoad's config is not Current")
				}
				return c
			}
		case err := <-h.errs:
			t.Logf("reload failed on the way: %v", err)
		case <-deadline:
			t.Fatalf("no reload within %s; current hash %s", patience, h.w.Current().Hash())
			return nil
		}
	}
}

func (h *harness) waitErr(t *testing.T) error {
	t.Helper()
	select {
	case err := <-h.errs:
		return err
	case c := <-h.loads:
		t.Fatalf("loaded %v, want a failure", c.Domains())
	case <-time.After(patience):
		t.Fatalf("no failed reload within %s", patience)
	}
	return nil
}

// waitLog waits until the log holds want n times.
func (h *harness) waitLog(t *testing.T, want string, n int) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for strings.Count(h.logs.String(), want) < n {
		if time.Now().After(deadline) {
			t.Fatalf("log lacks %d × %q", n, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func rate(domain string, want int64) func(*rules.Config) bool {
	return func(c *rules.Config) bool { return rateOf(c, domain) == want }
}

func TestInPlaceWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	write(t, path, rulesFor("d", 1))
	h := start(t, path, nil)
	if got := rateOf(h.w.Current(), "d"); got != 1 {
		t.Fatalf("initial rate %d", got)
	}
	write(t, path, rulesFor("d", 2))
	h.waitLoad(t, rate("d", 2))

	// Truncate, then write in two pieces: one reload of the final content.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	content := rulesFor("d", 3)
	f.WriteString(content[:10])
	f.WriteString(content[10:])
	f.Close()
	h.waitLoad(t, rate("d", 3))
}

func TestWriteThenRename(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	write(t, path, rulesFor("d", 1))
	h := start(t, path, nil)
	for i := 2; i <= 4; i++ {
		tmp := filepath.Join(dir, fmt.Sprintf(".rules.yaml.%d.swp", i))
		write(t, tmp, rulesFor("d", i))
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
		h.waitLoad(t, rate("d", int64(i)))
	}
}

// configMap lays out dir as the kubelet does for a ConfigMap volume: the
// files in a timestamped directory, a ..data symlink to it, and a symlink
// per key to ..data/key.
type configMap struct {
	t   *testing.T
	dir string
	gen int
}

func newConfigMap(t *testing.T, files map[string]string) *configMap {
	m := &configMap{t: t, dir: t.TempDir()}
	m.update(files)
	for name := range files {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(m.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// update writes a new generation and swaps ..data to it atomically, then
// removes the old one, as the kubelet's atomic writer does.
func (m *configMap) update(files map[string]string) {
	t := m.t
	m.gen++
	ts := fmt.Sprintf("..2026_01_02_03_04_05.%03d", m.gen)
	for name, content := range files {
		write(t, filepath.Join(m.dir, ts, name), content)
	}
	old, _ := os.Readlink(filepath.Join(m.dir, "..data"))
	tmp := filepath.Join(m.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(m.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(m.dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestConfigMapSwap(t *testing.T) {
	t.Run("directory", func(t *testing.T) {
		m := newConfigMap(t, map[string]string{"a.yaml": rulesFor("a", 1), "b.yaml": rulesFor("b", 1)})
		h := start(t, m.dir, nil)
		if got := h.w.Current().Domains(); len(got) != 2 {
			t.Fatalf("domains %v", got)
		}
		for i := 2; i <= 4; i++ {
			m.update(map[string]string{"a.yaml": rulesFor("a", i), "b.yaml": rulesFor("b", 1)})
			h.waitLoad(t, rate("a", int64(i)))
		}
	})
	t.Run("file", func(t *testing.T) {
		m := newConfigMap(t, map[string]string{"rules.yaml": rulesFor("d", 1)})
		h := start(t, filepath.Join(m.dir, "rules.yaml"), nil)
		for i := 2; i <= 4; i++ {
			m.update(map[string]string{"rules.yaml": rulesFor("d", i)})
			h.waitLoad(t, rate("d", int64(i)))
		}
	})
	t.Run("edit in the data directory", func(t *testing.T) {
		// Not what the kubelet does, but what a person with a shell might:
		// the target of the symlink changes, not the symlink.
		m := newConfigMap(t, map[string]string{"rules.yaml": rulesFor("d", 1)})
		h := start(t, m.dir, nil)
		target, err := filepath.EvalSymlinks(filepath.Join(m.dir, "rules.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		write(t, target, rulesFor("d", 7))
		h.waitLoad(t, rate("d", 7))
	})
}

func TestDirectorySymlinkSwap(t *testing.T) {
	// --config names a symlink to a directory, and the symlink is swapped.
	root := t.TempDir()
	write(t, filepath.Join(root, "v1", "r.yaml"), rulesFor("d", 1))
	write(t, filepath.Join(root, "v2", "r.yaml"), rulesFor("d", 2))
	link := filepath.Join(root, "current")
	if err := os.Symlink("v1", link); err != nil {
		t.Fatal(err)
	}
	h := start(t, link, nil)
	tmp := filepath.Join(root, "current.tmp")
	if err := os.Symlink("v2", tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, link); err != nil {
		t.Fatal(err)
	}
	h.waitLoad(t, rate("d", 2))
	// The old target is left alone; an edit of the new one is seen.
	write(t, filepath.Join(root, "v1", "r.yaml"), rulesFor("d", 5))
	write(t, filepath.Join(root, "v2", "r.yaml"), rulesFor("d", 3))
	h.waitLoad(t, rate("d", 3))
}

func TestAncestorSymlinkSwap(t *testing.T) {
	// Envoy's runtime layout: RUNTIME_ROOT is a "current" symlink that a
	// deployment swaps to a new release; the rules sit below it.
	for _, mode := range []string{"directory", "file"} {
		t.Run(mode, func(t *testing.T) {
			root := t.TempDir()
			for i, v := range []string{"v1", "v2"} {
				write(t, filepath.Join(root, v, "ratelimit", "config", "r.yaml"), rulesFor("d", i+1))
			}
			if err := os.Symlink("v1", filepath.Join(root, "current")); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(root, "current", "ratelimit", "config")
			if mode == "file" {
				path = filepath.Join(path, "r.yaml")
			}
			h := start(t, path, nil)
			tmp := filepath.Join(root, "current.tmp")
			if err := os.Symlink("v2", tmp); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, filepath.Join(root, "current")); err != nil {
				t.Fatal(err)
			}
			h.waitLoad(t, rate("d", 2))
		})
	}
}

func TestDeleteAndRecreate(t *testing.T) {
	t.Run("file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "rules.yaml")
		write(t, path, rulesFor("d", 1))
		h := start(t, path, nil)
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		if err := h.waitErr(t); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("error %v, want not-exist", err)
		}
		if rateOf(h.w.Current(), "d") != 1 {
			t.Fatal("a missing file replaced the rules")
		}
		write(t, path, rulesFor("d", 2))
		h.waitLoad(t, rate("d", 2))
	})
	t.Run("directory", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "rules")
		write(t, filepath.Join(dir, "r.yaml"), rulesFor("d", 1))
		h := start(t, dir, nil)
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		h.waitErr(t)
		write(t, filepath.Join(dir, "r.yaml"), rulesFor("d", 2))
		h.waitLoad(t, rate("d", 2))
		// The new directory is watched.
		write(t, filepath.Join(dir, "r.yaml"), rulesFor("d", 3))
		h.waitLoad(t, rate("d", 3))
	})
	t.Run("parent directory", func(t *testing.T) {
		// Two levels gone: the watch climbs to the nearest ancestor and
		// comes back down as they are created.
		top := filepath.Join(t.TempDir(), "etc")
		path := filepath.Join(top, "sluice", "rules.yaml")
		write(t, path, rulesFor("d", 1))
		h := start(t, path, nil)
		if err := os.RemoveAll(top); err != nil {
			t.Fatal(err)
		}
		h.waitErr(t)
		write(t, path, rulesFor("d", 2))
		h.waitLoad(t, rate("d", 2))
		write(t, path, rulesFor("d", 3))
		h.waitLoad(t, rate("d", 3))
	})
}

func TestBadThenFixed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	write(t, path, rulesFor("d", 1))
	h := start(t, path, nil)
	good := h.w.Current()

	write(t, path, `domain: d
descriptors:
  - key: k
    rate_limit: {unit: fortnight, requests_per_unit: 1}
  - key: j
    rate_limit: {unit: second, requests_per_unit: -1}
`)
	err := h.waitErr(t)
	var re *rules.Error
	if !errors.As(err, &re) || len(re.Problems) != 2 {
		t.Fatalf("error %v, want a *rules.Error with 2 problems", err)
	}
	if h.w.Current() != good {
		t.Fatal("a bad file replaced the rules")
	}
	logs := h.logs.String()
	for _, want := range []string{"line=4", "fortnight", "line=6", "rules reload rejected"} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}

	write(t, path, "domain: d\ndescriptors: [oops\n")
	if err := h.waitErr(t); !errors.As(err, &re) || !strings.Contains(err.Error(), "invalid YAML") {
		t.Fatalf("error %v, want invalid YAML", err)
	}

	write(t, path, rulesFor("d", 9))
	h.waitLoad(t, rate("d", 9))
}

func TestDirectoryOfDomains(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), rulesFor("a", 1))
	write(t, filepath.Join(dir, "b.yml"), rulesFor("b", 1))
	write(t, filepath.Join(dir, "notes.txt"), "not rules")
	h := start(t, dir, nil)
	if got := h.w.Current().Domains(); fmt.Sprint(got) != "[a b]" {
		t.Fatalf("domains %v", got)
	}

	write(t, filepath.Join(dir, "b.yml"), rulesFor("b", 2))
	c := h.waitLoad(t, rate("b", 2))
	if rateOf(c, "a") != 1 {
		t.Fatal("domain a changed")
	}

	write(t, filepath.Join(dir, "c.yaml"), rulesFor("c", 3))
	h.waitLoad(t, func(c *rules.Config) bool { return len(c.Domains()) == 3 })

	// A second file of domain a: rejected, naming both files.
	write(t, filepath.Join(dir, "a2.yaml"), rulesFor("a", 5))
	if err := h.waitErr(t); !strings.Contains(err.Error(), "duplicate domain 'a'") {
		t.Fatalf("error %v", err)
	}
	if err := os.Remove(filepath.Join(dir, "a2.yaml")); err != nil {
		t.Fatal(err)
	}
	// Back to the rules in force: nothing to do.
	h.waitLog(t, "rules unchanged", 1)

	if err := os.Remove(filepath.Join(dir, "c.yaml")); err != nil {
		t.Fatal(err)
	}
	h.waitLoad(t, func(c *rules.Config) bool { return len(c.Domains()) == 2 })
}

func TestEmptiedDirectoryKeepsRules(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), rulesFor("a", 1))
	h := start(t, dir, nil)
	if err := os.Remove(filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := h.waitErr(t); !errors.Is(err, ErrEmpty) {
		t.Fatalf("error %v, want ErrEmpty", err)
	}
	if rateOf(h.w.Current(), "a") != 1 {
		t.Fatal("an emptied directory replaced the rules")
	}
}

// TestNoRulesFilesAtStart: a directory without a rules file (empty, or
// holding only files sluice does not read: "rules" without an extension,
// "rules.YAML" in capitals) fails New with ErrEmpty naming each ignored
// file and why, as a reload to that state is refused, instead of starting
// with rules that allow everything. With AllowMissing it starts with no
// rules and loads them when a rules file appears.
func TestNoRulesFilesAtStart(t *testing.T) {
	empty := t.TempDir()
	if _, err := New(Config{Path: empty}); !errors.Is(err, ErrEmpty) || strings.Contains(err.Error(), "ignored") {
		t.Errorf("an empty directory: %v, want ErrEmpty naming nothing", err)
	}
	dir := t.TempDir()
	write(t, filepath.Join(dir, "rules"), rulesFor("a", 1))
	write(t, filepath.Join(dir, "sub", "rules.YAML"), rulesFor("b", 1))
	write(t, filepath.Join(dir, ".hidden.yaml"), rulesFor("c", 1))
	_, err := New(Config{Path: dir})
	if !errors.Is(err, ErrEmpty) {
		t.Fatalf("a directory of files with other extensions: %v, want ErrEmpty", err)
	}
	for _, want := range []string{`"rules" has no .yaml or .yml extension`, `"sub/rules.YAML" has its extension in capitals (only .yaml and .yml are read)`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %s", err, want)
		}
	}
	if strings.Contains(err.Error(), "hidden") {
		t.Errorf("error %q names a hidden file", err)
	}
	if _, err := LoadWith(dir, rules.LoadOptions{}); !errors.Is(err, ErrEmpty) {
		t.Errorf("LoadWith: %v, want ErrEmpty", err)
	}

	h := start(t, dir, func(c *Config) { c.AllowMissing = true })
	if n := len(h.w.Current().Domains()); n != 0 {
		t.Fatalf("AllowMissing: %d domains, want none", n)
	}
	write(t, filepath.Join(dir, "a.yaml"), rulesFor("a", 2))
	h.waitLoad(t, rate("a", 2))
}

func TestSameContentDoesNothing(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	write(t, path, rulesFor("d", 1))
	h := start(t, path, nil)
	// Same bytes, written in place; then a comment-free copy renamed over.
	write(t, path, rulesFor("d", 1))
	h.waitLog(t, "rules unchanged", 1)
	write(t, filepath.Join(dir, "tmp"), rulesFor("d", 1))
	if err := os.Rename(filepath.Join(dir, "tmp"), path); err != nil {
		t.Fatal(err)
	}
	h.waitLog(t, "rules unchanged", 2)
	select {
	case c := <-h.loads:
		t.Fatalf("reloaded identical rules (hash %s)", c.Hash())
	default:
	}
}

func TestDebounceBurst(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	write(t, path, rulesFor("d", 1))
	h := start(t, path, func(c *Config) { c.Debounce = 300 * time.Millisecond })
	// Writes well within one debounce interval are loaded together: fewer
	// loads than writes (one, unless the machine stalls), the last one of
	// the last content.
	const writes = 20
	for i := 2; i <= writes; i++ {
		write(t, path, rulesFor("d", i))
	}
	loads := 0
	deadline := time.After(patience)
	for done := false; !done; {
		select {
		case c := <-h.loads:
			loads++
			done = rateOf(c, "d") == writes
		case <-deadline:
			t.Fatalf("no load of the last write within %s", patience)
		}
	}
	if loads >= writes-1 {
		t.Fatalf("%d loads for %d writes: no debounce", loads, writes-1)
	}
}

func TestReloadAndResync(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	write(t, path, rulesFor("d", 1))
	h := start(t, path, func(c *Config) {
		c.Debounce = time.Hour // events alone never load within the test
	})
	write(t, path, rulesFor("d", 2))
	h.w.Reload()
	h.waitLoad(t, rate("d", 2))

	// Without events (as on a file system that sends none), the periodic
	// resync notices the new size and modification time.
	loads := make(chan *rules.Config, 1)
	w, err := New(Config{Path: path, Resync: 20 * time.Millisecond, OnLoad: func(c *rules.Config) { loads <- c }})
	if err != nil {
		t.Fatal(err)
	}
	w.fs.Close()
	w.fs = nil
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	write(t, path, rulesFor("d", 300))
	select {
	case c := <-loads:
		if rateOf(c, "d") != 300 {
			t.Fatalf("rate %d", rateOf(c, "d"))
		}
	case <-time.After(patience):
		t.Fatal("resync did not reload")
	}
}

func TestNewErrors(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Error("no path: no error")
	}
	if _, err := New(Config{Path: filepath.Join(t.TempDir(), "missing.yaml")}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	path := filepath.Join(t.TempDir(), "bad.yaml")
	write(t, path, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	_, err := New(Config{Path: path})
	var re *rules.Error
	if !errors.As(err, &re) || re.Problems[0].Line != 4 {
		t.Errorf("bad file: %v", err)
	}
}

// TestNeighbourFilesIgnored writes a busy file beside the rules and the
// watcher's own debug log into the rules directory: neither may cause a
// reload, and the log must not feed itself (on the old watcher, every log
// line was an event that logged another line and reloaded the rules every
// MaxDelayFactor × Debounce).
func TestNeighbourFilesIgnored(t *testing.T) {
	for _, dirMode := range []bool{false, true} {
		t.Run(fmt.Sprintf("directory=%v", dirMode), func(t *testing.T) {
			dir := t.TempDir()
			rulesPath := filepath.Join(dir, "rules.yaml")
			write(t, rulesPath, rulesFor("d", 1))
			logFile, err := os.Create(filepath.Join(dir, "sluice.log"))
			if err != nil {
				t.Fatal(err)
			}
			defer logFile.Close()
			watched := rulesPath
			if dirMode {
				watched = dir
			}
			logs := &logBuffer{}
			h := start(t, watched, func(c *Config) {
				c.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(logFile, logs), &slog.HandlerOptions{Level: slog.LevelDebug}))
			})
			h.logs = logs
			// A change to the rules is seen, and logged into the directory.
			write(t, rulesPath, rulesFor("d", 2))
			h.waitLoad(t, rate("d", 2))
			h.waitLog(t, "rules reloaded", 1)

			// A second of a busy neighbour (a line every 5 ms, as an access
			// log would write) and of the watcher's own log lines.
			neighbour, err := os.Create(filepath.Join(dir, "access.log"))
			if err != nil {
				t.Fatal(err)
			}
			defer neighbour.Close()
			before := h.logs.String()
			for i := range 200 {
				fmt.Fprintf(neighbour, "line %d\n", i)
				time.Sleep(5 * time.Millisecond)
			}
			// Then a quiet spell longer than the debounce bound.
			time.Sleep(MaxDelayFactor * 20 * time.Millisecond * 2)
			after := strings.TrimPrefix(h.logs.String(), before)
			if after != "" {
				t.Fatalf("the watcher reacted to files that are not rules:\n%s", after)
			}
			select {
			case c := <-h.loads:
				t.Fatalf("reloaded (hash %s) for a neighbour file", c.Hash())
			default:
			}
			// The rules are still watched.
			write(t, rulesPath, rulesFor("d", 3))
			h.waitLoad(t, rate("d", 3))
		})
	}
}

// TestSubdirectories: rules files in subdirectories are read and watched,
// as envoy-rl reads its runtime directory: a file changed deep down, a
// subdirectory created with files in it, and one removed, each reload.
func TestSubdirectories(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), rulesFor("a", 1))
	write(t, filepath.Join(dir, "teams", "x", "b.yaml"), rulesFor("b", 1))
	h := start(t, dir, nil)
	if got := h.w.Current().Domains(); fmt.Sprint(got) != "[a b]" {
		t.Fatalf("domains %v", got)
	}
	write(t, filepath.Join(dir, "teams", "x", "b.yaml"), rulesFor("b", 2))
	h.waitLoad(t, rate("b", 2))

	// A new subdirectory, then a file in it.
	if err := os.MkdirAll(filepath.Join(dir, "teams", "y"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "teams", "y", "c.yaml"), rulesFor("c", 3))
	h.waitLoad(t, rate("c", 3))

	if err := os.RemoveAll(filepath.Join(dir, "teams")); err != nil {
		t.Fatal(err)
	}
	h.waitLoad(t, func(c *rules.Config) bool { return fmt.Sprint(c.Domains()) == "[a]" })
}

// TestMergeAndAllowMissing: MergeDomains (MERGE_DOMAIN_CONFIG) merges the
// files of one domain on every reload; AllowMissing
// (FORCE_START_WITHOUT_INITIAL_CONFIG) starts without the directory and
// loads it when it appears.
func TestMergeAndAllowMissing(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "config")
	if _, err := New(Config{Path: dir}); err == nil {
		t.Fatal("a missing path without AllowMissing: no error")
	}
	h := start(t, dir, func(c *Config) { c.MergeDomains, c.AllowMissing = true, true })
	if n := len(h.w.Current().Domains()); n != 0 {
		t.Fatalf("%d domains before the directory exists", n)
	}
	write(t, filepath.Join(dir, "a.yaml"), rulesFor("api", 1))
	h.waitLoad(t, rate("api", 1))
	write(t, filepath.Join(dir, "more", "b.yaml"), "domain: api\ndescriptors:\n  - key: other\n    rate_limit: {unit: second, requests_per_unit: 9}\n")
	c := h.waitLoad(t, func(c *rules.Config) bool { d := c.Domain("api"); return d != nil && len(d.Rules) == 2 })
	if rateOf(c, "api") != 1 {
		t.Errorf("the first file's rule changed: %d", rateOf(c, "api"))
	}
}
