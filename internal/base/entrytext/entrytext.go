// Package entrytext writes descriptor entries as text and reads them
// back: key=value pairs joined by "/" (tenant=acme/user=bob), the form of
// the top keys (package hitters) and of runtime overrides' paths and IDs
// (package overrides).
//
// A key or a value may hold the separators: "%" starts an escape of two
// hex digits. A writer escapes "%" and every separator its reader splits
// on (AppendEscaped); the reader splits on the separators first, then
// unescapes each part (Cut, Unescape), so that every string written reads
// back whole, and two different entry lists never share a text.
//
// Keys that are never read back (maps keyed by a request's entries:
// rules' counter keys, overrides' index, the RLQS buckets, httplimit's
// queues) write each field length-prefixed instead (AppendField), which is
// unambiguous without escaping.
//
// This package imports nothing of sluice.
package entrytext

import (
	"strconv"
	"strings"
)

// AppendField appends s prefixed by its length and ":" ("6:tenant"), so
// that a run of fields reads as one unambiguous string.
func AppendField(b []byte, s string) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	return append(b, s...)
}

// AppendEscaped appends s with "%" and every byte of special written as
// "%" and two upper-case hex digits (%25, %2F for "/", %3D for "=").
// special holds ASCII bytes other than hex digits.
func AppendEscaped(b []byte, s, special string) []byte {
	const hex = "0123456789ABCDEF"
	start := 0
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '%' || strings.IndexByte(special, c) >= 0 {
			b = append(append(b, s[start:i]...), '%', hex[c>>4], hex[c&15])
			start = i + 1
		}
	}
	return append(b, s[start:]...)
}

// Unescape undoes AppendEscaped: every "%" followed by two hex digits
// (either case) is the byte they spell. A "%" not followed by two hex
// digits (text no writer escaped) is read as itself.
func Unescape(s string) string {
	i := strings.IndexByte(s, '%')
	if i < 0 {
		return s
	}
	b := make([]byte, 0, len(s))
	b = append(b, s[:i]...)
	for ; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			b = append(b, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
			continue
		}
		b = append(b, s[i])
	}
	return string(b)
}

// Cut reads one key=value part (split from its neighbours on "/"
// already): the key before the first "=", the value after it, both
// unescaped. ok is false when the part has no "=" (key is then the whole
// part, unescaped).
func Cut(part string) (key, value string, ok bool) {
	k, v, ok := strings.Cut(part, "=")
	return Unescape(k), Unescape(v), ok
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}
