package httpretry

import "strings"

// The RateLimit and RateLimit-Policy fields are Structured Field Lists
// (RFC 8941): members separated by commas, each an Item (a bare item and its
// parameters) or an Inner List. parseList checks the whole grammar, so that a
// field that is not a valid List is ignored entirely, as the draft requires,
// and keeps only what the rate limit fields need: the bare item when it is a
// String, and the Integer parameters r, t, q and w.

// sfParam indexes the parameters an sfItem keeps.
const (
	paramR = iota // RateLimit: remaining quota units
	paramT        // RateLimit: seconds until the quota resets
	paramQ        // RateLimit-Policy: quota
	paramW        // RateLimit-Policy: window in seconds
	numParams
)

// sfInt is a parameter of interest: present, and whether its value is an
// Integer (and then which).
type sfInt struct {
	v       int64
	present bool
	integer bool
}

// sfItem is one member of a List, reduced to what the fields use.
type sfItem struct {
	name     string // the bare item, when it is a String
	isString bool
	params   [numParams]sfInt
}

// maxListMembers bounds the members parseList keeps, so that a hostile
// field cannot make the client allocate without limit. A longer list is
// treated as malformed.
const maxListMembers = 64

// parseList parses s as an RFC 8941 List, appending its members to dst. It
// reports false, and dst unchanged, when s is not a valid List.
func parseList(s string, dst []sfItem) ([]sfItem, bool) {
	p := sfParser{s: strings.TrimLeft(s, " ")}
	p.s = strings.TrimRight(p.s, " ")
	n := len(dst)
	for p.s != "" {
		if len(dst)-n >= maxListMembers {
			return dst[:n], false
		}
		var it sfItem
		if p.peek() == '(' {
			if !p.innerList(&it) {
				return dst[:n], false
			}
		} else if !p.item(&it) {
			return dst[:n], false
		}
		dst = append(dst, it)
		p.ows()
		if p.s == "" {
			return dst, true
		}
		if p.peek() != ',' {
			return dst[:n], false
		}
		p.s = p.s[1:]
		p.ows()
		if p.s == "" {
			return dst[:n], false // a trailing comma
		}
	}
	return dst, true
}

type sfParser struct{ s string }

func (p *sfParser) peek() byte {
	if p.s == "" {
		return 0
	}
	return p.s[0]
}

// ows skips optional white space: spaces and horizontal tabs.
func (p *sfParser) ows() {
	for p.s != "" && (p.s[0] == ' ' || p.s[0] == '\t') {
		p.s = p.s[1:]
	}
}

func (p *sfParser) sp() {
	for p.s != "" && p.s[0] == ' ' {
		p.s = p.s[1:]
	}
}

// item parses an Item: a bare item and its parameters.
func (p *sfParser) item(it *sfItem) bool {
	c := p.peek()
	if c == '"' {
		s, ok := p.str()
		if !ok {
			return false
		}
		it.name, it.isString = s, true
	} else if _, _, ok := p.bareItem(); !ok {
		return false
	}
	return p.params(it)
}

// innerList parses an Inner List, which the rate limit fields never hold:
// it is checked and its members dropped.
func (p *sfParser) innerList(it *sfItem) bool {
	p.s = p.s[1:] // '('
	for {
		p.sp()
		if p.peek() == ')' {
			p.s = p.s[1:]
			return p.params(it)
		}
		var inner sfItem
		if !p.item(&inner) {
			return false
		}
		if c := p.peek(); c != ' ' && c != ')' {
			return false
		}
	}
}

// params parses the parameters of an item, keeping r, t, q and w. A later
// parameter of the same name replaces an earlier one (RFC 8941 §4.2.3.2).
func (p *sfParser) params(it *sfItem) bool {
	for p.peek() == ';' {
		p.s = p.s[1:]
		p.sp()
		key, ok := p.key()
		if !ok {
			return false
		}
		v := sfInt{present: true}
		if p.peek() == '=' {
			p.s = p.s[1:]
			n, isInt, ok := p.bareItem()
			if !ok {
				return false
			}
			v.v, v.integer = n, isInt
		}
		switch key {
		case "r":
			it.params[paramR] = v
		case "t":
			it.params[paramT] = v
		case "q":
			it.params[paramQ] = v
		case "w":
			it.params[paramW] = v
		}
	}
	return true
}

// key parses a parameter key: lcalpha or '*', then lcalpha, digits and
// "_-.*".
func (p *sfParser) key() (string, bool) {
	c := p.peek()
	if !(c >= 'a' && c <= 'z' || c == '*') {
		return "", false
	}
	i := 1
	for i < len(p.s) {
		c := p.s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.' || c == '*') {
			break
		}
		i++
	}
	k := p.s[:i]
	p.s = p.s[i:]
	return k, true
}

// bareItem parses any bare item and returns its value when it is an
// Integer.
func (p *sfParser) bareItem() (n int64, isInt, ok bool) {
	c := p.peek()
	switch {
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	case c == '"':
		_, ok := p.str()
		return 0, false, ok
	case c == '*' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z':
		p.token()
		return 0, false, true
	case c == ':':
		return 0, false, p.bytes()
	case c == '?':
		if len(p.s) < 2 || p.s[1] != '0' && p.s[1] != '1' {
			return 0, false, false
		}
		p.s = p.s[2:]
		return 0, false, true
	}
	return 0, false, false
}

// number parses an Integer (at most 15 digits) or a Decimal (at most 12
// integer and 3 fractional digits).
func (p *sfParser) number() (n int64, isInt, ok bool) {
	neg := false
	if p.s[0] == '-' {
		neg = true
		p.s = p.s[1:]
	}
	i := 0
	for i < len(p.s) && p.s[i] >= '0' && p.s[i] <= '9' {
		n = n*10 + int64(p.s[i]-'0')
		i++
		if i > 15 {
			return 0, false, false
		}
	}
	if i == 0 {
		return 0, false, false
	}
	if i < len(p.s) && p.s[i] == '.' {
		if i > 12 {
			return 0, false, false
		}
		j := i + 1
		for j < len(p.s) && p.s[j] >= '0' && p.s[j] <= '9' {
			j++
		}
		if f := j - i - 1; f < 1 || f > 3 {
			return 0, false, false
		}
		p.s = p.s[j:]
		return 0, false, true
	}
	p.s = p.s[i:]
	if neg {
		n = -n
	}
	return n, true, true
}

// str parses a String, unescaping it.
func (p *sfParser) str() (string, bool) {
	s := p.s[1:] // '"'
	var b *strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"':
			out := s[:i]
			if b != nil {
				out = b.String()
			}
			p.s = s[i+1:]
			return out, true
		case c == '\\':
			if i+1 >= len(s) || s[i+1] != '"' && s[i+1] != '\\' {
				return "", false
			}
			if b == nil {
				b = new(strings.Builder)
				b.WriteString(s[:i])
			}
			i++
			b.WriteByte(s[i])
		case c < 0x20 || c > 0x7e:
			return "", false
		default:
			if b != nil {
				b.WriteByte(c)
			}
		}
	}
	return "", false // unterminated
}

// token parses a Token: ALPHA or '*', then tchar, ':' and '/'.
func (p *sfParser) token() {
	i := 1
	for i < len(p.s) && (tchar(p.s[i]) || p.s[i] == ':' || p.s[i] == '/') {
		i++
	}
	p.s = p.s[i:]
}

func tchar(c byte) bool {
	if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// bytes parses a Byte Sequence: base64 between colons.
func (p *sfParser) bytes() bool {
	for i := 1; i < len(p.s); i++ {
		c := p.s[i]
		switch {
		case c == ':':
			p.s = p.s[i+1:]
			return true
		case c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '/' || c == '=':
		default:
			return false
		}
	}
	return false
}
