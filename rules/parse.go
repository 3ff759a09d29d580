package rules

import (
	"crypto/sha256"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/base/yamlwalk"
)

// A rules file is read in three steps: this file walks the YAML (through
// package yamlwalk) and reads its scalars as Envoy's yaml.v2 does;
// schema.go knows which keys each mapping takes and builds the tree of
// rules; compile.go turns each limit block into a valid sluice.Limit.

// MaxPeriod bounds every period, refill interval and block_for of a rules
// file.
const MaxPeriod = 100 * 365 * 24 * time.Hour

// maxDepth bounds the nesting of descriptors (and of the walk of a request
// descriptor, which never goes deeper than the rules).
const maxDepth = 64

// Parse parses one rules file: one domain. name is used in problems and as
// Domain.File. An invalid file gives an *Error listing every problem.
func Parse(name string, data []byte) (*Domain, error) {
	p := &parser{Walker: yamlwalk.New(yamlwalk.DefaultBudget), file: name}
	d := &Domain{File: name, names: map[string]bool{}, sum: sha256.Sum256(data)}
	d.root.children = map[string]*Rule{}
	p.d = d
	if err := p.parse(data); err != nil {
		return nil, err
	}
	if p.Failed() {
		return nil, &Error{Problems: p.problems(p.Errs), Warnings: p.problems(p.Warns)}
	}
	d.Warnings = p.problems(p.Warns)
	return d, nil
}

type parser struct {
	*yamlwalk.Walker
	file string
	d    *Domain

	elastic  []*yaml.Node // limits with an elastic_ceiling: need a capacity
	replaces []*yaml.Node // replaces names, checked against the domain's names

	// The domain's defaults of consistency: and max_overshoot:, nil when
	// absent.
	consistency, overshoot *yaml.Node
}

// problems gives notes of the walk as the file's problems.
func (p *parser) problems(notes []yamlwalk.Note) []Problem {
	out := make([]Problem, len(notes))
	for i, n := range notes {
		out[i] = Problem{File: p.file, Line: n.Line, Column: n.Column, Msg: n.Msg}
	}
	return out
}

// parse walks the first document of data; a syntax error comes back as
// the file's one problem.
func (p *parser) parse(data []byte) error {
	doc, err := yamlwalk.Load(data)
	if err != nil {
		line, msg := yamlwalk.SyntaxMessage(err)
		return &Error{Problems: []Problem{{File: p.file, Line: line, Msg: msg}}}
	}
	if doc.Second {
		// Envoy reads the first document only; so does sluice, with a
		// warning.
		p.Warns = append(p.Warns, yamlwalk.Note{Line: doc.SecondLine, Msg: "a second YAML document is ignored (one domain per file)"})
	}
	if doc.Root == nil {
		p.Errs = append(p.Errs, yamlwalk.Note{Line: 1, Column: 1, Msg: "config file cannot have empty domain"})
		return nil
	}
	p.root(doc.Root)
	return nil
}

// str reads a string field as yaml.v2 (and so Envoy) does: any scalar's
// text, null as empty.
func (p *parser) str(n *yaml.Node, what string) (string, bool) {
	n = p.Deref(n)
	if n == nil {
		return "", false
	}
	if n.Kind != yaml.ScalarNode {
		p.Errorf(n, "%s must be a string, got %s", what, yamlwalk.Describe(n))
		return "", false
	}
	if n.ShortTag() == "!!null" {
		return "", true
	}
	return n.Value, true
}

// YAML 1.1 booleans, which yaml.v2 (and so Envoy) accepts.
var (
	yamlTrue  = []string{"y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"}
	yamlFalse = []string{"n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"}
)

func (p *parser) boolean(n *yaml.Node, what string) (bool, bool) {
	n = p.Deref(n)
	if n == nil {
		return false, false
	}
	if n.Kind == yaml.ScalarNode {
		if n.ShortTag() == "!!null" {
			return false, true
		}
		if n.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle) == 0 {
			if slices.Contains(yamlTrue, n.Value) {
				return true, true
			}
			if slices.Contains(yamlFalse, n.Value) {
				return false, true
			}
		}
	}
	p.Errorf(n, "%s must be true or false, got %s", what, yamlwalk.Describe(n))
	return false, false
}

// integer reads a whole number as yaml.v2 does (decimal, 0x, 0o, 0b, leading
// zero octal, underscores) and checks lo <= value <= hi.
func (p *parser) integer(n *yaml.Node, what string, lo, hi int64) (int64, bool) {
	n = p.Deref(n)
	if n == nil {
		return 0, false
	}
	if n.Kind != yaml.ScalarNode || n.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle) != 0 || n.ShortTag() == "!!null" {
		p.Errorf(n, "%s must be a whole number, got %s", what, yamlwalk.Describe(n))
		return 0, false
	}
	s := strings.ReplaceAll(n.Value, "_", "")
	v, err := strconv.ParseInt(s, 0, 64)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
			p.Errorf(n, "%s %s is out of range (%d to %d)", what, n.Value, lo, hi)
		} else {
			p.Errorf(n, "%s must be a whole number, got %s", what, yamlwalk.Describe(n))
		}
		return 0, false
	}
	if v < lo || v > hi {
		p.Errorf(n, "%s must be between %d and %d, got %d", what, lo, hi, v)
		return 0, false
	}
	return v, true
}

// duration reads a Go duration (90s, 1h30m), positive and at most MaxPeriod.
func (p *parser) duration(n *yaml.Node, what string) (time.Duration, bool) {
	n = p.Deref(n)
	if n == nil {
		return 0, false
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" {
		p.Errorf(n, "%s must be a duration such as 90s or 1h30m, got %s", what, yamlwalk.Describe(n))
		return 0, false
	}
	d, err := time.ParseDuration(n.Value)
	if err != nil {
		p.Errorf(n, "%s must be a duration such as 90s or 1h30m, got %q", what, n.Value)
		return 0, false
	}
	if d <= 0 || d > MaxPeriod {
		p.Errorf(n, "%s must be positive and at most %s, got %s", what, MaxPeriod, n.Value)
		return 0, false
	}
	return d, true
}
