// Package redact takes secrets out of what sluice shows: the password of
// a URL (redis://user:password@host) in any text, and the values of the
// flags that hold secrets in a command line. The debug listener's
// /debug/pprof/cmdline, the logs and the errors go through it, so that
// none of them echoes a Redis password.
//
// It imports only the standard library.
package redact

import "strings"

// Mask is what a secret is replaced with, as net/url's URL.Redacted does.
const Mask = "xxxxx"

// String returns s with the password of every user:password@ in it
// replaced by Mask: in URLs (redis://default:secret@host:6379) and in
// addresses without a scheme (default:secret@host:6379), wherever they
// stand in the text.
//
// It errs on the side of hiding: in each run of text between spaces and
// quotes that holds an '@', what stands after the first ':' of its user
// part (from the start of the run, or after "://", to its last '@') is
// masked, so that a password holding '/', '@' or ':' is hidden whole,
// even where it makes the URL invalid. An '@' with no ':' before it (an
// e-mail address, a user with no password) is left alone.
func String(s string) string {
	if !strings.Contains(s, "@") {
		return s
	}
	var b strings.Builder
	start := 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) && !isDelim(s[i]) {
			continue
		}
		b.WriteString(token(s[start:i]))
		if i < len(s) {
			b.WriteByte(s[i])
		}
		start = i + 1
	}
	return b.String()
}

// isDelim reports whether c ends a run of text that String looks at.
func isDelim(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\r', '\x00', '"', '\'', '`', '<', '>':
		return true
	}
	return false
}

// token masks the password of one run of text.
func token(t string) string {
	at := strings.LastIndexByte(t, '@')
	if at < 0 {
		return t
	}
	user := 0
	if i := strings.Index(t[:at], "://"); i >= 0 {
		user = i + len("://")
	} else if i := strings.IndexByte(t[:at], '='); i >= 0 {
		user = i + 1 // name=user:password@host, as in a flag or a query
	}
	colon := strings.IndexByte(t[user:at], ':')
	if colon < 0 {
		return t
	}
	return t[:user+colon+1] + Mask + t[at:]
}

// Args returns a copy of a command line (os.Args) with its secrets
// masked: the value of every flag whose name says it holds one (see
// SecretFlag), given as --name=value or as --name value, and the password
// of every URL (String).
func Args(args []string) []string {
	out := make([]string, len(args))
	maskNext := false
	for i, a := range args {
		if maskNext {
			out[i], maskNext = Mask, false
			continue
		}
		if name, ok := flagName(a); ok && SecretFlag(name) {
			if j := strings.IndexByte(a, '='); j >= 0 {
				out[i] = a[:j+1] + Mask
			} else {
				out[i], maskNext = a, true
			}
			continue
		}
		out[i] = String(a)
	}
	return out
}

// flagName returns the name of a flag argument (-name, --name,
// --name=value); ok is false for anything else.
func flagName(a string) (string, bool) {
	if len(a) < 2 || a[0] != '-' || a == "--" {
		return "", false
	}
	name := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
	name, _, _ = strings.Cut(name, "=")
	return name, name != ""
}

// SecretFlag reports whether a flag of that name holds a secret: its name
// has "password", "passwd", "secret", "token" (but not "token-file": a
// path), "auth" or "headers" (which carry credentials) in it.
func SecretFlag(name string) bool {
	n := strings.ToLower(name)
	if strings.HasSuffix(n, "-file") {
		return false
	}
	for _, w := range []string{"password", "passwd", "secret", "token", "auth", "headers"} {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}
