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
	name, port, err := splitPort(host)
	if err != nil {
		return "", err
	}
	literal := strings.HasPrefix(name, "[")
	upper, other, dots := scanHost(name, literal)
	if !upper && !other && !dots {
		return host, nil
	}
	if other {
		if name, err = asciiName(name); err != nil {
			return "", err
		}
	}
	if !literal {
		name = strings.TrimSuffix(name, ".")
		if name == "" || name[0] == '.' || name[len(name)-1] == '.' || strings.Contains(name, "..") {
			return "", errors.New("a name with an empty label")
		}
	}
	return lowerASCII(name) + port, nil
}

// splitPort splits host into its name (an IPv6 address in its brackets)
// and its port, ":" and digits, or "".
func splitPort(host string) (name, port string, err error) {
	name = host
	if strings.HasPrefix(host, "[") {
		i := strings.IndexByte(host, ']')
		if i < 0 {
			return "", "", errors.New("an IPv6 address without its ]")
		}
		name, port = host[:i+1], host[i+1:]
	} else if i := strings.IndexByte(host, ':'); i >= 0 {
		name, port = host[:i], host[i:]
	}
	if port != "" && (port[0] != ':' || strings.Trim(port[1:], "0123456789") != "") {
		return "", "", errors.New("a port that is not digits")
	}
	return name, port, nil
}

// scanHost reports whether name has ASCII upper case letters, other than
// ASCII or a percent sign (outside an address literal's brackets: a
// zone), and a dot that starts, ends or doubles a label.
func scanHost(name string, literal bool) (upper, other, dots bool) {
	for i := 0; i < len(name); i++ {
		c := name[i]
		upper = upper || 'A' <= c && c <= 'Z'
		other = other || c >= utf8.RuneSelf || c == '%' && !literal
		dots = dots || c == '.' && !literal && (i == 0 || i == len(name)-1 || name[i-1] == '.')
	}
	return upper, other, dots
}

// asciiName is name, with other than ASCII, in its ASCII form (IDNA,
// which maps case too: Ü is ü); a percent escape, invalid UTF-8 or
// invalid IDNA are refused.
func asciiName(name string) (string, error) {
	switch {
	case strings.IndexByte(name, '%') >= 0:
		return "", errors.New("a name with a percent escape")
	case !utf8.ValidString(name):
		return "", errors.New("a name that is not UTF-8")
	}
	a, err := idna.Lookup.ToASCII(name)
	if err != nil {
		return "", errors.New("a name that is not valid IDNA")
	}
	return a, nil
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
