package hitters

import (
	"hash/maphash"
	"math/bits"
	"strings"

	"github.com/sluicehq/sluice/internal/base/entrytext"
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
	b = entrytext.AppendEscaped(b, key, "/=")
	b = append(b, '=')
	return entrytext.AppendEscaped(b, value, "/=")
}

// Entries reads a top key back into its entries' keys and values, as
// AppendEntry wrote them. A "%" not followed by two hex digits is read as
// itself.
func Entries(key string) [][2]string {
	var out [][2]string
	for part := range strings.SplitSeq(key, "/") {
		k, v, _ := entrytext.Cut(part)
		out = append(out, [2]string{k, v})
	}
	return out
}
