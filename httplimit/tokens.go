package httplimit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
)

// Tokens is a token budget: limits on a cost known only when the response
// ends, such as the tokens of an LLM API's answer. Each request reserves
// an estimate of its cost at admission, on the limits of Descriptor,
// decided together with Config.Descriptors, all or nothing ("60 requests
// and 100,000 tokens a minute per API key"); a reservation that does not
// fit is denied (429, with the Retry-After of when it would fit). When the
// response ends, the reservation is settled against the real cost read from
// the response (decide.Decider.Settle): what was not spent is refunded, as
// far as the limit still holds it, and what was spent beyond it is charged,
// past the limit if need be, as a debt the next requests see.
//
// The reservation is, in the cost's units, the output reserved times
// OutputWeight times the choices the request asks to be generated, plus,
// with PromptBytes, the request body's size in bytes times InputWeight.
// The output reserved is the first present of Header (a request header)
// and the JSON body's Fields, else Default, and never more than Max; it is
// a choice's, and the choices are the larger of the body's n and best_of
// (1 when absent), times the prompts of a list of prompts (the legacy
// completions' batch). A body's echo adds the prompt's bytes to a choice's
// output, and its prediction its own bytes (rejected predicted tokens are
// billed as output).
//
// The real cost is the response's usage: prompt_tokens·InputWeight +
// completion_tokens·OutputWeight (input_tokens and output_tokens, as the
// Responses API names them, too; total_tokens times the larger weight when
// only it is given), read from the top-level usage of a JSON answer, or
// from the last server-sent event of a stream that carries one at its top
// level (OpenAI sends it with stream_options.include_usage), or in the
// response of a Responses API stream's response.completed,
// response.incomplete or response.failed event; or the integer in the
// response header UsageHeader, when set and present. A response without
// one costs:
//
//   - an error status (400 and above, not a stream): nothing, the
//     reservation is refunded: the API refused or failed the request;
//   - anything else (a 2xx answer without usage, a stream cut off by the
//     client, the API or a timeout): the whole reservation, since what was
//     generated is unknown.
//
// A token budget cannot be combined with Shaping or Failures.
//
// # The bound
//
// In any window, the tokens spent by the requests admitted in it are at
// most the limit plus the under-reservations (cost − reservation, when
// positive) of the requests in flight when its last request was admitted:
// every admission found its reservation room beside the costs settled and
// the reservations held, and only the requests in flight can still cost
// more than they hold. Reservations held by a process that dies are never
// refunded: they cost the window they were taken in at most what they
// reserved.
//
// With Enforce and PromptBytes a request cannot cost more than it
// reserved, so the bound is the limit itself, as long as the API caps each
// choice's output (reasoning included) by the output fields, as OpenAI's
// APIs do. Enforce makes the body one every parser reads alike: a body that
// is not strict JSON (one object, UTF-8, no byte order mark, NaN or
// trailing data; a key repeated in an object, even in another case or
// spelled with escapes) is refused (400), as is a field the budget reads
// spelled in another case, or named in the query. Every output field
// present is capped at the output reserved, and the API is told to
// generate at most that many tokens a choice; a token of text is at least
// a byte of it. An input whose tokens its bytes do not bound is refused
// (400) unless AllowUnbounded: a message part that is not text (an image,
// audio or a file, inline, by URL or by ID), an input item that is not a
// message, a function call or its output, a stored prompt, a previous
// response or conversation, and tools the API runs (web or file search,
// code interpreter, MCP servers: any tool but a function or a custom one).
// With AllowUnbounded these requests may under-reserve.
//
// The reading of the body and of the answer needs them uncompressed: a
// request with a Content-Encoding is refused (415), and the request's
// Accept-Encoding is removed, so that the API answers in plain text.
type Tokens struct {
	// Descriptor is the descriptor whose limits count the tokens, such as
	// [{key: api_key_tokens, api_key: Authorization}]. Required. A request
	// for which it is skipped (see Descriptor) has no token limit.
	Descriptor Descriptor

	// Fields are the JSON body's fields of the output to reserve, the
	// first present taken. Empty means max_completion_tokens, then
	// max_tokens, then max_output_tokens. With Enforce, these three are
	// capped too, whatever Fields says.
	Fields []string

	// Header, when set, is a request header holding the output to reserve,
	// taken before Fields.
	Header string

	// Default is the output reserved when the request names none.
	// Required.
	Default int64

	// Max caps the output reserved. Zero means Default.
	Max int64

	// PromptBytes adds the body's size in bytes to the reservation, a
	// bound of a text prompt's tokens.
	PromptBytes bool

	// InputWeight and OutputWeight weigh the prompt's and the answer's
	// tokens in the cost. Zero means 1.
	InputWeight, OutputWeight int64

	// UsageHeader, when set, is a response header holding the real cost,
	// read before the body's usage.
	UsageHeader string

	// Enforce writes the output reserved into the forwarded JSON body, so
	// that the API generates no more: into every output field present
	// that asks for more, or for 0, or is null; and when none of Fields is
	// present, into the first of them (max_tokens for a legacy
	// completion's prompt, max_output_tokens for a Responses input). An
	// output reserved of 0 is refused (400). For a chat or legacy
	// completion's stream ("stream": true) it sets
	// stream_options.include_usage, so that its last event says what it
	// spent. It refuses (400) a request whose body is not one strict JSON
	// object (a body is required but for GET and HEAD), and one whose cost
	// the reservation cannot bound (see The bound); the body is forwarded
	// as application/json.
	Enforce bool

	// AllowUnbounded, with Enforce, admits the requests whose inputs'
	// tokens the reservation cannot bound (images, audio, files, stored
	// prompts and responses, tools the API runs), which Enforce otherwise
	// refuses. Such a request may cost more than it reserved.
	AllowUnbounded bool

	// MaxBody bounds the request body read, in bytes; a longer body is
	// refused (413). Zero means 8 MiB.
	MaxBody int64
}

// tokens is a validated Tokens.
type tokens struct {
	desc           []entry
	set            [][]entry // desc alone, for fill
	fields         []string
	header         string
	def, max       int64
	promptBytes    bool
	wIn, wOut      int64
	usageHeader    string
	enforce        bool
	allowUnbounded bool
	maxBody        int64
	outFields      []string              // fields, then the defaultFields they do not name
	known          map[string]knownField // the body's fields read, by folded name
}

// settler is the Decider that settles reservations: decide.Decider.
type settler interface {
	Settle(ctx context.Context, o *decide.Outcome, i int, spent int64) error
}

// defaultFields are the JSON fields of the output reserved, in OpenAI's
// Chat Completions (the current name, then the former) and Responses APIs.
var defaultFields = []string{"max_completion_tokens", "max_tokens", "max_output_tokens"}

// defaultMaxBody is Tokens.MaxBody's default.
const defaultMaxBody = 8 << 20

// settleTimeout bounds a settlement's call; a store failure is retried by
// the Decider in the background.
const settleTimeout = 5 * time.Second

func (m *middleware) newTokens(cfg *Tokens, st settler) (*tokens, error) {
	if st == nil {
		return nil, fmt.Errorf("%w: Tokens needs a Decider that settles reservations (a *decide.Decider)", ErrConfig)
	}
	if len(cfg.Descriptor) == 0 {
		return nil, fmt.Errorf("%w: Tokens needs a descriptor", ErrConfig)
	}
	switch {
	case cfg.Default <= 0 || cfg.Default > sluice.MaxCost:
		return nil, fmt.Errorf("%w: Tokens.Default must be between 1 and %d, got %d", ErrConfig, int64(sluice.MaxCost), cfg.Default)
	case cfg.Max < 0 || cfg.Max > sluice.MaxCost:
		return nil, fmt.Errorf("%w: Tokens.Max must be between 0 and %d, got %d", ErrConfig, int64(sluice.MaxCost), cfg.Max)
	case cfg.Max != 0 && cfg.Max < cfg.Default:
		return nil, fmt.Errorf("%w: Tokens.Max %d is below Default %d", ErrConfig, cfg.Max, cfg.Default)
	case cfg.InputWeight < 0 || cfg.OutputWeight < 0 || cfg.InputWeight > 1<<20 || cfg.OutputWeight > 1<<20:
		return nil, fmt.Errorf("%w: Tokens weights must be between 0 (meaning 1) and %d", ErrConfig, 1<<20)
	case cfg.MaxBody < 0:
		return nil, fmt.Errorf("%w: Tokens.MaxBody must not be negative", ErrConfig)
	case cfg.AllowUnbounded && !cfg.Enforce:
		return nil, fmt.Errorf("%w: Tokens.AllowUnbounded needs Enforce (without it nothing is refused)", ErrConfig)
	case len(cfg.Fields) > 16:
		return nil, fmt.Errorf("%w: Tokens has %d fields (at most 16)", ErrConfig, len(cfg.Fields))
	}
	for _, f := range cfg.Fields {
		if f == "" || len(f) > 128 {
			return nil, fmt.Errorf("%w: Tokens field names must be 1 to 128 bytes", ErrConfig)
		}
	}
	c, err := compile(len(m.descs), cfg.Descriptor)
	if err != nil {
		return nil, err
	}
	t := &tokens{
		desc: c, header: cfg.Header, def: cfg.Default, max: cfg.Max,
		promptBytes: cfg.PromptBytes, wIn: max(cfg.InputWeight, 1), wOut: max(cfg.OutputWeight, 1),
		usageHeader: cfg.UsageHeader, enforce: cfg.Enforce, allowUnbounded: cfg.AllowUnbounded, maxBody: cfg.MaxBody,
		fields: append([]string(nil), cfg.Fields...),
	}
	t.set = [][]entry{c}
	if t.max == 0 {
		t.max = t.def
	}
	if len(t.fields) == 0 {
		t.fields = defaultFields
	}
	if t.maxBody == 0 {
		t.maxBody = defaultMaxBody
	}
	t.outFields = append([]string(nil), t.fields...)
	for _, d := range defaultFields {
		if !slices.ContainsFunc(t.fields, func(f string) bool { return strings.EqualFold(f, d) }) {
			t.outFields = append(t.outFields, d)
		}
	}
	t.known = knownFields(t.outFields)
	for _, e := range c {
		m.needIP = m.needIP || e.needsClient()
	}
	m.entries += len(c)
	return t, nil
}

// tokenRequest is what reserve found in a request.
type tokenRequest struct {
	reserved int64 // the whole reservation
	stream   bool
}

var (
	errEncodedBody  = errors.New("a compressed request body cannot be read for its token reservation")
	errBodyTooLarge = errors.New("request body too large for its token reservation")
)

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
func (t *tokens) cost(u usage) (int64, bool) {
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

// tokenWriter passes the response through and reads its usage on the way.
type tokenWriter struct {
	http.ResponseWriter
	t      *tokens
	status int
	sse    bool
	ans    answerScan // a JSON answer's top level
	tail   []byte     // an event stream's partial line
	long   bool       // the partial line outgrew maxEventLine: skip to its end
	cost   int64
	found  bool
	header bool // the cost came from UsageHeader
}

func (w *tokenWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
		h := w.Header()
		w.sse = strings.HasPrefix(h.Get("Content-Type"), "text/event-stream")
		if w.t.usageHeader != "" {
			if v := h.Get(w.t.usageHeader); v != "" {
				if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil && n >= 0 {
					w.cost, w.found, w.header = min(n, sluice.MaxCost), true, true
				}
			}
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *tokenWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if len(b) > 0 && !w.header && w.Header().Get("Content-Encoding") == "" {
		w.read(b)
	}
	return w.ResponseWriter.Write(b)
}

// Flush passes a flush on: streams need it. See FlushError.
func (w *tokenWriter) Flush() { _ = w.FlushError() }

// FlushError passes a flush on to the writer underneath through
// http.ResponseController, which finds a Flush of any writer below
// through their Unwrap: the writer right below may have none of its own
// (sluice proxy's only unwraps). A flush before any write sends the
// header, 200, as the server's own does.
func (w *tokenWriter) FlushError() error {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the writer underneath (for
// Hijack, deadlines and full duplex).
func (w *tokenWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// read takes in b, the next bytes of the body.
func (w *tokenWriter) read(b []byte) {
	if !w.sse {
		w.ans.feed(b, w.usage)
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

// usage takes in v, the value of a JSON answer's top-level usage: with
// several, the costliest counts.
func (w *tokenWriter) usage(v []byte) {
	s := jsonScanners.Get().(*strictJSON)
	defer s.release()
	if u, ok := parseUsage(s, v); ok {
		if c, ok := w.t.cost(u); ok && (!w.found || c > w.cost) {
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
func (w *tokenWriter) event(line []byte) {
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
		if c, ok := w.t.cost(uu); ok {
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
		c := b[i]
		if a.inStr {
			switch {
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
			continue
		}
		switch c {
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
	}
	if a.capture && start >= 0 {
		a.grab(b[start:])
	}
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

// spent is what the request cost, once the handler returned: the usage
// found, nothing for an error status (not a stream), else the whole
// reservation.
func (w *tokenWriter) spent(reserved int64) int64 {
	switch {
	case w.found:
		return w.cost
	case w.status >= 400 && !w.sse:
		return 0
	}
	return reserved
}

// tokensRefused answers a request whose body could not be read for its
// reservation.
func (m *middleware) tokensRefused(w http.ResponseWriter, r *http.Request, err error) {
	var inv invalidError
	switch {
	case errors.As(err, &inv):
		m.invalid(w, r, err)
	case errors.Is(err, errBodyTooLarge):
		m.report(w, r, Invalid)
		writeProblem(w, &problem{Type: ProblemInvalidRequest, Title: "Request body too large", Status: http.StatusRequestEntityTooLarge, Detail: err.Error()})
	case errors.Is(err, errEncodedBody):
		m.report(w, r, Invalid)
		writeProblem(w, &problem{Type: ProblemInvalidRequest, Title: "Unsupported content encoding", Status: http.StatusUnsupportedMediaType, Detail: err.Error()})
	default:
		m.decisionFailed(w, r, err)
	}
}

// prepareTokens reads f's request for its token reservation, and adds
// the token descriptor, of that cost, to the request's.
func (m *middleware) prepareTokens(f *flow) bool {
	s := f.s
	tr, err := m.tokens.reserve(f.r)
	if err != nil {
		m.tokensRefused(f.w, f.r, err)
		return false
	}
	before := len(s.main.descs)
	k, err := m.fill(&s.main, m.tokens.set, f.r, s, tr.reserved)
	if err != nil {
		m.invalid(f.w, f.r, err)
		return false
	}
	if k == 1 {
		s.tokens, f.n = before, f.n+1
	}
	f.reserved = tr.reserved
	return true
}

// tokenHeaders sets OpenAI's rate limit headers of a request with a token
// descriptor.
func (m *middleware) tokenHeaders(h http.Header, s *scratch, _ bool) {
	if s.tokens >= 0 {
		setTokenHeaders(h, &s.out, s.tokens)
	}
}

// serveTokens serves an admitted request with a token reservation and
// settles it when the handler returns, whatever became of the response.
func (m *middleware) serveTokens(f *flow, next http.Handler) {
	w, r, s, reserved := f.w, f.r, f.s, f.reserved
	if s.tokens < 0 {
		next.ServeHTTP(w, r)
		return
	}
	tw := &tokenWriter{ResponseWriter: w, t: m.tokens}
	defer func() {
		spent := tw.spent(reserved)
		if r.Context().Err() != nil && !tw.found {
			spent = reserved // cut off: what was generated is unknown
		}
		if m.onSettle != nil {
			m.onSettle(w, r, reserved, spent)
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), settleTimeout)
		defer cancel()
		if err := m.settle.Settle(ctx, &s.out, s.tokens, spent); err != nil {
			if n, ok := m.errLog.Allow(time.Now()); ok {
				m.log.Warn("token reservation not settled", "domain", m.domain, "err", err, "not_logged", n)
			}
		}
	}()
	next.ServeHTTP(tw, r)
}

// setTokenHeaders sets OpenAI's rate limit headers on h from o: the
// requests' (the deciding limit of every descriptor but the token one)
// and the tokens' (the token descriptor's). tok indexes the token
// descriptor in o.
func setTokenHeaders(h http.Header, o *decide.Outcome, tok int) {
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
