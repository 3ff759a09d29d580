package rules

import (
	"fmt"
	"regexp"
	"strconv"
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
}

// Error prints one problem per line.
func (e *Error) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// SyntaxProblem is the problem of err, a syntax error of go.yaml.in/yaml/v3
// in the file named file, at its line: the problem Parse reports, so that
// another reader of the same file (the http section's) reports it alike.
func SyntaxProblem(file string, err error) Problem {
	msg := err.Error()
	line := 0
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = m[2]
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
	}
	return Problem{File: file, Line: line, Msg: "invalid YAML: " + msg}
}
