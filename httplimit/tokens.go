package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/edges/openai"
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

// tokens is a validated Tokens: its descriptor, and its wire format
// (internal/edges/openai) behind tokenCost and usageReader.
type tokens struct {
	desc        []entry
	set         [][]entry // desc alone, for fill
	cost        tokenCost
	usage       func() usageReader
	usageHeader string
}

// tokenCost is what a request reserves: openai.Format.Reserve.
type tokenCost interface {
	// Reserve reads r (its body put back, maybe rewritten) for its
	// reservation. An error is openai.Invalid (400), ErrBodyTooLarge (413),
	// ErrEncodedBody (415), or the body's reading failing.
	Reserve(r *http.Request) (int64, error)
}

// usageReader reads what an answer spent as it passes: openai.Usage.
type usageReader interface {
	Start(h http.Header) // the answer's header, when its status is written
	Read(b []byte)       // the body's next bytes
	Stream() bool        // the answer is an event stream
	Spent() (cost int64, found bool)
}

// settler is the Decider that settles reservations: decide.Decider.
type settler interface {
	Settle(ctx context.Context, o *decide.Outcome, i int, spent int64) error
}

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
	f, err := openai.New(openai.Config{
		Fields: cfg.Fields, Header: cfg.Header, Default: cfg.Default, Max: cfg.Max,
		PromptBytes: cfg.PromptBytes, InputWeight: cfg.InputWeight, OutputWeight: cfg.OutputWeight,
		Enforce: cfg.Enforce, AllowUnbounded: cfg.AllowUnbounded, MaxBody: cfg.MaxBody,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	c, err := compile(len(m.descs), cfg.Descriptor)
	if err != nil {
		return nil, err
	}
	t := &tokens{desc: c, set: [][]entry{c}, cost: f, usageHeader: cfg.UsageHeader,
		usage: func() usageReader { return f.NewUsage() }}
	for _, e := range c {
		m.needIP = m.needIP || e.needsClient()
	}
	m.entries += len(c)
	return t, nil
}

// tokenWriter passes the response through and reads its usage on the way.
type tokenWriter struct {
	http.ResponseWriter
	t      *tokens
	u      usageReader
	status int
	cost   int64 // from UsageHeader
	header bool  // the cost came from UsageHeader
}

func (w *tokenWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
		h := w.Header()
		w.u.Start(h)
		if w.t.usageHeader != "" {
			if v := h.Get(w.t.usageHeader); v != "" {
				if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil && n >= 0 {
					w.cost, w.header = min(n, sluice.MaxCost), true
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
		w.u.Read(b)
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

// spent is what the request cost, once the handler returned, and whether
// the response said: the usage found (UsageHeader's first), nothing for
// an error status (not a stream), else the whole reservation.
func (w *tokenWriter) spent(reserved int64) (int64, bool) {
	if w.header {
		return w.cost, true
	}
	if c, ok := w.u.Spent(); ok {
		return c, true
	}
	if w.status >= 400 && !w.u.Stream() {
		return 0, false
	}
	return reserved, false
}

// tokensRefused answers a request whose body could not be read for its
// reservation.
func (m *middleware) tokensRefused(w http.ResponseWriter, r *http.Request, err error) {
	var inv openai.Invalid
	switch {
	case errors.As(err, &inv):
		m.invalid(w, r, invalidError{string(inv)})
	case errors.Is(err, openai.ErrBodyTooLarge):
		m.report(w, r, Invalid)
		writeProblem(w, &problem{Type: ProblemInvalidRequest, Title: "Request body too large", Status: http.StatusRequestEntityTooLarge, Detail: err.Error()})
	case errors.Is(err, openai.ErrEncodedBody):
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
	reserved, err := m.tokens.cost.Reserve(f.r)
	if err != nil {
		m.tokensRefused(f.w, f.r, err)
		return false
	}
	before := len(s.main.descs)
	k, err := m.fill(&s.main, m.tokens.set, f.r, s, reserved)
	if err != nil {
		m.invalid(f.w, f.r, err)
		return false
	}
	if k == 1 {
		s.tokens, f.n = before, f.n+1
	}
	f.reserved = reserved
	return true
}

// tokenHeaders sets OpenAI's rate limit headers of a request with a token
// descriptor.
func (m *middleware) tokenHeaders(h http.Header, s *scratch, _ bool) {
	if s.tokens >= 0 {
		openai.SetHeaders(h, &s.out, s.tokens)
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
	tw := &tokenWriter{ResponseWriter: w, t: m.tokens, u: m.tokens.usage()}
	defer func() {
		spent, found := tw.spent(reserved)
		if r.Context().Err() != nil && !found {
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
