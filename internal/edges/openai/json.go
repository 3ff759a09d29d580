package openai

import (
	"bytes"
	"fmt"
	"strconv"
	"sync"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// The JSON a token budget reads: a request's body, strictly (with Enforce,
// a body that parsers could read differently is refused, since the API's
// parser is not ours), and the usage of an answer.
//
// Strict is RFC 8259 JSON with one object at the top and nothing else:
// no byte order mark, UTF-8 only, no NaN or Infinity, no trailing data,
// at most maxJSONDepth levels, and no key repeated in one object, keys
// compared after their escapes are decoded and with case folded as Go's
// encoding/json folds them (the spellings a parser may take for one
// field); a key holds no NUL and no lone surrogate.

// maxJSONDepth bounds the nesting of a strict body; CPython's json module
// refuses a body about twice as deep as this.
const maxJSONDepth = 512

// maxOpenKeys bounds the keys of the open objects, which the scan keeps
// to find repeats (one object of 700,000 members held 115 MB).
const maxOpenKeys = 1 << 14

// smallObject is the number of keys of an object compared pairwise for
// repeats; a larger object keeps a set of its folded keys.
const smallObject = 16

// jsonMember is a member of the top object of a scanned body.
type jsonMember struct {
	key    []byte // decoded
	vs, ve int    // its value is body[vs:ve]
}

// strictJSON scans a body strictly, keeping the members of its top
// object. Reused through jsonScanners.
type strictJSON struct {
	top  []jsonMember
	end  int      // the offset of the top object's closing brace
	keys [][]byte // the keys of the open objects, innermost last
	open []int    // per open container: where its keys start in keys (-1: an array)
	sets []map[string]struct{}
	fold []byte // scratch for folding
}

var jsonScanners = sync.Pool{New: func() any { return new(strictJSON) }}

// strictError is why a body is not strict JSON; it reads as a request
// value that makes the request invalid (400).
func strictError(off int, format string, args ...any) error {
	return Invalid(fmt.Sprintf("the body is not strict JSON: "+format+" (byte %d)", append(args, off)...))
}

// quoteKey quotes a key for a message, cut to 64 bytes.
func quoteKey(k []byte) string {
	if len(k) > 64 {
		return strconv.Quote(string(k[:64])) + "..."
	}
	return strconv.Quote(string(k))
}

// scan reads b, which must be one strict JSON object.
func (s *strictJSON) scan(b []byte) error {
	i, err := s.start(b)
	if err != nil {
		return err
	}
	for {
		i = skipSpace(b, i)
		if i == len(b) {
			return strictError(i, "it ends early")
		}
		more := false // a container opened, not empty: its first value next
		if c := b[i]; c == '{' || c == '[' {
			i, more, err = s.openAt(b, i)
		} else {
			i, err = scanScalar(b, i)
		}
		if err != nil {
			return err
		}
		if more {
			continue
		}
		var done bool
		if i, done, err = s.next(b, i); err != nil || done {
			return err
		}
	}
}

// start resets s for b, and returns the offset of b's top object.
func (s *strictJSON) start(b []byte) (int, error) {
	s.top, s.keys, s.open, s.end = s.top[:0], s.keys[:0], s.open[:0], 0
	clear(s.sets)
	s.sets = s.sets[:0]
	if z := bytes.IndexByte(b, 0); z >= 0 { // never in JSON's UTF-8, always in UTF-16's
		return 0, strictError(z, "it holds a NUL byte (is it UTF-16 or UTF-32?)")
	}
	i := skipSpace(b, 0)
	if i == len(b) || b[i] != '{' {
		switch {
		case bytes.HasPrefix(b, []byte("\xef\xbb\xbf")):
			return 0, strictError(0, "it starts with a byte order mark")
		case bytes.HasPrefix(b, []byte("\xfe\xff")) || bytes.HasPrefix(b, []byte("\xff\xfe")):
			return 0, strictError(0, "it starts with a UTF-16 byte order mark")
		}
		return 0, strictError(i, "it is not a JSON object")
	}
	return i, nil
}

// openAt opens the object or array at b[i]: more when it is not empty,
// its first value (after an object's first key) next.
func (s *strictJSON) openAt(b []byte, i int) (int, bool, error) {
	c := b[i]
	if len(s.open) == maxJSONDepth {
		return i, false, strictError(i, "it nests deeper than %d levels", maxJSONDepth)
	}
	open := -1
	if c == '{' {
		open = len(s.keys)
	}
	s.open, s.sets = append(s.open, open), append(s.sets, nil)
	i = skipSpace(b, i+1)
	switch {
	case i < len(b) && b[i] == c+2: // } or ]: empty
		return s.pop(b, i), false, nil
	case c == '{':
		i, err := s.key(b, i)
		return i, true, err
	}
	return i, true, nil
}

// scanScalar scans the string, literal or number at b[i].
func scanScalar(b []byte, i int) (int, error) {
	switch c := b[i]; {
	case c == '"':
		i, _, err := scanString(b, i)
		return i, err
	case c == 't' || c == 'f' || c == 'n':
		lit := literal(c)
		if !bytes.HasPrefix(b[i:], lit) {
			return i, strictError(i, "unexpected %q", b[i])
		}
		return i + len(lit), nil
	case c == '-' || '0' <= c && c <= '9':
		return scanNumber(b, i)
	default:
		return i, strictError(i, "unexpected %q", c)
	}
}

// next goes on after a value that ends at i: to the next value of its
// container (after an object's next key), closing the containers that
// end; done at the end of the top object, with nothing after it.
func (s *strictJSON) next(b []byte, i int) (int, bool, error) {
	for {
		if len(s.open) == 0 {
			if j := skipSpace(b, i); j != len(b) {
				return j, false, strictError(j, "data follows the JSON object")
			}
			return i, true, nil
		}
		if len(s.open) == 1 {
			s.top[len(s.top)-1].ve = i
		}
		i = skipSpace(b, i)
		if i == len(b) {
			return i, false, strictError(i, "it ends early")
		}
		obj := s.open[len(s.open)-1] >= 0
		switch c := b[i]; {
		case c == ',' && obj:
			i, err := s.key(b, skipSpace(b, i+1))
			return i, false, err
		case c == ',':
			return i + 1, false, nil
		case c == '}' && obj || c == ']' && !obj:
			i = s.pop(b, i)
		default:
			return i, false, strictError(i, "unexpected %q", c)
		}
	}
}

// pop closes the container whose closing byte is at i, and returns the
// offset after it.
func (s *strictJSON) pop(b []byte, i int) int {
	n := len(s.open) - 1
	if o := s.open[n]; o >= 0 {
		s.keys = s.keys[:o]
	}
	s.sets[n] = nil
	s.open, s.sets = s.open[:n], s.sets[:n]
	if n == 0 {
		s.end = i
	}
	return i + 1
}

// literal is the literal that starts with c.
func literal(c byte) []byte {
	switch c {
	case 't':
		return []byte("true")
	case 'f':
		return []byte("false")
	}
	return []byte("null")
}

// key reads the key at i of the innermost object, and the colon after
// it, refusing a key that repeats another of the object's; it returns the
// offset of the value.
func (s *strictJSON) key(b []byte, i int) (int, error) {
	if i == len(b) || b[i] != '"' {
		return i, strictError(i, "a key must be a string")
	}
	end, esc, err := scanString(b, i)
	if err != nil {
		return i, err
	}
	k := b[i+1 : end-1]
	if esc {
		if k, err = decodeKey(k); err != nil {
			return i, strictError(i, "key %s: %v", quoteKey(b[i+1:end-1]), err)
		}
	}
	if bytes.IndexByte(k, 0) >= 0 {
		return i, strictError(i, "key %s holds a NUL", quoteKey(k))
	}
	if len(s.keys) >= maxOpenKeys {
		return i, strictError(i, "more than %d members in an object and those around it", maxOpenKeys)
	}
	n := len(s.open) - 1
	mine := s.keys[s.open[n]:]
	switch {
	case len(mine) < smallObject:
		for _, o := range mine {
			if bytes.EqualFold(o, k) {
				return i, s.repeated(i, o, k)
			}
		}
	default:
		if s.sets[n] == nil {
			s.sets[n] = make(map[string]struct{}, 2*smallObject)
			for _, o := range mine {
				s.fold = appendFold(s.fold[:0], o)
				s.sets[n][string(s.fold)] = struct{}{}
			}
		}
		s.fold = appendFold(s.fold[:0], k)
		if _, ok := s.sets[n][string(s.fold)]; ok {
			for _, o := range mine {
				if bytes.EqualFold(o, k) {
					return i, s.repeated(i, o, k)
				}
			}
		}
		s.sets[n][string(s.fold)] = struct{}{}
	}
	s.keys = append(s.keys, k)
	j := skipSpace(b, end)
	if j == len(b) || b[j] != ':' {
		return j, strictError(j, "a colon must follow key %s", quoteKey(k))
	}
	j = skipSpace(b, j+1)
	if n == 0 {
		s.top = append(s.top, jsonMember{key: k, vs: j})
	}
	return j, nil
}

// repeated is the error of key k at i, which repeats o.
func (s *strictJSON) repeated(i int, o, k []byte) error {
	if bytes.Equal(o, k) {
		return strictError(i, "key %s is repeated, and parsers differ on which they read", quoteKey(k))
	}
	return strictError(i, "keys %s and %s are repeated (equal but for case), and parsers differ on which they read", quoteKey(o), quoteKey(k))
}

// appendFold appends k folded as encoding/json folds field names: keys
// with equal folds are equal to bytes.EqualFold.
func appendFold(dst, k []byte) []byte {
	for i := 0; i < len(k); {
		if c := k[i]; c < utf8.RuneSelf {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			dst = append(dst, c)
			i++
			continue
		}
		r, n := utf8.DecodeRune(k[i:])
		for {
			r2 := unicode.SimpleFold(r)
			if r2 <= r {
				r = r2
				break
			}
			r = r2
		}
		dst = utf8.AppendRune(dst, r)
		i += n
	}
	return dst
}

func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// plain marks the bytes a string holds as they are: printable ASCII but
// the quote and the backslash.
var plain = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// scanString reads the string whose quote is at i, and returns the
// offset after its closing quote and whether it holds escapes.
func scanString(b []byte, i int) (int, bool, error) {
	esc := false
	for i++; i < len(b); {
		c := b[i]
		if plain[c] {
			i++
			continue
		}
		switch {
		case c == '"':
			return i + 1, esc, nil
		case c == '\\':
			esc = true
			if i+1 == len(b) {
				return i, esc, strictError(i, "it ends early")
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || !isHex4(b[i+2:i+6]) {
					return i, esc, strictError(i, "a \\u escape needs four hex digits")
				}
				i += 6
			default:
				return i, esc, strictError(i, "unknown escape \\%c", b[i+1])
			}
		case c < 0x20:
			return i, esc, strictError(i, "a control character in a string")
		default:
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n == 1 {
				return i, esc, strictError(i, "it is not UTF-8")
			}
			i += n
		}
	}
	return i, esc, strictError(i, "it ends early")
}

func isHex4(h []byte) bool {
	for _, c := range h {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// decodeKey decodes the escapes of a key (between its quotes), refusing a
// lone surrogate.
func decodeKey(k []byte) ([]byte, error) {
	out := make([]byte, 0, len(k))
	for i := 0; i < len(k); {
		if k[i] != '\\' {
			out = append(out, k[i])
			i++
			continue
		}
		c := k[i+1]
		i += 2
		switch c {
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r := hex4(k[i:])
			i += 4
			if utf16.IsSurrogate(r) {
				var r2 rune = -1
				if i+6 <= len(k) && k[i] == '\\' && k[i+1] == 'u' {
					r2 = hex4(k[i+2:])
				}
				if r = utf16.DecodeRune(r, r2); r == unicode.ReplacementChar {
					return nil, fmt.Errorf("a lone surrogate")
				}
				i += 6
			}
			out = utf8.AppendRune(out, r)
		default: // " \ /
			out = append(out, c)
		}
	}
	return out, nil
}

func hex4(h []byte) rune {
	var r rune
	for _, c := range h[:4] {
		switch {
		case c <= '9':
			c -= '0'
		case c >= 'a':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// scanNumber reads the number at i: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func scanNumber(b []byte, i int) (int, error) {
	start := i
	if b[i] == '-' {
		i++
	}
	digits := func() int {
		j := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		return i - j
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case digits() == 0:
		return i, strictError(start, "a number needs digits")
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			return i, strictError(start, "a number needs digits after its point")
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return i, strictError(start, "a number needs digits in its exponent")
		}
	}
	return i, nil
}

// The readers of scanned JSON below trust what they are given to be
// valid: a body scan accepted, or a part of one.

// skipValue returns the offset after the value that starts at i.
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	for i < len(b) {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}

// skipString returns the offset after the string whose quote is at i.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return i
}

// eachMember calls fn with the raw key (between its quotes, escapes
// undecoded) and the value of every member of the object obj, until fn
// returns false.
func eachMember(obj []byte, fn func(key, val []byte) bool) {
	i := skipSpace(obj, 1)
	for i < len(obj) && obj[i] == '"' {
		ke := skipString(obj, i)
		vs := skipSpace(obj, skipSpace(obj, ke)+1)
		ve := skipValue(obj, vs)
		if !fn(obj[i+1:ke-1], obj[vs:ve]) {
			return
		}
		i = skipSpace(obj, ve)
		if i < len(obj) && obj[i] == ',' {
			i = skipSpace(obj, i+1)
		}
	}
}

// eachElement calls fn with every element of the array arr, until fn
// returns false.
func eachElement(arr []byte, fn func(val []byte) bool) {
	i := skipSpace(arr, 1)
	for i < len(arr) && arr[i] != ']' {
		ve := skipValue(arr, i)
		if !fn(arr[i:ve]) {
			return
		}
		i = skipSpace(arr, ve)
		if i < len(arr) && arr[i] == ',' {
			i = skipSpace(arr, i+1)
		}
	}
}

// keyIs reports whether the raw key k names name, as a parser that folds
// case may read it (decoding escapes when it has any).
func keyIs(k []byte, name string) bool {
	if bytes.IndexByte(k, '\\') >= 0 {
		d, err := decodeKey(k)
		if err != nil {
			return false
		}
		k = d
	}
	return bytes.EqualFold(k, []byte(name))
}

// wholeNumber reads v as a whole number: digits alone, no sign, fraction
// or exponent, at most 18 of them.
func wholeNumber(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 18 || len(v) > 1 && v[0] == '0' {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}
