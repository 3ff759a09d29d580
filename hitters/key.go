package hitters

import (
	"hash/maphash"
	"math/bits"
	"strings"
)

// KeyHash hashes a key made of entries, one entry at a time: each entry's
// key and value hashed apart (maphash, with a seed of this process: a
// tracker's hashes never leave it; nodes merge by key text), each folded
// in by a step that is one-to-one in the hash so far and in the string's
// hash, so that ("ab", "c") and ("a", "bc") differ as their strings'
// hashes do. Start from NewKeyHash.
type KeyHash uint64

// NewKeyHash is the hash of no entries.
const NewKeyHash KeyHash = 14695981039346656037

var keySeed = maphash.MakeSeed()

// Entry returns h with one more entry.
func (h KeyHash) Entry(key, value string) KeyHash {
	h = h.mix(maphash.String(keySeed, key))
	return h.mix(maphash.String(keySeed, value))
}

// mix folds x into h: rotating and multiplying by an odd number are
// one-to-one, and so is adding x.
func (h KeyHash) mix(x uint64) KeyHash {
	return KeyHash(bits.RotateLeft64(uint64(h)*0x9E3779B97F4A7C15, 29) + x)
}

// AppendEntry writes the entry as key=value, after a "/" unless it is the
// first (i == 0): the form of the keys in top lists, which the dashboard
// reads back (Entries). In the key and the value, "%", "/" and "=" are
// written %25, %2F and %3D, so that a value such as a path reads back
// whole.
func AppendEntry(b []byte, i int, key, value string) []byte {
	if i > 0 {
		b = append(b, '/')
	}
	b = appendEscaped(b, key)
	b = append(b, '=')
	return appendEscaped(b, value)
}

// appendEscaped writes s with "%", "/" and "=" escaped.
func appendEscaped(b []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	start := 0
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '%' || c == '/' || c == '=' {
			b = append(append(b, s[start:i]...), '%', hex[c>>4], hex[c&15])
			start = i + 1
		}
	}
	return append(b, s[start:]...)
}

// Entries reads a top key back into its entries' keys and values, as
// AppendEntry wrote them. A "%" not followed by two hex digits is read as
// itself.
func Entries(key string) [][2]string {
	var out [][2]string
	for part := range strings.SplitSeq(key, "/") {
		k, v, _ := strings.Cut(part, "=")
		out = append(out, [2]string{unescape(k), unescape(v)})
	}
	return out
}

// unescape undoes appendEscaped.
func unescape(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			b = append(b, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
			continue
		}
		b = append(b, s[i])
	}
	return string(b)
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
