package hitters

// KeyHash hashes a key made of entries, one entry at a time: FNV-1a over
// each entry's key and value, each followed by a separator byte that
// strings do not hold in a descriptor (0xff is not UTF-8), so that
// ("ab", "c") and ("a", "bc") differ. Start from NewKeyHash.
type KeyHash uint64

// NewKeyHash is the hash of no entries.
const NewKeyHash KeyHash = 14695981039346656037

// Entry returns h with one more entry.
func (h KeyHash) Entry(key, value string) KeyHash {
	const prime = 1099511628211
	for _, s := range [2]string{key, value} {
		for i := 0; i < len(s); i++ {
			h = (h ^ KeyHash(s[i])) * prime
		}
		h = (h ^ 0xff) * prime
	}
	return h
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
