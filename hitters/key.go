package hitters

import (
	"hash/maphash"
	"math/bits"
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
// reads back.
func AppendEntry(b []byte, i int, key, value string) []byte {
	if i > 0 {
		b = append(b, '/')
	}
	b = append(b, key...)
	b = append(b, '=')
	return append(b, value...)
}
