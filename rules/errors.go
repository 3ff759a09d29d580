package rules

import (
	"errors"
	"fmt"
	"strings"

	"github.com/sluicehq/sluice/internal/yamlwalk"
)

// Problem is one thing wrong with a rules file, or one warning about it.
// Line and Column are 1-based; zero when unknown.
type Problem struct {
	File   string
	Line   int
	Column int
	Msg    string
}

// String formats p as "file:line:col: message", leaving out what is unknown.
func (p Problem) String() string {
	var b strings.Builder
	if p.File != "" {
		b.WriteString(p.File)
		b.WriteByte(':')
	}
	if p.Line > 0 {
		fmt.Fprintf(&b, "%d:", p.Line)
		if p.Column > 0 {
			fmt.Fprintf(&b, "%d:", p.Column)
		}
	}
	if b.Len() > 0 {
		b.WriteByte(' ')
	}
	b.WriteString(p.Msg)
	return b.String()
}

// Error lists every problem found while loading rules. Parse, LoadFile and
// LoadDir return it (as *Error) for invalid input.
type Error struct {
	Problems []Problem
	// Warnings are the warnings of the same files (what loads but has no
	// effect, as Domain.Warnings), so that they can be shown beside the
	// problems. Error prints only the problems.
	Warnings []Problem
}

// Error prints one problem per line.
func (e *Error) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

// SyntaxProblem is the problem of err, a YAML syntax error of the file
// named file as package yamlwalk reports it (at the line where the file
// stops being YAML): the problem Parse reports, so that another reader of
// the same file (the http section's) reports it alike.
func SyntaxProblem(file string, err error) Problem {
	var se *yamlwalk.SyntaxError
	if errors.As(err, &se) {
		return Problem{File: file, Line: se.Line, Msg: "invalid YAML: " + se.Msg}
	}
	return Problem{File: file, Msg: "invalid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}
}
