// Package reload keeps rules in step with their files: a [Watcher] watches a
// rules file, or a directory of rules files, and loads them again when they
// change.
//
// It watches directories, never files, so that it survives the ways files
// are replaced in practice: a Kubernetes ConfigMap swapping its ..data
// symlink, an editor writing a temporary file and renaming it over the
// original, a file truncated and written again, a file or directory deleted
// and created again. It reacts only to the rules files in those
// directories, so that a busy log beside the rules costs nothing. Events are debounced, so that one burst gives one
// reload. A reload that fails keeps the rules in force, logs every problem
// with its line, and calls Config.OnError; one that gives the same
// [rules.Config.Hash] as the rules in force does nothing.
//
// This package imports rules, fsnotify and the standard library. It must not
// import stores or transports: callers apply new rules in Config.OnLoad.
package reload

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/sluicehq/sluice/rules"
)

// Config configures a Watcher. Every field but Path is optional; a zero
// value means the default written in its comment.
type Config struct {
	// Path is the rules file, or the directory of rules files (one domain
	// each, read with rules.LoadDirWith, subdirectories included).
	// Required.
	Path string

	// MergeDomains lets several files of the directory define one domain
	// (rules.LoadOptions.MergeDomains: envoyproxy/ratelimit's
	// MERGE_DOMAIN_CONFIG).
	MergeDomains bool

	// AllowMissing starts with no rules when Path does not exist, and
	// loads them when it appears (envoyproxy/ratelimit's
	// FORCE_START_WITHOUT_INITIAL_CONFIG). Without it, a missing Path is
	// an error of New.
	AllowMissing bool

	// Logger receives a line for every reload, every problem of a rejected
	// one, and every warning of an accepted one. Nil discards them.
	Logger *slog.Logger

	// OnLoad is called with every new config: one that loaded and whose
	// Hash differs from the config in force, which it then replaces. It is
	// called from the goroutine of Run, one call at a time.
	OnLoad func(*rules.Config)

	// Check, when set, is called with the first config and with each new
	// one before it replaces the one in force: an error rejects it as an invalid file is
	// rejected (logged, OnError called, the config in force stays), for
	// a caller that asks more of the files than rules.Load does.
	Check func(*rules.Config) error

	// OnError is called with the error of every reload that failed; the
	// config in force stays. The error is a *rules.Error when the files
	// loaded but are invalid. It is called from the goroutine of Run.
	OnError func(error)

	// Debounce is how long the files must stay quiet after an event before
	// they are loaded, so that a burst of events (a ConfigMap swap, an
	// editor saving) gives one reload. Events that never stop are loaded
	// after at most MaxDelayFactor times Debounce. Zero means 100ms.
	Debounce time.Duration

	// Resync is how often the watcher checks, without waiting for an
	// event, that every directory it needs is watched and whether the
	// files changed (size, modification time or symlink target), loading
	// them if so: a safety net for file systems that do not deliver
	// events. Zero means 30s; negative disables it.
	Resync time.Duration
}

// Defaults of Config, and the bound on the delay of a burst of events.
const (
	DefaultDebounce = 100 * time.Millisecond
	DefaultResync   = 30 * time.Second
	MaxDelayFactor  = 10
)

// Watcher keeps a rules.Config loaded from Config.Path. Create it with New
// and run it with Run.
type Watcher struct {
	cfg     Config
	abs     string // cfg.Path made absolute, for watching
	log     *slog.Logger
	fs      *fsnotify.Watcher // nil when the system gives no watcher: resync only
	current atomic.Pointer[rules.Config]
	trigger chan struct{}

	// Touched only by New and then by the goroutine of Run.
	print string // fingerprint of the files at the last load attempt
}

// ErrEmpty is the error of rules that hold no domain at all: a directory
// without a rules file (LoadWith names the files it holds that are not
// rules files), emptied, say, in the middle of files being replaced. At
// start it fails New unless AllowMissing; on reload it keeps the config
// in force.
var ErrEmpty = errors.New("no rules files")

// New loads the rules at cfg.Path and starts watching them. The error of a
// bad initial config is the one of Load: a *rules.Error lists every
// problem. Watches are set before the first load, so that no change after
// it is missed. If the system refuses a file watcher (too many open
// inotify instances, say), New logs it and the Watcher falls back on
// Resync alone, unless Resync is negative, which makes it an error.
func New(cfg Config) (*Watcher, error) {
	if cfg.Path == "" {
		return nil, errors.New("reload: no path to watch")
	}
	abs, err := filepath.Abs(cfg.Path)
	if err != nil {
		return nil, fmt.Errorf("reload: %w", err)
	}
	if cfg.Debounce <= 0 {
		cfg.Debounce = DefaultDebounce
	}
	if cfg.Resync == 0 {
		cfg.Resync = DefaultResync
	}
	w := &Watcher{cfg: cfg, abs: abs, log: cfg.Logger, trigger: make(chan struct{}, 1)}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	fs, err := fsnotify.NewWatcher()
	if err != nil {
		if cfg.Resync < 0 {
			return nil, fmt.Errorf("reload: %w", err)
		}
		w.log.Warn("cannot watch rules files; checking them every resync interval instead", "err", err, "resync", cfg.Resync)
	}
	w.fs = fs
	w.sync()
	w.print = w.fingerprint()
	c, err := LoadWith(cfg.Path, rules.LoadOptions{MergeDomains: cfg.MergeDomains})
	if err != nil && cfg.AllowMissing && (errors.Is(err, os.ErrNotExist) || errors.Is(err, ErrEmpty)) {
		w.log.Warn("no rules yet: every request is allowed until they appear", "path", cfg.Path, "err", err)
		c, err = rules.NewConfig()
	}
	if err == nil && cfg.Check != nil {
		err = cfg.Check(c)
	}
	if err != nil {
		w.close()
		return nil, err
	}
	w.current.Store(c)
	return w, nil
}

// Load is LoadWith with the default options.
func Load(path string) (*rules.Config, error) {
	return LoadWith(path, rules.LoadOptions{})
}

// LoadWith loads the rules at path: every rules file of it, in its
// subdirectories too, if it is a directory (rules.LoadDirWith), else the
// one file (rules.LoadFile). A directory without a rules file is an error
// (ErrEmpty) that names the files it ignored, not rules that allow
// everything.
func LoadWith(path string, opt rules.LoadOptions) (*rules.Config, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return rules.LoadFile(path)
	}
	files, dirs, err := rules.DirFiles(path)
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: %w (*.yaml or *.yml)%s", path, ErrEmpty, ignored(path, dirs))
	}
	return rules.LoadDirWith(path, opt)
}

// maxIgnoredNamed bounds the files an ErrEmpty names.
const maxIgnoredNamed = 5

// ignored names the files of dirs (under root) that are not rules files,
// each with why, for the error of a directory without rules files: "";
// or "; ignored: ..." with at most maxIgnoredNamed of them.
func ignored(root string, dirs []string) string {
	var names []string
	more := 0
	for _, d := range dirs {
		ents, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range ents {
			name := e.Name()
			if strings.HasPrefix(name, ".") {
				continue
			}
			if fi, err := os.Stat(filepath.Join(d, name)); err != nil || fi.IsDir() {
				continue
			}
			if len(names) == maxIgnoredNamed {
				more++
				continue
			}
			rel, err := filepath.Rel(root, filepath.Join(d, name))
			if err != nil {
				rel = name
			}
			why := "has no .yaml or .yml extension"
			if ext := filepath.Ext(name); strings.EqualFold(ext, ".yaml") || strings.EqualFold(ext, ".yml") {
				why = "has its extension in capitals (only .yaml and .yml are read)"
			}
			names = append(names, fmt.Sprintf("%q %s", rel, why))
		}
	}
	if len(names) == 0 {
		return ""
	}
	if more > 0 {
		names = append(names, fmt.Sprintf("and %d more", more))
	}
	return "; ignored: " + strings.Join(names, ", ")
}

// Current returns the config in force.
func (w *Watcher) Current() *rules.Config { return w.current.Load() }

// Reload asks Run to load the rules now, whatever the events say (on
// SIGHUP, for instance). It does not wait.
func (w *Watcher) Reload() {
	select {
	case w.trigger <- struct{}{}:
	default:
	}
}

// Run watches the files and reloads them until ctx is done, then stops
// watching and returns nil. It returns an error only if the file watcher
// fails for good. Call it once.
func (w *Watcher) Run(ctx context.Context) error {
	defer w.close()
	var events <-chan fsnotify.Event
	var errs <-chan error
	if w.fs != nil {
		events, errs = w.fs.Events, w.fs.Errors
	}
	var resync <-chan time.Time
	if w.cfg.Resync > 0 {
		t := time.NewTicker(w.cfg.Resync)
		defer t.Stop()
		resync = t.C
	}
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	var since time.Time // first event of the pending burst; zero when none

	schedule := func() {
		now := time.Now()
		if since.IsZero() {
			since = now
		}
		wait := min(w.cfg.Debounce, since.Add(MaxDelayFactor*w.cfg.Debounce).Sub(now))
		debounce.Reset(max(wait, 0))
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				return errors.New("reload: file watcher closed")
			}
			if ev.Op == fsnotify.Chmod {
				continue // touch, antivirus, backups: the content is the same
			}
			if !w.relevant(ev.Name) {
				// A log, a backup or an editor's scratch file beside the
				// rules: not ours, and not worth a log line either (a log
				// written next to the rules would feed itself).
				continue
			}
			w.log.Debug("rules file event", "event", ev.Op.String(), "name", ev.Name)
			schedule()
		case err, ok := <-errs:
			if !ok {
				return errors.New("reload: file watcher closed")
			}
			// An overflow loses events: load anyway.
			w.log.Warn("rules file watcher", "err", err)
			schedule()
		case <-debounce.C:
			since = time.Time{}
			w.sync()
			w.reload()
		case <-w.trigger:
			w.sync()
			w.reload()
		case <-resync:
			w.sync()
			if since.IsZero() && w.fingerprint() != w.print {
				w.log.Debug("rules files changed without an event")
				w.reload()
			}
		}
	}
}

func (w *Watcher) close() {
	if w.fs != nil {
		w.fs.Close()
	}
}

// reload loads the files and swaps the result in if it is valid and new.
func (w *Watcher) reload() {
	w.print = w.fingerprint()
	cur := w.current.Load()
	c, err := LoadWith(w.cfg.Path, rules.LoadOptions{MergeDomains: w.cfg.MergeDomains})
	if err == nil && len(c.Domains()) == 0 && len(cur.Domains()) > 0 {
		err = fmt.Errorf("%s: %w", w.cfg.Path, ErrEmpty)
	}
	if err != nil {
		w.reject(err, cur)
		return
	}
	if c.Hash() == cur.Hash() {
		w.log.Debug("rules unchanged", "path", w.cfg.Path, "hash", c.Hash())
		return
	}
	if w.cfg.Check != nil {
		if err := w.cfg.Check(c); err != nil {
			w.reject(err, cur)
			return
		}
	}
	for _, p := range c.Warnings() {
		w.log.Warn("rules warning", problemAttrs(p)...)
	}
	w.current.Store(c)
	w.log.Info("rules reloaded", "path", w.cfg.Path, "hash", c.Hash(), "previous_hash", cur.Hash(), "domains", c.Domains())
	if w.cfg.OnLoad != nil {
		w.cfg.OnLoad(c)
	}
}

func (w *Watcher) reject(err error, cur *rules.Config) {
	var re *rules.Error
	if errors.As(err, &re) {
		for _, p := range re.Problems {
			w.log.Error("rules problem", problemAttrs(p)...)
		}
		for _, p := range re.Warnings {
			w.log.Warn("rules warning", problemAttrs(p)...)
		}
		w.log.Error("rules reload rejected; keeping the rules in force", "path", w.cfg.Path, "problems", len(re.Problems), "hash", cur.Hash())
	} else {
		w.log.Error("rules reload failed; keeping the rules in force", "path", w.cfg.Path, "err", err, "hash", cur.Hash())
	}
	if w.cfg.OnError != nil {
		w.cfg.OnError(err)
	}
}

// problemAttrs spells a rules problem as log attributes.
func problemAttrs(p rules.Problem) []any {
	return []any{"file", p.File, "line", p.Line, "column", p.Column, "problem", p.Msg}
}

// isRulesFile reports whether LoadDir reads a directory entry of this name.
func isRulesFile(name string) bool {
	return !strings.HasPrefix(name, ".") && (strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml"))
}

// relevant reports whether an event on name can change what Load reads:
// the rules path itself or a directory on the way to it (created, removed,
// a symlink swapped), a rules file (for a directory of rules: any name
// LoadDir reads; for a file: the file's name or its symlink target's), or a
// name starting with ".." (a ConfigMap's ..data symlink and the timestamped
// directories it points to). Every other file in a watched directory, such
// as a log written beside the rules, is ignored.
func (w *Watcher) relevant(name string) bool {
	base := filepath.Base(name)
	if strings.HasPrefix(base, "..") {
		return true
	}
	if name == w.abs || strings.HasPrefix(w.abs, name+string(filepath.Separator)) {
		return true
	}
	if info, err := os.Stat(w.abs); err == nil && info.IsDir() {
		if isRulesFile(base) {
			return true
		}
		// A subdirectory created, removed or renamed: its rules files
		// come or go, and the watches must follow.
		if strings.HasPrefix(base, ".") {
			return false
		}
		if fi, err := os.Stat(name); err == nil {
			return fi.IsDir()
		}
		return w.fs != nil && slices.Contains(w.fs.WatchList(), name)
	}
	if base == filepath.Base(w.abs) {
		return true
	}
	if t, err := filepath.EvalSymlinks(w.abs); err == nil && base == filepath.Base(t) {
		return true
	}
	return false
}

// dirs returns the directories to watch, symlinks resolved: for a
// directory of rules, the directory and those holding the targets of its
// symlinked rules files (a ConfigMap's ..2006_01_02_15_04_05.000
// directory); for a file, the directory holding it and the one holding its
// target; and for either, the directory holding each symlink on the path
// (an Envoy runtime root swapped by renaming a "current" symlink, say). A
// directory that does not exist is replaced by its nearest existing
// ancestor, so that its creation is seen.
func (w *Watcher) dirs() []string {
	p := w.abs
	var want []string
	add := func(path string) {
		want = append(want, path)
	}
	addTarget := func(path string) {
		if t, err := filepath.EvalSymlinks(path); err == nil {
			add(filepath.Dir(t))
		}
	}
	for q := p; ; q = filepath.Dir(q) {
		if li, err := os.Lstat(q); err == nil && li.Mode()&os.ModeSymlink != 0 {
			add(filepath.Dir(q))
		}
		if filepath.Dir(q) == q {
			break
		}
	}
	if info, err := os.Stat(p); err == nil && info.IsDir() {
		// The directory and its subdirectories (rules.DirFiles), each
		// resolved, and the directories of symlinked rules files'
		// targets.
		files, dirs, _ := rules.DirFiles(p)
		for _, d := range dirs {
			if t, err := filepath.EvalSymlinks(d); err == nil {
				add(t)
			}
		}
		for _, f := range files {
			if li, err := os.Lstat(f); err == nil && li.Mode()&os.ModeSymlink != 0 {
				addTarget(f)
			}
		}
		if len(dirs) == 0 {
			if t, err := filepath.EvalSymlinks(p); err == nil {
				add(t)
			}
		}
	} else {
		add(filepath.Dir(p))
		addTarget(p)
	}
	out := make([]string, 0, len(want))
	for _, d := range want {
		out = append(out, existing(d))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// existing returns the nearest ancestor of dir (dir included) that exists,
// symlinks resolved.
func existing(dir string) string {
	for {
		if t, err := filepath.EvalSymlinks(dir); err == nil {
			if info, err := os.Stat(t); err == nil && info.IsDir() {
				return t
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return dir
		}
		dir = parent
	}
}

// sync makes the watched directories those of dirs. A directory can be
// created between the look that found it missing and the watch on its
// parent; looking again after watching catches that.
func (w *Watcher) sync() {
	if w.fs == nil {
		return
	}
	for range 4 {
		want := w.dirs()
		have := w.fs.WatchList()
		for _, d := range have {
			if !slices.Contains(want, d) {
				w.fs.Remove(d) // already gone if it was deleted: nothing to do
			}
		}
		for _, d := range want {
			if slices.Contains(have, d) {
				continue
			}
			if err := w.fs.Add(d); err != nil {
				w.log.Warn("cannot watch rules directory", "dir", d, "err", err)
			} else {
				w.log.Debug("watching rules directory", "dir", d)
			}
		}
		if slices.Equal(w.dirs(), want) {
			return
		}
	}
}

// fingerprint describes the files Load reads: their names, symlink
// targets, sizes and modification times. It changes when they do, except
// for a rewrite of the same size within the file system's time resolution,
// which the events catch.
func (w *Watcher) fingerprint() string {
	var b strings.Builder
	describe := func(path string) {
		t, err := filepath.EvalSymlinks(path)
		if err != nil {
			fmt.Fprintf(&b, "%s !%v\n", path, err)
			return
		}
		info, err := os.Stat(t)
		if err != nil {
			fmt.Fprintf(&b, "%s !%v\n", path, err)
			return
		}
		fmt.Fprintf(&b, "%s %s %d %d %v\n", path, t, info.Size(), info.ModTime().UnixNano(), info.IsDir())
	}
	p := w.abs
	describe(p)
	if info, err := os.Stat(p); err == nil && info.IsDir() {
		files, dirs, err := rules.DirFiles(p)
		if err != nil {
			fmt.Fprintf(&b, "!%v\n", err)
		}
		for _, d := range dirs[min(1, len(dirs)):] {
			describe(d)
		}
		for _, f := range files {
			describe(f)
		}
	}
	return b.String()
}
