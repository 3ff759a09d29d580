package proxy

import "strings"

// escapedSeparator reports whether an escaped path holds a percent-encoded
// '/' or '\\'.
//
// Proxy.ServeHTTP refuses such a path: ServeMux keeps "chat%2Fcompletions"
// one segment, so no route matches it, where an upstream that decodes it
// first would serve /chat/completions, a way round every route's limits.
func escapedSeparator(path string) bool {
	for {
		i := strings.IndexByte(path, '%')
		if i < 0 || i+3 > len(path) {
			return false
		}
		if c := path[i+1 : i+3]; strings.EqualFold(c, "2f") || strings.EqualFold(c, "5c") {
			return true
		}
		path = path[i+1:]
	}
}
