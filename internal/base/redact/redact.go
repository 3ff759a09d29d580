// Package redact takes secrets out of what sluice shows. It works by
// parsing the values that may hold one, never by looking for separators
// in free text, so that a password holding quotes, spaces, '<', '>',
// '@', ':' or '/' is hidden as well as any other:
//
//   - Value masks the userinfo of a URL-like value (a flag's value, a
//     variable's, a configured URL), valid URL or not: everything between
//     its "://" and its last '@' (from its start without "://"), and a
//     value that holds a PEM block (key contents) whole.
//   - Args masks a command line: Value on every argument, and the whole
//     value of every flag whose name says it holds a secret (SecretFlag).
//   - URLError says what is wrong with a URL url.Parse refused, without
//     the URL or the piece of it that url.Parse quotes.
//   - Secrets lists the secrets a process was started with (from its
//     command line and environment), and a Scrubber replaces each of
//     them, in every form a log or an error may spell it (quoted, JSON,
//     percent-encoded), wherever it appears in a text: the safety net of
//     what a process writes to its stderr, for the errors of libraries
//     that quote what they were given.
//
// It imports only the standard library.
package redact

import (
	"cmp"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// Mask is what a secret is replaced with, as net/url's URL.Redacted does.
const Mask = "xxxxx"

// Value returns v with its secrets masked, v being one value whose
// extent is known (a flag's value, an environment variable's, a
// configured URL), not free text:
//
//   - Everything up to the last '@' of v is the userinfo, replaced by
//     Mask, but for the scheme and "://" that v starts with, if any:
//     redis://user:pass@host:6379/0 is redis://xxxxx@host:6379/0, and
//     user:pass@host:6379 (or a comma list of Redis seed addresses that
//     holds one) is xxxxx@host:6379. The last '@', not the first '/'
//     after the host, ends it: a password may hold '/', '?', '#', '@' or
//     "://" when it is not percent-encoded, and is hidden whole all the
//     same, whether url.Parse takes the URL or not.
//   - A value that holds a PEM block ("-----BEGIN"), a key given where
//     its file was expected, is Mask whole.
//
// It errs on the side of hiding: an '@' in a URL's path or query masks
// its host too.
func Value(v string) string {
	if strings.Contains(v, "-----BEGIN") {
		return Mask
	}
	start, at, ok := userinfoOf(v)
	if !ok {
		return v
	}
	return v[:start] + Mask + v[at:]
}

// userinfoOf returns where the part of v that Value masks starts and
// ends (at its last '@'); ok is false when v has no '@'.
func userinfoOf(v string) (start, at int, ok bool) {
	at = strings.LastIndexByte(v, '@')
	if at < 0 {
		return 0, 0, false
	}
	if n := schemeLen(v); n > 0 && strings.HasPrefix(v[n:], "://") && n+len("://") <= at {
		start = n + len("://")
	}
	return start, at, true
}

// schemeLen is the length of the URL scheme v starts with (RFC 3986: a
// letter, then letters, digits, '+', '-' or '.'), 0 for none.
func schemeLen(v string) int {
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return i
		}
	}
	return len(v)
}

// userinfos returns the parts of v that Value masks.
func userinfos(v string) []string {
	if strings.Contains(v, "-----BEGIN") {
		return []string{v}
	}
	if start, at, ok := userinfoOf(v); ok {
		return []string{v[start:at]}
	}
	return nil
}

// Args returns a copy of a command line (os.Args) with its secrets
// masked: the value of every flag whose name says it holds one (see
// SecretFlag), given as --name=value or as --name value, is Mask, and
// every other argument or value is Value's.
func Args(args []string) []string {
	out := make([]string, len(args))
	maskNext := false
	for i, a := range args {
		if maskNext {
			out[i], maskNext = Mask, false
			continue
		}
		name, value, hasValue, ok := flagOf(a)
		switch {
		case !ok:
			out[i] = Value(a)
		case SecretFlag(name) && hasValue:
			out[i] = a[:len(a)-len(value)] + Mask
		case SecretFlag(name):
			out[i], maskNext = a, true
		case hasValue:
			out[i] = a[:len(a)-len(value)] + Value(value)
		default:
			out[i] = Value(a)
		}
	}
	return out
}

// flagOf splits a flag argument (-name, --name, --name=value) into its
// name and its value; ok is false for anything else.
func flagOf(a string) (name, value string, hasValue, ok bool) {
	if len(a) < 2 || a[0] != '-' || a == "--" {
		return "", "", false, false
	}
	name = strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
	if name == "" || name[0] == '-' || name[0] == '=' || strings.Contains(a, "-----BEGIN") {
		return "", "", false, false // not a flag to the flag package, or a PEM block
	}
	name, value, hasValue = strings.Cut(name, "=")
	return name, value, hasValue, true
}

// secretWords are the words of a flag's or a variable's name that say it
// holds a secret.
var secretWords = []string{"password", "passwd", "pass", "pwd", "secret", "token", "auth", "headers", "credential", "apikey", "api-key", "private"}

// notSecretWords are the words of a name that say it holds no secret,
// whatever secretWords it holds too: a count of tokens (a model's, as
// --completion-tokens), and the modes of the rate limit headers of an
// answer (--response-headers ietf, --envoy-headers=true,
// LIMIT_RESPONSE_HEADERS_ENABLED), whose values ("true", "ietf") would,
// as secrets, be blotted out of every log line.
var notSecretWords = []string{"tokens", "response-headers", "envoy-headers"}

// SecretFlag reports whether a flag of that name holds a secret: its name
// has "password", "passwd", "pass", "pwd", "secret", "token", "auth",
// "headers" (which carry credentials), "credential", "apikey", "api-key"
// or "private" in it; and not "tokens" (a count), "response-headers" or
// "envoy-headers" (modes of an answer's headers), and does not end in
// "-file" (a path, as --admin-token-file).
func SecretFlag(name string) bool {
	n := strings.ToLower(name)
	if strings.HasSuffix(n, "-file") {
		return false
	}
	for _, w := range notSecretWords {
		if strings.Contains(n, w) {
			return false
		}
	}
	for _, w := range secretWords {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// SecretEnv reports whether an environment variable of that name holds a
// secret, by SecretFlag's words (REDIS_AUTH, SLUICE_REDIS_PASSWORD,
// OTEL_EXPORTER_OTLP_HEADERS; not SLUICE_ADMIN_TOKEN_FILE).
func SecretEnv(name string) bool {
	return SecretFlag(strings.ReplaceAll(name, "_", "-"))
}

// URLError says what is wrong with a URL, from the error url.Parse (or a
// parser that wraps it) returned, without the URL, which may hold a
// password, and without the piece of it url.Parse quotes (an invalid
// port, host character or escape may be part of one): `parse
// "redis://:p w@h": net/url: invalid userinfo` is "invalid userinfo",
// `invalid port ":pa" after host` is "invalid port after host".
func URLError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var ee url.EscapeError
	if errors.As(err, &ee) {
		return "invalid URL escape (a % not followed by two hexadecimal digits)"
	}
	var he url.InvalidHostError
	if errors.As(err, &he) {
		return "invalid character in host name"
	}
	msg := strings.TrimPrefix(err.Error(), "net/url: ")
	// Drop every quoted piece: what url.Parse quotes comes from the URL.
	var b strings.Builder
	for msg != "" {
		q := strings.IndexAny(msg, "\"`")
		if q < 0 {
			b.WriteString(msg)
			break
		}
		b.WriteString(msg[:q])
		p, err := strconv.QuotedPrefix(msg[q:])
		if err != nil {
			break // an unterminated quote: drop the rest
		}
		msg = msg[q+len(p):]
	}
	return strings.Join(strings.Fields(b.String()), " ")
}

// Secrets returns the secrets of a process started with the command line
// args and the environment environ (NAME=value, as os.Environ): the
// whole value of every secret flag (SecretFlag) and secret variable
// (SecretEnv), and the part of every other argument or value that Value
// masks; with each, its part after the first ':' (a user:password's
// password) and, for a secret list of headers, each key=value's value.
// Only the variables a process reads should be in environ: the text
// before an '@' of any of them becomes a secret.
func Secrets(args, environ []string) []string {
	var out []string
	add := func(s string) {
		if s == "" {
			return
		}
		out = append(out, s)
		if _, pw, ok := strings.Cut(s, ":"); ok && pw != "" {
			out = append(out, pw)
		}
	}
	addSecret := func(name, v string) {
		add(v)
		if !strings.Contains(strings.ToLower(name), "headers") {
			return
		}
		for item := range strings.SplitSeq(v, ",") {
			if _, hv, ok := strings.Cut(item, "="); ok {
				add(hv)
				if _, cred, ok := strings.Cut(strings.TrimSpace(hv), " "); ok {
					add(cred) // "Bearer TOKEN"
				}
			}
		}
	}
	secretNext := ""
	for _, a := range args {
		if secretNext != "" {
			addSecret(secretNext, a)
			secretNext = ""
			continue
		}
		name, value, hasValue, ok := flagOf(a)
		switch {
		case ok && SecretFlag(name) && hasValue:
			addSecret(name, value)
		case ok && SecretFlag(name):
			secretNext = name
		case ok && hasValue:
			a = value
			fallthrough
		default:
			for _, u := range userinfos(a) {
				add(u)
			}
		}
	}
	for _, kv := range environ {
		name, v, _ := strings.Cut(kv, "=")
		if SecretEnv(name) {
			addSecret(name, v)
			continue
		}
		for _, u := range userinfos(v) {
			add(u)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// MinScrub is the length of the shortest secret a Scrubber looks for:
// shorter ones would blot out common words and numbers of every line.
// Value and Args mask a secret of any length where they know it stands.
const MinScrub = 4

// A Scrubber replaces secrets with Mask in any text. The zero value and
// nil replace nothing.
type Scrubber struct {
	r *strings.Replacer
}

// NewScrubber returns a Scrubber of secrets, each found in every form a
// log line or an error may give it: as it is; percent-decoded; cut at a
// '/', '?', '#', '@', ',', ';', '=', '&' or a space (the part before,
// and the part after: a parser that took it for a URL's port and path);
// Go-quoted (%q, the text logs), JSON-escaped (the JSON logs) and
// percent-encoded (in a URL, its query or its userinfo); and quoted or
// escaped once more (a quoted URL in an error, in a log line). Forms
// shorter than MinScrub are left out.
func NewScrubber(secrets []string) *Scrubber {
	set := map[string]bool{}
	for _, s := range secrets {
		for _, f := range forms(s) {
			if len(f) >= MinScrub && f != Mask {
				set[f] = true
			}
		}
	}
	if len(set) == 0 {
		return &Scrubber{}
	}
	// Longest first: where two forms start at one place, the longer wins.
	all := slices.SortedFunc(maps.Keys(set), func(a, b string) int {
		return cmp.Or(cmp.Compare(len(b), len(a)), strings.Compare(a, b))
	})
	pairs := make([]string, 0, 2*len(all))
	for _, f := range all {
		pairs = append(pairs, f, Mask)
	}
	return &Scrubber{r: strings.NewReplacer(pairs...)}
}

// forms are the spellings of s that NewScrubber looks for.
func forms(s string) []string {
	base := []string{s}
	// The pieces a parser cuts a secret into where it is not
	// percent-encoded: a URL's (the "port" before a '/', the path after
	// it), a list's or a header's (at ',', ';', '=', '&', spaces).
	for i := 0; i < len(s); i++ {
		if strings.IndexByte("/?#@ \t\n,;=&", s[i]) >= 0 {
			base = append(base, s[:i], s[i+1:])
		}
	}
	if d, err := url.PathUnescape(s); err == nil && d != s {
		base = append(base, d)
	}
	if d, err := url.QueryUnescape(s); err == nil && d != s {
		base = append(base, d)
	}
	var once []string
	for _, b := range base {
		once = append(once, b, quoted(b), quotedASCII(b), jsonText(b, true), jsonText(b, false),
			url.PathEscape(b), url.QueryEscape(b), url.User(b).String(), strings.TrimPrefix(url.UserPassword("", b).String(), ":"))
	}
	out := slices.Clone(once)
	for _, o := range once {
		out = append(out, quoted(o), jsonText(o, true), jsonText(o, false))
	}
	return out
}

// quoted is s as strconv.Quote writes it, without the quotes.
func quoted(s string) string {
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}

// quotedASCII is s as strconv.QuoteToASCII writes it, without the quotes.
func quotedASCII(s string) string {
	q := strconv.QuoteToASCII(s)
	return q[1 : len(q)-1]
}

// jsonText is s as a JSON string, without the quotes, with or without
// the escapes of '<', '>' and '&' (encoding/json's, and log/slog's).
func jsonText(s string, escapeHTML bool) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(escapeHTML)
	enc.Encode(s) // a string always encodes
	q := strings.TrimSuffix(b.String(), "\n")
	return q[1 : len(q)-1]
}

// String returns t with every secret of s replaced by Mask.
func (s *Scrubber) String(t string) string {
	if s == nil || s.r == nil {
		return t
	}
	return s.r.Replace(t)
}

// Writer returns a writer that writes to w what it is given, scrubbed.
// Each Write is scrubbed on its own: a secret split across two writes is
// not found, so give it whole lines (log/slog's handlers and fmt.Fprint
// write a record or a message at once).
func (s *Scrubber) Writer(w io.Writer) io.Writer {
	if s == nil || s.r == nil {
		return w
	}
	return &scrubWriter{s: s, w: w}
}

type scrubWriter struct {
	s *Scrubber
	w io.Writer
}

func (sw *scrubWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(sw.w, sw.s.r.Replace(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}
