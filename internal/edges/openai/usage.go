package openai

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
)

// Usage reads what an answer spent as its body passes: the top-level
// usage of a JSON answer, whatever the writes cut it into, or the last
// server-sent event of a stream that carries one (see Format). Its zero
// value is not usable: Format.NewUsage makes one.
type Usage struct {
	f     *Format
	sse   bool
	ans   answerScan // a JSON answer's top level
	tail  []byte     // an event stream's partial line
	long  bool       // the partial line outgrew maxEventLine: skip to its end
	cost  int64
	found bool
}

// NewUsage returns a reader of one answer's usage.
func (t *Format) NewUsage() *Usage { return &Usage{f: t} }

// Start takes in the answer's header, when its status is written: a
// text/event-stream is read as a stream.
func (w *Usage) Start(h http.Header) {
	w.sse = strings.HasPrefix(h.Get("Content-Type"), "text/event-stream")
}

// Stream reports whether the answer is an event stream.
func (w *Usage) Stream() bool { return w.sse }

// Spent is the weighted cost of the usage read, and whether one was.
func (w *Usage) Spent() (int64, bool) { return w.cost, w.found }

// usage is the usage object of an answer, in the names of Chat Completions
// and of Responses; -1 is a count absent.
type usage struct {
	prompt, completion, input, output, total int64
}

// parseUsage reads the usage object v with s: its members spelled as
// OpenAI spells them, whole numbers. false when v is no such object.
func parseUsage(s *strictJSON, v []byte) (usage, bool) {
	u := usage{-1, -1, -1, -1, -1}
	if len(v) == 0 || v[0] != '{' || s.scan(v) != nil {
		return u, false
	}
	for _, m := range s.top {
		var p *int64
		switch string(m.key) {
		case "prompt_tokens":
			p = &u.prompt
		case "completion_tokens":
			p = &u.completion
		case "input_tokens":
			p = &u.input
		case "output_tokens":
			p = &u.output
		case "total_tokens":
			p = &u.total
		default:
			continue
		}
		n, ok := wholeNumber(v[m.vs:m.ve])
		if !ok {
			return u, false
		}
		*p = n
	}
	return u, true
}

// cost is the weighted cost of u, and whether u said anything: its input
// and output weighed, and never less than its total times the smaller
// weight (an API may leave tokens, such as reasoning's, out of the
// output it reports but not out of the total).
func (t *Format) cost(u usage) (int64, bool) {
	in, out := u.prompt, u.completion
	if in < 0 {
		in = u.input
	}
	if out < 0 {
		out = u.output
	}
	var c int64
	switch {
	case in >= 0 || out >= 0:
		if in >= 0 {
			c = satMul(in, t.wIn)
		}
		if out >= 0 {
			c = satAdd(c, satMul(out, t.wOut))
		}
		if u.total >= 0 {
			c = max(c, satMul(u.total, min(t.wIn, t.wOut)))
		}
	case u.total >= 0:
		c = satMul(u.total, max(t.wIn, t.wOut))
	default:
		return 0, false
	}
	return c, true
}

// satMul is a·b, at most MaxCost (a, b >= 0).
func satMul(a, b int64) int64 {
	if a != 0 && b > sluice.MaxCost/a {
		return sluice.MaxCost
	}
	return a * b
}

// maxUsage bounds the bytes of a JSON answer's usage object kept to read.
const maxUsage = 64 << 10

// maxEventLine bounds a server-sent event line kept whole to parse.
const maxEventLine = 1 << 20

// Read takes in b, the next bytes of the body.
func (w *Usage) Read(b []byte) {
	if !w.sse {
		w.ans.feed(b, w.top)
		return
	}
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			if !w.long {
				w.tail = append(w.tail, b...)
				if len(w.tail) > maxEventLine {
					w.tail, w.long = w.tail[:0], true
				}
			}
			return
		}
		if !w.long {
			line := b[:i]
			if len(w.tail) > 0 {
				w.tail = append(w.tail, line...)
				line = w.tail
			}
			w.event(line)
		}
		w.tail, w.long = w.tail[:0], false
		b = b[i+1:]
	}
}

// top takes in v, the value of a JSON answer's top-level usage: with
// several, the costliest counts.
func (w *Usage) top(v []byte) {
	s := jsonScanners.Get().(*strictJSON)
	defer s.release()
	if u, ok := parseUsage(s, v); ok {
		if c, ok := w.f.cost(u); ok && (!w.found || c > w.cost) {
			w.cost, w.found = c, true
		}
	}
}

// terminalEvents are the types of the Responses API's events whose
// response holds the usage.
var terminalEvents = []string{"response.completed", "response.incomplete", "response.failed"}

// event reads one line of an event stream: a data line whose JSON carries
// a usage at its top level (Chat Completions' last chunk), or a Responses
// API's terminal event, replaces what an earlier one said.
func (w *Usage) event(line []byte) {
	line = bytes.TrimSuffix(line, []byte{'\r'})
	data, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok || !bytes.Contains(data, []byte(`"usage"`)) {
		return
	}
	data = bytes.TrimSpace(data)
	s := jsonScanners.Get().(*strictJSON)
	defer s.release()
	if s.scan(data) != nil {
		return
	}
	var u, typ, resp []byte
	for _, m := range s.top {
		switch string(m.key) {
		case "usage":
			u = data[m.vs:m.ve]
		case "type":
			typ = data[m.vs:m.ve]
		case "response":
			resp = data[m.vs:m.ve]
		}
	}
	if u == nil && resp != nil && resp[0] == '{' && stringIn(typ, terminalEvents) {
		eachMember(resp, func(k, v []byte) bool {
			if string(k) == "usage" {
				u = v
			}
			return u == nil
		})
	}
	if uu, ok := parseUsage(s, u); ok {
		if c, ok := w.f.cost(uu); ok {
			w.cost, w.found = c, true
		}
	}
}

// answerScan finds the members named usage of a JSON answer's top-level
// object as its bytes pass, whatever the writes cut them into: a usage
// nested deeper, or in a string, is not one.
type answerScan struct {
	depth                    int
	dead                     bool // not an object, or past its end
	inStr, esc               bool
	wantKey, inKey, afterKey bool
	key                      [8]byte // the top-level key read, up to 8 bytes
	keyLen                   int
	keyEsc                   bool
	capture, tooLong         bool
	val                      []byte // the value of a top-level usage, so far
}

// feed takes in the next bytes b of the answer, calling done with the
// value of each top-level usage it completes.
func (a *answerScan) feed(b []byte, done func(v []byte)) {
	start := -1 // where the capture of b begins
	if a.capture {
		start = 0
	}
	for i := 0; i < len(b) && !a.dead; i++ {
		if a.inStr {
			i = a.inString(b, i)
			continue
		}
		start = a.outside(b, i, start, done)
	}
	if a.capture && start >= 0 {
		a.grab(b[start:])
	}
}

// inString takes in b[i], in a string, and returns the offset of the
// last byte taken: a run of plain bytes is taken at once.
func (a *answerScan) inString(b []byte, i int) int {
	switch c := b[i]; {
	case a.esc:
		a.esc = false
	case c == '\\':
		a.esc, a.keyEsc = true, a.keyEsc || a.inKey
	case c == '"':
		a.inStr = false
		if a.inKey {
			a.inKey, a.afterKey = false, true
		}
	case a.inKey:
		if a.keyLen < len(a.key) {
			a.key[a.keyLen] = c
		}
		a.keyLen++
	default: // to the next quote or backslash
		for i+1 < len(b) && b[i+1] != '"' && b[i+1] != '\\' {
			i++
		}
	}
	return i
}

// outside takes in b[i], outside strings; start is where the capture of
// b begins (-1: none), and it returns it as b[i] leaves it.
func (a *answerScan) outside(b []byte, i, start int, done func(v []byte)) int {
	switch c := b[i]; c {
	case '"':
		a.inStr = true
		if a.depth == 1 && a.wantKey {
			a.inKey, a.wantKey, a.keyLen, a.keyEsc = true, false, 0, false
		}
	case '{', '[':
		if a.depth == 0 && c == '[' {
			a.dead = true
		}
		a.depth++
		a.wantKey = a.depth == 1
	case '}', ']':
		a.depth--
		if a.depth == 0 {
			a.end(b, start, i, done)
			a.dead = true
		}
	case ',':
		if a.depth == 1 {
			a.end(b, start, i, done)
			start, a.wantKey = -1, true
		}
	case ':':
		if a.depth == 1 && a.afterKey {
			a.afterKey = false
			if !a.keyEsc && a.keyLen == 5 && string(a.key[:5]) == "usage" {
				a.capture, a.tooLong, a.val = true, false, a.val[:0]
				start = i + 1
			}
		}
	case ' ', '\t', '\r', '\n':
	default:
		if a.depth == 0 {
			a.dead = true
		}
	}
	return start
}

// end ends, at b[i], the capture of a top-level value, if any.
func (a *answerScan) end(b []byte, start, i int, done func(v []byte)) {
	if !a.capture {
		return
	}
	if start >= 0 {
		a.grab(b[start:i])
	}
	a.capture = false
	if !a.tooLong {
		done(bytes.TrimSpace(a.val))
	}
}

func (a *answerScan) grab(p []byte) {
	if len(a.val)+len(p) > maxUsage {
		a.tooLong = true
		return
	}
	a.val = append(a.val, p...)
}

// SetHeaders sets OpenAI's rate limit headers on h from o: the
// requests' (the deciding limit of every descriptor but the token one)
// and the tokens' (the token descriptor's). tok indexes the token
// descriptor in o.
func SetHeaders(h http.Header, o *decide.Outcome, tok int) {
	if tok < len(o.Descriptors) && o.Descriptors[tok].Limited {
		d := &o.Descriptors[tok].Decision
		setOpenAI(h, true, d.Limit, d.Remaining, d.ResetAfter)
	}
	best := -1
	for i := range o.Limits {
		l := &o.Limits[i]
		if l.Descriptor == tok || l.Limit.Shadow {
			continue
		}
		if best < 0 || l.Decision.Remaining < o.Limits[best].Decision.Remaining {
			best = i
		}
	}
	if best >= 0 {
		d := &o.Limits[best].Decision
		setOpenAI(h, false, d.Limit, d.Remaining, d.ResetAfter)
	}
}

// setOpenAI sets x-ratelimit-limit-, -remaining- and -reset-tokens (or
// -requests) on h; the reset is a duration, as OpenAI writes it ("1s",
// "6m0s", "20ms"), rounded up.
func setOpenAI(h http.Header, tokens bool, limit, remaining int64, reset time.Duration) {
	names := &openAINames[0]
	if tokens {
		names = &openAINames[1]
	}
	switch {
	case reset >= sluice.Never:
		reset = 0
	case reset >= time.Second:
		reset = (reset + time.Second - 1) / time.Second * time.Second
	case reset > 0:
		reset = (reset + time.Millisecond - 1) / time.Millisecond * time.Millisecond
	}
	vals := []string{strconv.FormatInt(limit, 10), strconv.FormatInt(max(remaining, 0), 10), reset.String()}
	h[names[0]], h[names[1]], h[names[2]] = vals[0:1:1], vals[1:2:2], vals[2:3:3]
}

// openAINames are the canonical names of OpenAI's rate limit headers, of
// the requests, then of the tokens.
var openAINames = [2][3]string{
	{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests"},
	{"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens"},
}
