package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
)

// Config is a loaded set of domains. It is immutable and safe for
// concurrent use; a reload builds a new Config and swaps it in whole.
type Config struct {
	domains map[string]*Domain
	names   []string
	hash    string

	// Compiled limits of Envoy's per-descriptor overrides, by rate; bounded
	// by maxOverrides, beyond which they are compiled per request.
	overrides     sync.Map // overrideKey -> *sluice.Limit
	overrideCount atomic.Int64
}

// maxOverrides bounds the cache of compiled override limits.
const maxOverrides = 4096

// NewConfig gathers parsed domains into a Config. Two files of the same
// domain are an error naming both files.
func NewConfig(domains ...*Domain) (*Config, error) {
	c := &Config{domains: make(map[string]*Domain, len(domains))}
	var probs []Problem
	for _, d := range domains {
		if first, dup := c.domains[d.Name]; dup {
			probs = append(probs, Problem{File: d.File, Line: 1, Msg: fmt.Sprintf("duplicate domain '%s' in config file (also in %s)", d.Name, first.File)})
			continue
		}
		c.domains[d.Name] = d
		c.names = append(c.names, d.Name)
	}
	if len(probs) > 0 {
		return nil, &Error{Problems: probs}
	}
	slices.Sort(c.names)
	h := sha256.New()
	for _, name := range c.names {
		d := c.domains[name]
		h.Write([]byte(field(name)))
		h.Write(d.sum[:])
	}
	c.hash = hex.EncodeToString(h.Sum(nil))
	return c, nil
}

// LoadFile parses one rules file into a Config of one domain.
func LoadFile(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	d, err := Parse(path, data)
	if err != nil {
		return nil, err
	}
	return NewConfig(d)
}

// LoadOptions are how LoadDirWith reads a directory.
type LoadOptions struct {
	// MergeDomains lets several files define one domain: their top-level
	// descriptors are merged (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG).
	// A descriptor that two files define, or two different values of a
	// domain-wide setting (capacity, failure_policy, all_or_nothing), is a
	// problem. Without it, a domain in two files is a problem.
	MergeDomains bool
}

// LoadDir is LoadDirWith with the default options: one domain per file.
func LoadDir(dir string) (*Config, error) {
	return LoadDirWith(dir, LoadOptions{})
}

// maxDirDepth bounds how deep LoadDirWith looks into subdirectories.
const maxDirDepth = 16

// DirFiles returns the rules files LoadDirWith reads in dir: every *.yaml
// and *.yml file in it and in its subdirectories (as envoyproxy/ratelimit
// reads its runtime directory), sorted, and the directories it looked in.
// Hidden entries (a name starting with ".") are skipped, so that the
// ..data directories of a Kubernetes ConfigMap mount are not read twice.
// Symlinked files and directories are followed, each directory once,
// at most 16 levels down.
func DirFiles(dir string) (files, dirs []string, err error) {
	seen := map[string]bool{}
	var walk func(d string, depth int) error
	walk = func(d string, depth int) error {
		real, err := filepath.EvalSymlinks(d)
		if err != nil {
			return err
		}
		if seen[real] || depth > maxDirDepth {
			return nil
		}
		seen[real] = true
		dirs = append(dirs, d)
		ents, err := os.ReadDir(d)
		if err != nil {
			return err
		}
		for _, e := range ents {
			name := e.Name()
			if strings.HasPrefix(name, ".") {
				continue
			}
			path := filepath.Join(d, name)
			info, err := os.Stat(path) // follows symlinks
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					continue // a dangling symlink, or removed meanwhile
				}
				return err
			}
			switch {
			case info.IsDir():
				if err := walk(path, depth+1); err != nil {
					return err
				}
			case strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml"):
				files = append(files, path)
			}
		}
		return nil
	}
	if err := walk(dir, 0); err != nil {
		return nil, nil, err
	}
	slices.Sort(files)
	return files, dirs, nil
}

// LoadDirWith parses every rules file of dir (DirFiles), one domain per
// file unless opt.MergeDomains. Every problem of every file is reported
// together. A directory without rules files gives an empty Config.
func LoadDirWith(dir string, opt LoadOptions) (*Config, error) {
	files, _, err := DirFiles(dir)
	if err != nil {
		return nil, err
	}
	var domains []*Domain
	var probs, warns []Problem
	for _, path := range files {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		d, err := Parse(path, data)
		if err != nil {
			var re *Error
			if errors.As(err, &re) {
				probs = append(probs, re.Problems...)
				warns = append(warns, re.Warnings...)
				continue
			}
			return nil, err
		}
		domains = append(domains, d)
		warns = append(warns, d.Warnings...)
	}
	c, err := NewConfigWith(domains, opt)
	if err != nil {
		var re *Error
		if !errors.As(err, &re) {
			return nil, err
		}
		probs = append(probs, re.Problems...)
	}
	if len(probs) > 0 {
		return nil, &Error{Problems: probs, Warnings: warns}
	}
	return c, nil
}

// NewConfigWith is NewConfig, merging the domains of one name when
// opt.MergeDomains (see LoadOptions). It takes the domains over: a merge
// changes the first of a name. Every problem is reported together.
func NewConfigWith(domains []*Domain, opt LoadOptions) (*Config, error) {
	if !opt.MergeDomains {
		return NewConfig(domains...)
	}
	var probs []Problem
	byName := map[string]*Domain{}
	var merged []*Domain
	for _, d := range domains {
		if first := byName[d.Name]; first != nil {
			probs = append(probs, first.merge(d)...)
			continue
		}
		byName[d.Name] = d
		merged = append(merged, d)
	}
	if len(probs) > 0 {
		return nil, &Error{Problems: probs}
	}
	return NewConfig(merged...)
}

// Domain returns the domain with the given name, or nil.
func (c *Config) Domain(name string) *Domain { return c.domains[name] }

// Domains returns the names of the domains, sorted.
func (c *Config) Domains() []string { return slices.Clone(c.names) }

// Hash is a stable digest of the configuration: the sha256, in hex, of the
// domain names and the bytes of their files, independent of file names and
// load order. Equal sources give equal hashes.
func (c *Config) Hash() string { return c.hash }

// Warnings returns the warnings of every domain, by domain name.
func (c *Config) Warnings() []Problem {
	var out []Problem
	for _, name := range c.names {
		out = append(out, c.domains[name].Warnings...)
	}
	return out
}

type overrideKey struct {
	rate   uint32
	period int64
}

// overrideLimit returns the fixed-window limit of an override.
func (c *Config) overrideLimit(rate uint32, unit Unit, mult uint32) *sluice.Limit {
	if mult == 0 {
		mult = 1
	}
	period := unit.Duration() * time.Duration(mult)
	k := overrideKey{rate, int64(period)}
	if l, ok := c.overrides.Load(k); ok {
		return l.(*sluice.Limit)
	}
	l := &sluice.Limit{Name: "override", Algorithm: sluice.FixedWindow, Rate: int64(rate), Period: period}
	if c.overrideCount.Load() < maxOverrides {
		if prev, loaded := c.overrides.LoadOrStore(k, l); loaded {
			return prev.(*sluice.Limit)
		}
		c.overrideCount.Add(1)
	}
	return l
}
