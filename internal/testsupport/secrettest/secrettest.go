// Package secrettest makes random passwords for the property tests that
// show no secret is shown (internal/base/redact's, redisstore's, and the
// binary's end to end), and tells whether a text shows one.
//
// A password is runs of eight random letters and digits, with bytes of
// every kind between them: those of URL syntax ('@', ':', '/', "://",
// '#', '?', '%' with and without hexadecimal digits, percent-encodings),
// quotes, spaces, '<' and '>', control bytes, NUL where asked, invalid
// UTF-8 and other Unicode. A text shows the password when it shows any of
// its runs, so that a piece of one (the part before a '/' a parser took
// for a port, a percent-decoded rest) shows as surely as the whole.
//
// It imports only the standard library, and only tests import it.
package secrettest

import (
	"math/rand/v2"
	"net/url"
	"strings"
)

// A Password is a random password and the runs of letters and digits in
// it.
type Password struct {
	Text string
	Runs []string
}

// specials are what stands between the runs.
var specials = []string{"@", ":", "/", "//", "://", "#", "?", "%", "%2", "%zz", "%40", "%2F", "&", "=", "+", ";", ",",
	"'", `"`, "`", " ", "\t", "\n", "<", ">", "\\", "[", "]", "{", "}", "|", "^", "~", "$", "!", "*", "(", ")",
	"é", "日本", "\u202e", "\xff", "\xc3", "\x01", "\x7f", "-", ".", "_"}

// New returns a random password of r: one to three runs, with one to
// three specials between two runs, and maybe before the first and after
// the last. argv says it is for a command line or an environment, which
// cannot hold a NUL (the kernel passes them as C strings); otherwise NUL
// is among the specials.
func New(r *rand.Rand, argv bool) Password {
	sp := specials
	if !argv {
		sp = append(sp[:len(sp):len(sp)], "\x00")
	}
	const alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	var p Password
	var b strings.Builder
	for i := range 1 + r.IntN(3) {
		if i > 0 || r.IntN(2) == 0 {
			for range 1 + r.IntN(3) {
				b.WriteString(sp[r.IntN(len(sp))])
			}
		}
		run := make([]byte, 8)
		for j := range run {
			run[j] = alnum[r.IntN(len(alnum))]
		}
		p.Runs = append(p.Runs, string(run))
		b.Write(run)
	}
	for range r.IntN(3) {
		b.WriteString(sp[r.IntN(len(sp))])
	}
	p.Text = b.String()
	return p
}

// Shown is the first run of p that text holds, "" for none.
func (p Password) Shown(text string) string {
	for _, r := range p.Runs {
		if strings.Contains(text, r) {
			return r
		}
	}
	return ""
}

// URLForms are the ways a password is given in a URL-like value: in the
// userinfo of a URL, with and without a user, as the user, percent-
// encoded or not; in a user:password@host address, alone or in a list.
func URLForms(pw string) []string {
	return []string{
		"redis://default:" + pw + "@127.0.0.1:6379/0",
		"rediss://:" + pw + "@redis.internal:6380",
		"redis://" + pw + "@127.0.0.1:6379",
		"redis://" + url.UserPassword("default", pw).String() + "@127.0.0.1:6379/0?addr=127.0.0.1:6380",
		"redis://:" + url.QueryEscape(pw) + "@h:1",
		"unix://:" + pw + "@/run/redis.sock",
		"default:" + pw + "@127.0.0.1:6379",
		"127.0.0.1:6379,u:" + pw + "@127.0.0.1:6380",
		"http://api:" + pw + "@api.example:8080/v1",
	}
}
