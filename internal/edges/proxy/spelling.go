package proxy

import (
	"net/http"
	"strings"

	"github.com/sluicehq/sluice/internal/edges/httpconf"
)

// routable returns r as the routes must match it, or why it is refused
// (answered 400): every spelling of a request that an upstream may read
// as the same request must choose the same route, or a client could pick
// the unlimited one by spelling.
//
//   - The host is compared as httpconf.Host writes it: in lower case,
//     without a trailing dot, in its IDNA form; r is copied with that
//     Host, which the upstream then receives as X-Forwarded-Host. A Host
//     that it cannot read (a port that is not digits, a percent escape)
//     is refused. The Host is the request line's for an absolute URI, as
//     net/http reads it; net/http refuses two Host headers.
//   - A percent-encoded '/' or '\' in the path is refused: ServeMux keeps
//     "chat%2Fcompletions" one segment, so no route matches it, where an
//     upstream that decodes it first would serve /chat/completions, a way
//     round every route's limits.
//   - CONNECT is refused: ServeMux matches it by its host with the port
//     and its path as sent (no route, not even "/", matches "CONNECT
//     host:443"), and a reverse proxy has nothing to tunnel.
func routable(r *http.Request) (*http.Request, string) {
	switch {
	case r.Method == http.MethodConnect:
		return nil, "CONNECT: the proxy forwards requests for paths, and tunnels nothing"
	case escapedSeparator(r.URL.EscapedPath()):
		return nil, "an encoded / or \\ (%2F, %5C) in the path: refused, since the upstream may read it as a separator that the routes did not"
	}
	host, err := httpconf.Host(r.Host)
	switch {
	case err != nil:
		return nil, "the Host header: " + err.Error()
	case host != r.Host:
		r2 := new(http.Request) // as http.StripPrefix copies it
		*r2 = *r
		r2.Host = host
		return r2, ""
	}
	return r, ""
}

// escapedSeparator reports whether an escaped path holds a percent-encoded
// '/' or '\\'.
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
