package httplimit

import (
	"bytes"
	"context"
	"encoding/json"
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

	// Enforce writes the output reserved into the forwarded JSON body
	// (into every output field present that asks for more, or, when none
	// is, the first of Fields), so that the API generates no more; and for
	// a chat or legacy completion's stream ("stream": true) sets
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

func (m *middleware) newTokens(cfg *Tokens, d Decider) (*tokens, error) {
	if _, ok := d.(settler); !ok {
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
// and of Responses.
type usage struct {
	Prompt     *int64 `json:"prompt_tokens"`
	Completion *int64 `json:"completion_tokens"`
	Input      *int64 `json:"input_tokens"`
	Output     *int64 `json:"output_tokens"`
	Total      *int64 `json:"total_tokens"`
}

// cost is the weighted cost of u, and whether u said anything.
func (t *tokens) cost(u *usage) (int64, bool) {
	in, out := u.Prompt, u.Completion
	if in == nil {
		in = u.Input
	}
	if out == nil {
		out = u.Output
	}
	switch {
	case in != nil || out != nil:
		var c int64
		if in != nil {
			c = satMul(max(*in, 0), t.wIn)
		}
		if out != nil {
			c = min(c+satMul(max(*out, 0), t.wOut), sluice.MaxCost)
		}
		return c, true
	case u.Total != nil:
		return satMul(max(*u.Total, 0), max(t.wIn, t.wOut)), true
	}
	return 0, false
}

func satMul(a, b int64) int64 {
	if a != 0 && b > sluice.MaxCost/a {
		return sluice.MaxCost
	}
	return a * b
}

// usageTail is how much of a JSON answer's end is kept to find its usage.
const usageTail = 64 << 10

// maxEventLine bounds a server-sent event line kept whole to parse.
const maxEventLine = 1 << 20

// tokenWriter passes the response through and reads its usage on the way.
type tokenWriter struct {
	http.ResponseWriter
	t      *tokens
	status int
	sse    bool
	tail   []byte // a JSON answer's last bytes; an event stream's partial line
	long   bool   // the partial line outgrew maxEventLine: skip to its end
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
		w.tail = append(w.tail, b...)
		if len(w.tail) > 2*usageTail {
			w.tail = append(w.tail[:0], w.tail[len(w.tail)-usageTail:]...)
		}
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

// event reads one line of an event stream: a data line whose JSON carries
// a usage replaces what an earlier one said.
func (w *tokenWriter) event(line []byte) {
	line = bytes.TrimSuffix(line, []byte{'\r'})
	data, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok || !bytes.Contains(data, []byte(`"usage"`)) {
		return
	}
	var ev struct {
		Usage    *usage `json:"usage"`
		Response *struct {
			Usage *usage `json:"usage"`
		} `json:"response"` // the Responses API's response.completed event
	}
	if json.Unmarshal(bytes.TrimSpace(data), &ev) != nil {
		return
	}
	u := ev.Usage
	if u == nil && ev.Response != nil {
		u = ev.Response.Usage
	}
	if u != nil {
		if c, ok := w.t.cost(u); ok {
			w.cost, w.found = c, true
		}
	}
}

// finish reads a JSON answer's usage from its tail.
func (w *tokenWriter) finish() {
	if w.sse || w.found || len(w.tail) == 0 {
		return
	}
	i := bytes.LastIndex(w.tail, []byte(`"usage"`))
	if i < 0 {
		return
	}
	rest := bytes.TrimLeft(w.tail[i+len(`"usage"`):], " \t\r\n")
	rest, ok := bytes.CutPrefix(rest, []byte{':'})
	if !ok {
		return
	}
	var u usage
	if json.NewDecoder(bytes.NewReader(rest)).Decode(&u) != nil {
		return
	}
	if c, ok := w.t.cost(&u); ok {
		w.cost, w.found = c, true
	}
}

// spent is what the request cost, once the handler returned: the usage
// found, nothing for an error status (not a stream), else the whole
// reservation.
func (w *tokenWriter) spent(reserved int64) int64 {
	w.finish()
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

// serveTokens serves an admitted request with a token reservation and
// settles it when the handler returns, whatever became of the response.
func (m *middleware) serveTokens(w http.ResponseWriter, r *http.Request, s *scratch, next http.Handler, reserved int64) {
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
