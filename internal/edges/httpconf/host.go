package httpconf

import (
	"errors"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/idna"
)

// Host returns host, a request's Host or the host of a route's pattern,
// as routes match it, so that two spellings of one name never choose two
// routes: the name's ASCII letters in lower case and one trailing dot
// removed (DNS compares names so: RFC 4343, RFC 1034 3.1), a name with
// other than ASCII in its ASCII form (IDNA, "xn--"), an IPv6 address in
// brackets in lower case, the port kept as it is. A host already so
// written is returned as it is, without allocating.
//
// It refuses what it cannot read as a name or an address with an
// optional port: a port that is not digits, a name with a percent escape
// (an upstream that decoded it would read another name than the routes
// did), an empty label ("a..b", "."), a name that is not valid UTF-8 or
// not valid IDNA. The empty host (HTTP/1.0 sends none) is the empty
// host.
func Host(host string) (string, error) {
	name, port := host, ""
	if strings.HasPrefix(host, "[") {
		i := strings.IndexByte(host, ']')
		if i < 0 {
			return "", errors.New("an IPv6 address without its ]")
		}
		name, port = host[:i+1], host[i+1:]
	} else if i := strings.IndexByte(host, ':'); i >= 0 {
		name, port = host[:i], host[i:]
	}
	if port != "" && (port[0] != ':' || strings.Trim(port[1:], "0123456789") != "") {
		return "", errors.New("a port that is not digits")
	}
	literal := strings.HasPrefix(name, "[")
	upper, other, dots := false, false, false
	for i := 0; i < len(name); i++ {
		c := name[i]
		upper = upper || 'A' <= c && c <= 'Z'
		other = other || c >= utf8.RuneSelf || c == '%' && !literal // a zone, in brackets
		dots = dots || c == '.' && !literal && (i == 0 || i == len(name)-1 || name[i-1] == '.')
	}
	if !upper && !other && !dots {
		return host, nil
	}
	if other {
		switch {
		case strings.IndexByte(name, '%') >= 0:
			return "", errors.New("a name with a percent escape")
		case !utf8.ValidString(name):
			return "", errors.New("a name that is not UTF-8")
		}
		a, err := idna.Lookup.ToASCII(name) // maps case too: Ü is ü
		if err != nil {
			return "", errors.New("a name that is not valid IDNA")
		}
		name = a
	}
	if !literal {
		name = strings.TrimSuffix(name, ".")
		if name == "" || name[0] == '.' || name[len(name)-1] == '.' || strings.Contains(name, "..") {
			return "", errors.New("a name with an empty label")
		}
	}
	return lowerASCII(name) + port, nil
}

// lowerASCII returns s with its ASCII letters in lower case, and nothing
// else changed (strings.ToLower folds other letters too).
func lowerASCII(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
