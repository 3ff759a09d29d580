package rules

// CompileGlob exposes the wildcard matcher to the tests: the match function
// of the rule (key, value) against an entry's composite key (key '_'
// value), or nil if the rule is not a wildcard.
func CompileGlob(key, value string) func([]byte) bool {
	g := compileGlob(key, value)
	if g == nil {
		return nil
	}
	return g.match
}
