package rules

import (
	"fmt"
	"strings"
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
