// Package yamlwalk walks parsed YAML for the readers of sluice's files (the
// rules of package rules, the http section of package httpconf): it loads
// the first document, follows aliases within a budget, reads mappings with
// merge keys, repeated and non-string keys reported, and strict key sets,
// and collects every problem with its line and column.
//
// It owns the walking, not a schema: what a key means, and how a scalar is
// read, belongs to each reader. It imports nothing of sluice.
package yamlwalk

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// DefaultBudget is the number of node visits a walk may make, aliases
// included: enough for any real file, and a bound on the work no input
// (an alias bomb, a recursive alias) can exceed.
const DefaultBudget = 1 << 20

// MaxProblems is the most problems a walk records: past it, one more says
// so and the walk stops, as when its budget is spent. A file that many
// problems wrong needs no more of them to be fixed, and a few hundred
// bytes of aliases must not make a reader report (and a server log) a
// million.
const MaxProblems = 100

// Note is one problem or warning: where (1-based; zero when unknown) and
// what.
type Note struct {
	Line, Column int
	Msg          string
}

// Pair is one key and value of a mapping.
type Pair struct{ K, V *yaml.Node }

// A Walker walks the nodes of one file and collects what it finds wrong.
// Its zero value is not usable: call New.
type Walker struct {
	// Describe names a node in problems ("a list", "the string \"x\"");
	// New sets Describe (the function).
	Describe func(*yaml.Node) string

	Errs  []Note // the problems, in the order found
	Warns []Note // the warnings

	budget int
	broke  bool // budget spent or MaxProblems reached: stop walking and reporting
}

// New returns a Walker that may visit budget nodes.
func New(budget int) *Walker {
	return &Walker{Describe: Describe, budget: budget}
}

// Errorf records a problem at n (nil: position unknown). Once the budget is
// spent, or MaxProblems recorded, nothing more is recorded and the walk
// stops: the one problem after them says why.
func (w *Walker) Errorf(n *yaml.Node, format string, args ...any) {
	if w.broke {
		return
	}
	if len(w.Errs) >= MaxProblems {
		w.Errs = append(w.Errs, at(n, fmt.Sprintf("more than %d problems: the rest of the file is not read", MaxProblems)))
		w.broke = true
		return
	}
	w.Errs = append(w.Errs, at(n, fmt.Sprintf(format, args...)))
}

// Warnf records a warning at n.
func (w *Walker) Warnf(n *yaml.Node, format string, args ...any) {
	w.Warns = append(w.Warns, at(n, fmt.Sprintf(format, args...)))
}

func at(n *yaml.Node, msg string) Note {
	if n == nil {
		return Note{Msg: msg}
	}
	return Note{Line: n.Line, Column: n.Column, Msg: msg}
}

// Failed reports whether a problem has been recorded.
func (w *Walker) Failed() bool { return len(w.Errs) > 0 }

// A Doc is the first YAML document of a file.
type Doc struct {
	// Root is the document's root node; nil for an input without a
	// document (an empty file, or only comments).
	Root *yaml.Node
	// Second is whether a second document follows, which the readers
	// ignore; SecondLine is its line when known.
	Second     bool
	SecondLine int
}

// Load decodes the first YAML document of data. err is a syntax error of
// that document, a *SyntaxError.
func Load(data []byte) (Doc, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return Doc{}, nil
		}
		return Doc{}, syntaxError(data, err)
	}
	var d Doc
	var next yaml.Node
	if err := dec.Decode(&next); err == nil {
		d.Second, d.SecondLine = true, next.Line
	} else if !errors.Is(err, io.EOF) {
		d.Second, d.SecondLine = true, secondLine(data)
	}
	d.Root = &doc
	if doc.Kind == yaml.DocumentNode {
		d.Root = nil
		if len(doc.Content) > 0 {
			d.Root = doc.Content[0]
		}
	}
	return d, nil
}

// SyntaxError is a YAML syntax error, at the line where it is.
type SyntaxError struct {
	Line int    // 1-based; 0 when unknown
	Msg  string // go.yaml.in/yaml/v3's message, without its line
}

func (e *SyntaxError) Error() string {
	if e.Line == 0 {
		return "yaml: " + e.Msg
	}
	return fmt.Sprintf("yaml: line %d: %s", e.Line, e.Msg)
}

// SyntaxMessage is the line and message of err, an error of Load, as a
// reader of a file reports it: the line where the file stops being YAML
// (0 when unknown) and "invalid YAML: " and what is wrong, so that every
// reader of the same file (the rules, the http section) reports it alike.
func SyntaxMessage(err error) (line int, msg string) {
	var se *SyntaxError
	if errors.As(err, &se) {
		return se.Line, "invalid YAML: " + se.Msg
	}
	return 0, "invalid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")
}

// syntaxError turns err, the error of decoding the first document of
// data, into a *SyntaxError at the right line.
//
// The line go.yaml.in/yaml/v3 puts in its message cannot be used as it is:
// it counts from 1 for the scanner's errors but from 0 for the parser's
// (one line early), it names where the enclosing mapping or list starts
// rather than the token at fault, and it leaves the line out when that is
// the first. It is never after the fault, though, and the fault is where
// the input stops reading as YAML: the first line at which data, cut just
// after it, fails with the same message. A binary search from yaml's line
// finds it in a few decodes of data's prefixes.
func syntaxError(data []byte, err error) error {
	msg, hint, ok := splitYAMLError(err)
	if !ok {
		return err
	}
	ends := lineEnds(data)
	if len(ends) == 0 {
		return &SyntaxError{Msg: msg}
	}
	lo := min(max(hint, 1), len(ends))
	line := firstLine(ends, lo, func(end int) bool {
		var n yaml.Node
		m, _, ok := splitYAMLError(yaml.NewDecoder(bytes.NewReader(data[:end])).Decode(&n))
		return ok && m == msg
	})
	return &SyntaxError{Line: line, Msg: msg}
}

// secondLine is the line where the second document of data starts, when
// it does not decode: the first line at which data, cut just after it,
// holds a second document.
func secondLine(data []byte) int {
	ends := lineEnds(data)
	start := 0
	firstLine(ends, 1, func(end int) bool {
		dec := yaml.NewDecoder(bytes.NewReader(data[:end]))
		var first, second yaml.Node
		if dec.Decode(&first) != nil {
			return false
		}
		err := dec.Decode(&second)
		if err == nil {
			start = second.Line
		}
		return !errors.Is(err, io.EOF)
	})
	return start
}

// firstLine returns the first line (1-based), from lo on, whose end in
// ends passes at, which holds from some line on up to the last; lo when
// none does.
func firstLine(ends []int, lo int, at func(end int) bool) int {
	hi := len(ends)
	if lo > hi || !at(ends[hi-1]) {
		return lo
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		if at(ends[mid-1]) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// splitYAMLError splits a go.yaml.in/yaml/v3 error ("yaml: line 3: did
// not find expected key", or "yaml: ..." without a line) into its message
// and line (0 when absent); ok is false for another error.
func splitYAMLError(err error) (msg string, line int, ok bool) {
	if err == nil {
		return "", 0, false
	}
	msg, ok = strings.CutPrefix(err.Error(), "yaml: ")
	if !ok {
		return "", 0, false
	}
	if rest, found := strings.CutPrefix(msg, "line "); found {
		if n, after, found := strings.Cut(rest, ": "); found {
			if l, err := strconv.Atoi(n); err == nil {
				return after, l, true
			}
		}
	}
	return msg, 0, true
}

// lineEnds returns, for each line of data, the offset just after it (its
// line break included).
func lineEnds(data []byte) []int {
	var ends []int
	for i, b := range data {
		if b == '\n' {
			ends = append(ends, i+1)
		}
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		ends = append(ends, len(data))
	}
	return ends
}

// Deref follows n's aliases and charges the visit to the budget. Once the
// budget is spent it records one problem and returns nil from then on, as
// it does once MaxProblems are recorded.
func (w *Walker) Deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		if !w.spend(n) {
			return nil
		}
		n = n.Alias
	}
	if n != nil && !w.spend(n) {
		return nil
	}
	return n
}

func (w *Walker) spend(n *yaml.Node) bool {
	if w.broke {
		return false
	}
	if w.budget <= 0 {
		if !w.broke {
			w.Errorf(n, "file too large or too deeply aliased")
			w.broke = true
		}
		return false
	}
	w.budget--
	return true
}

// Mapping returns the pairs of the mapping n, described as what, with merge
// keys (<<) applied: a key of the mapping itself beats a merged one, and
// among merged mappings the earlier wins. It reports keys that are not
// strings and keys repeated; ok is false when n is not a mapping.
func (w *Walker) Mapping(n *yaml.Node, what string) (pairs []Pair, ok bool) {
	n = w.Deref(n)
	if n == nil {
		return nil, false
	}
	if n.Kind != yaml.MappingNode {
		w.Errorf(n, "%s must be a mapping, got %s", what, w.Describe(n))
		return nil, false
	}
	seen := map[string]*yaml.Node{}
	var merged []Pair
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := w.Deref(n.Content[i]), n.Content[i+1]
		if k == nil {
			return nil, false
		}
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			merged = append(merged, w.merge(v)...)
			continue
		}
		if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
			w.Errorf(k, "key is not a string: %s", w.Describe(k))
			continue
		}
		if first, dup := seen[k.Value]; dup {
			w.Errorf(k, "key %q repeated (first at line %d)", k.Value, first.Line)
			continue
		}
		seen[k.Value] = k
		pairs = append(pairs, Pair{k, v})
	}
	for _, m := range merged {
		if _, dup := seen[m.K.Value]; !dup {
			seen[m.K.Value] = m.K
			pairs = append(pairs, m)
		}
	}
	return pairs, true
}

// merge returns the pairs a merge key brings in: from a mapping, or from a
// sequence of mappings where earlier ones win.
func (w *Walker) merge(v *yaml.Node) []Pair {
	v = w.Deref(v)
	if v == nil {
		return nil
	}
	var srcs []*yaml.Node
	switch v.Kind {
	case yaml.MappingNode:
		srcs = []*yaml.Node{v}
	case yaml.SequenceNode:
		srcs = v.Content
	default:
		w.Errorf(v, "a merge key (<<) needs a mapping or a list of mappings, got %s", w.Describe(v))
		return nil
	}
	var out []Pair
	seen := map[string]bool{}
	for _, s := range srcs {
		ps, ok := w.Mapping(s, "a merged value")
		if !ok {
			continue
		}
		for _, kv := range ps {
			if !seen[kv.K.Value] {
				seen[kv.K.Value] = true
				out = append(out, kv)
			}
		}
	}
	return out
}

// Fields calls f with each pair of the mapping n, described as what, whose
// key is one of allowed, and reports the others as unknown keys: the strict
// form of Mapping. ok is false when n is not a mapping.
func (w *Walker) Fields(n *yaml.Node, what string, allowed []string, f func(Pair)) (ok bool) {
	pairs, ok := w.Mapping(n, what)
	for _, kv := range pairs {
		if !slices.Contains(allowed, kv.K.Value) {
			w.Unknown(kv.K, what, allowed)
			continue
		}
		f(kv)
	}
	return ok
}

// Unknown reports the key k, which the mapping what does not take.
func (w *Walker) Unknown(k *yaml.Node, what string, allowed []string) {
	w.Errorf(k, "unknown key %q in %s (want one of %s)", k.Value, what, strings.Join(allowed, ", "))
}

// List returns the items of the sequence n, described as what, reporting
// anything else and a list of more than maxLen items.
func (w *Walker) List(n *yaml.Node, what string, maxLen int) ([]*yaml.Node, bool) {
	n = w.Deref(n)
	if n == nil {
		return nil, false
	}
	if n.Kind != yaml.SequenceNode {
		w.Errorf(n, "%s must be a list, got %s", what, w.Describe(n))
		return nil, false
	}
	if len(n.Content) > maxLen {
		w.Errorf(n, "%s has %d items (at most %d)", what, len(n.Content), maxLen)
		return nil, false
	}
	return n.Content, true
}

// IsNull reports whether n is the null scalar (~, null, or nothing).
func IsNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// Describe names n for a problem: "a mapping", "a list", "null", "the
// string \"x\"", or another scalar's text quoted.
func Describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "null"
		case "!!str":
			return fmt.Sprintf("the string %q", n.Value)
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "an alias"
}
