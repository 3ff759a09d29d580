package rules

import "fmt"

// TagMode says which part of a counter key chooses its Redis Cluster slot
// (redisstore.HashTag): the limits of a request whose keys share a slot are
// decided in one atomic script call.
type TagMode uint8

const (
	// TagEntry places a key by its descriptor's first entry (key and
	// value): every limit of one descriptor, and of descriptors that start
	// alike (a per-user limit and a per-user-per-path limit), share a slot.
	// The default.
	TagEntry TagMode = iota
	// TagKey places every counter key on its own: the most even spread;
	// a request with several limits makes one call per slot.
	TagKey
	// TagDomain places every key of a domain in one slot: every request
	// is one call, but a domain's load lands on one Redis node.
	TagDomain
)

var tagModeNames = [...]string{TagEntry: "entry", TagKey: "key", TagDomain: "domain"}

func (m TagMode) String() string {
	if int(m) < len(tagModeNames) {
		return tagModeNames[m]
	}
	return fmt.Sprintf("rules.TagMode(%d)", uint8(m))
}

// ParseTagMode returns the TagMode named s: entry, key or domain.
func ParseTagMode(s string) (TagMode, error) {
	for m, name := range tagModeNames {
		if name == s {
			return TagMode(m), nil
		}
	}
	return 0, fmt.Errorf("unknown hash tag mode %q (entry, key or domain)", s)
}

// HashTag returns the hash tag function of mode for the counter keys Plan
// builds. It returns a substring of the key (no allocation). A key that
// Plan did not build (a library caller's own key), and the domain capacity
// key in TagEntry mode, is its own tag.
func HashTag(mode TagMode) func(key string) string {
	switch mode {
	case TagKey:
		return func(key string) string { return key }
	case TagDomain:
		return func(key string) string {
			if _, end, ok := keyParts(key); ok {
				return key[1:end] // the domain field, whatever the key type
			}
			return key
		}
	}
	return func(key string) string {
		if start, _, ok := keyParts(key); ok && start < len(key) {
			if _, end, ok := entryEnd(key, start); ok {
				return key[start:end]
			}
		}
		return key
	}
}

// keyParts parses a counter key of the forms Plan builds: a rule's ('r',
// the domain and rule fields, the limit's tag "#i/algorithm/period/interval",
// then the entries), an override's ('o', the domain, "/period", the entries)
// or the domain capacity's ('c', the domain, ...). It returns where the
// entries start (the key's end for the capacity) and where the domain field
// ends.
func keyParts(key string) (entries, domainEnd int, ok bool) {
	if len(key) == 0 {
		return 0, 0, false
	}
	switch key[0] {
	case 'c': // the domain capacity: 'c', the domain, '/'...
		_, end, ok := keyField(key, 1)
		return len(key), end, ok
	case 'o':
		return overrideKeyParts(key)
	case 'r':
		return ruleKeyParts(key)
	}
	return 0, 0, false
}

// overrideKeyParts is keyParts of a per-request override's key: 'o', the
// domain, '/period', the entries.
func overrideKeyParts(key string) (entries, domainEnd int, ok bool) {
	_, end, ok := keyField(key, 1)
	if !ok || end >= len(key) || key[end] != '/' {
		return 0, 0, false
	}
	return digitsEnd(key, end+1), end, true
}

// ruleKeyParts is keyParts of a rule's key: 'r', the domain and rule
// fields, the limit's tag "#i/algorithm/period/interval", the entries.
func ruleKeyParts(key string) (entries, domainEnd int, ok bool) {
	_, domainEnd, ok = keyField(key, 1)
	if !ok {
		return 0, 0, false
	}
	_, i, ok := keyField(key, domainEnd)
	if !ok || i >= len(key) || key[i] != '#' {
		return 0, 0, false
	}
	for slashes := 0; i < len(key) && slashes < 3; i++ {
		if key[i] == '/' {
			slashes++
		}
	}
	return digitsEnd(key, i), domainEnd, true
}

// digitsEnd returns the end of the run of decimal digits at i.
func digitsEnd(key string, i int) int {
	for i < len(key) && key[i] >= '0' && key[i] <= '9' {
		i++
	}
	return i
}

// entryEnd returns the end of the entry at i: 'v' or 's' and two fields.
func entryEnd(key string, i int) (start, end int, ok bool) {
	if i >= len(key) || (key[i] != 'v' && key[i] != 's') {
		return 0, 0, false
	}
	_, j, ok := keyField(key, i+1)
	if !ok {
		return 0, 0, false
	}
	_, end, ok = keyField(key, j)
	return i, end, ok
}

// keyField parses a length-prefixed field ("3:abc") at i and returns where its
// text starts and where the field ends.
func keyField(key string, i int) (text, end int, ok bool) {
	n := 0
	j := i
	for j < len(key) && key[j] >= '0' && key[j] <= '9' && j-i < 9 {
		n = n*10 + int(key[j]-'0')
		j++
	}
	if j == i || j >= len(key) || key[j] != ':' || n > len(key)-j-1 {
		return 0, 0, false
	}
	return j + 1, j + 1 + n, true
}
