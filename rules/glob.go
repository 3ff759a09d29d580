package rules

import (
	"bytes"
	"strings"
)

// glob is a wildcard rule's pattern, compiled for matching against a
// request entry's composite key (key, '_', value): the literal runs between
// the pattern's stars. The first run must start the composite, the last
// must end it, and the runs between must appear in order, without
// overlapping, in what lies between; each '*' stands for any run of bytes,
// the empty run included. Nothing else in a pattern is special.
//
// A glob always has at least two runs (at least one star); the first is
// the composite up to its first star. Empty runs between stars ("a**b")
// are dropped: they match anywhere.
type glob [][]byte

// compileGlob returns the pattern of the rule with the given key and value,
// or nil if the rule is not a wildcard.
//
// As envoyproxy/ratelimit does, a rule is a wildcard when its composite
// key (the key, or key_value) holds a '*', wherever it is: in the value
// (tenant: "acme-*"), at the end of a value-less key ("kk*", a key
// prefix), or inside the key ("st*r", "kk*" with a value), and the
// pattern is matched against the request entry's composite key.
func compileGlob(key, value string) glob {
	composite := key
	if value != "" {
		composite += "_" + value
	}
	if !strings.Contains(composite, "*") {
		return nil
	}
	runs := strings.Split(composite, "*")
	g := glob{[]byte(runs[0])}
	for _, s := range runs[1 : len(runs)-1] {
		if s != "" {
			g = append(g, []byte(s))
		}
	}
	return append(g, []byte(runs[len(runs)-1]))
}

// match reports whether s matches the pattern. It is greedy: the first run
// and the last are anchored at either end, and each run between is placed
// at its leftmost occurrence after the previous one, which is always a
// valid choice when any is (a later placement leaves less room for the
// runs that follow). A failed run therefore fails the match, with no
// backtracking: the time is linear in len(s) plus the pattern's length
// (bytes.Index bounds its own worst case), and nothing is allocated.
func (g glob) match(s []byte) bool {
	first, last := g[0], g[len(g)-1]
	if len(s) < len(first)+len(last) || !bytes.HasPrefix(s, first) || !bytes.HasSuffix(s, last) {
		return false
	}
	s = s[len(first) : len(s)-len(last)]
	for _, run := range g[1 : len(g)-1] {
		i := bytes.Index(s, run)
		if i < 0 {
			return false
		}
		s = s[i+len(run):]
	}
	return true
}
