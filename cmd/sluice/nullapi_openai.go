package main

// sluice nullapi --openai: a stand-in for an OpenAI-compatible chat
// completions API, to put behind sluice proxy when measuring or testing
// token budgets. Its token counts are a stated function of the request, so
// that a test knows what each answer spends.

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// openAIFlags are the flags of sluice nullapi's OpenAI mode.
type openAIFlags struct {
	on         bool
	completion int64
	delay      time.Duration
	logAnswers bool
	lenient    bool
	nested     bool
}

// add defines the flags on fs.
func (o *openAIFlags) add(fs *flag.FlagSet) {
	fs.BoolVar(&o.on, "openai", false, "answer POST /v1/chat/completions as an OpenAI-compatible API")
	fs.Int64Var(&o.completion, "completion-tokens", 200, "with --openai: the completion `tokens` of a choice, unless the request caps them lower")
	fs.DurationVar(&o.delay, "delay", 0, "with --openai: the `time` an answer takes, spread over a stream's chunks")
	fs.BoolVar(&o.logAnswers, "log-answers", false, "with --openai: print a JSON line per answer on stderr (its arrival, end, X-Request-Id and usage)")
	fs.BoolVar(&o.lenient, "lenient", false, "with --openai: read requests as a lenient parser does (a byte order mark, UTF-16, NaN and Infinity, the first of keys repeated in any case), and cap a choice by the larger of max_completion_tokens and max_tokens")
	fs.BoolVar(&o.nested, "nested-usage", false, "with --openai: follow an answer's usage with a member that nests a usage of zero tokens, as some providers' extensions do")
}

// check reports a flag out of range, or one that needs --openai.
func (o *openAIFlags) check(fs *flag.FlagSet) error {
	if !o.on {
		var bad []string
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "completion-tokens", "delay", "log-answers", "lenient", "nested-usage":
				bad = append(bad, "--"+f.Name)
			}
		})
		if len(bad) > 0 {
			return fmt.Errorf("%s: only with --openai", strings.Join(bad, ", "))
		}
		return nil
	}
	if o.completion < 1 {
		return fmt.Errorf("--completion-tokens %d: want at least 1", o.completion)
	}
	if o.delay < 0 {
		return fmt.Errorf("--delay %s: want 0 or more", o.delay)
	}
	return nil
}

// openAIAPI answers POST /v1/chat/completions as an OpenAI-compatible
// server does, with deterministic usage:
//
//   - prompt_tokens is, over the messages, 3 per message plus the bytes of
//     its text (the content string, or the text of its parts; a part that
//     is not text counts its JSON) divided by 4, rounded up;
//   - completion_tokens is, per choice, the smallest of completion and the
//     request's max_completion_tokens and max_tokens (lenient: the larger
//     of the two), times n (1 when absent).
//
// POST /v1/completions (the legacy completions) answers a text_completion:
// prompt_tokens is, per prompt (a string, or a list of strings or of lists
// of token ids), the bytes of a string divided by 4, rounded up, or the
// number of token ids; completion_tokens is, per choice, the smaller of
// completion and max_tokens, times the prompts and the larger of n and
// best_of (the candidates generated).
//
// Other paths under /v1/ are 404 with an OpenAI error body; the rest is
// next's.
type openAIAPI struct {
	completion int64         // completion tokens of a choice when the request caps none lower
	delay      time.Duration // how long an answer takes
	log        io.Writer     // where answers are recorded, a JSON line each; nil: nowhere
	lenient    bool          // read requests as a lenient parser does (lenientJSON)
	nested     bool          // follow the usage with a member nesting a usage of zero
	next       http.Handler

	now  func() time.Time
	seq  atomic.Int64
	logm sync.Mutex
}

// maxChatBody bounds the body of a request.
const maxChatBody = 16 << 20

// chatRequest is what the stand-in reads of a request.
type chatRequest struct {
	Model               string         `json:"model"`
	Messages            []chatMessage  `json:"messages"`
	MaxCompletionTokens *int64         `json:"max_completion_tokens"`
	MaxTokens           *int64         `json:"max_tokens"`
	N                   *int64         `json:"n"`
	Stream              bool           `json:"stream"`
	StreamOptions       *streamOptions `json:"stream_options"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// chatUsage is the usage object of an answer.
type chatUsage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

// answerRecord is the line --log-answers prints per answer.
type answerRecord struct {
	ID                  string    `json:"id"`
	RequestID           string    `json:"request_id,omitempty"`
	Arrived             time.Time `json:"arrived"`
	Ended               time.Time `json:"ended"`
	Stream              bool      `json:"stream"`
	IncludeUsage        bool      `json:"include_usage"`
	MaxCompletionTokens *int64    `json:"max_completion_tokens,omitempty"`
	MaxTokens           *int64    `json:"max_tokens,omitempty"`
	Choices             int64     `json:"choices"` // generated: n (and best_of) times the prompts
	BodyBytes           int       `json:"body_bytes"`
	chatUsage
	Complete bool `json:"complete"` // false: the client left before the end
}

func (a *openAIAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/v1/chat/completions" && r.Method == http.MethodPost:
		a.chat(w, r)
	case r.URL.Path == "/v1/completions" && r.Method == http.MethodPost:
		a.legacy(w, r)
	case r.URL.Path == "/v1/chat/completions" || r.URL.Path == "/v1/completions":
		w.Header().Set("Allow", http.MethodPost)
		openAIError(w, http.StatusMethodNotAllowed, "invalid_request_error", "", "method "+r.Method+" not allowed")
	case strings.HasPrefix(r.URL.Path, "/v1/"):
		openAIError(w, http.StatusNotFound, "invalid_request_error", "", "unknown URL "+r.URL.Path+" (this stand-in answers POST /v1/chat/completions and /v1/completions only)")
	default:
		a.next.ServeHTTP(w, r)
	}
}

// openAIError answers an error in OpenAI's shape.
func openAIError(w http.ResponseWriter, code int, typ, param, msg string) {
	var p any
	if param != "" {
		p = param
	}
	body, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": p, "code": nil}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(body, '\n'))
}

func (a *openAIAPI) chat(w http.ResponseWriter, r *http.Request) {
	rec := answerRecord{Arrived: a.now(), RequestID: r.Header.Get("X-Request-Id")}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxChatBody))
	if err != nil {
		openAIError(w, http.StatusBadRequest, "invalid_request_error", "", "reading the body: "+err.Error())
		return
	}
	var req chatRequest
	if err := a.unmarshal(body, &req); err != nil {
		openAIError(w, http.StatusBadRequest, "invalid_request_error", "", "the body is not a chat completion request: "+err.Error())
		return
	}
	prompt, param, msg := promptTokens(req.Messages)
	switch {
	case msg != "":
	case req.Model == "":
		param, msg = "model", "you must provide a model parameter"
	case req.MaxCompletionTokens != nil && *req.MaxCompletionTokens < 1:
		param, msg = "max_completion_tokens", "max_completion_tokens must be at least 1"
	case req.MaxTokens != nil && *req.MaxTokens < 1:
		param, msg = "max_tokens", "max_tokens must be at least 1"
	case req.N != nil && (*req.N < 1 || *req.N > 128):
		param, msg = "n", "n must be from 1 to 128"
	case req.StreamOptions != nil && !req.Stream:
		param, msg = "stream_options", "stream_options is allowed only when stream is true"
	}
	if msg != "" {
		openAIError(w, http.StatusBadRequest, "invalid_request_error", param, msg)
		return
	}
	perChoice, finish := a.cap(req.MaxCompletionTokens, req.MaxTokens)
	n := int64(1)
	if req.N != nil {
		n = *req.N
	}
	rec.Choices = n
	rec.chatUsage = chatUsage{PromptTokens: prompt, CompletionTokens: perChoice * n}
	rec.TotalTokens = rec.PromptTokens + rec.CompletionTokens
	rec.ID = "chatcmpl-" + strconv.FormatInt(a.seq.Add(1), 10)
	rec.Stream, rec.MaxCompletionTokens, rec.MaxTokens, rec.BodyBytes = req.Stream, req.MaxCompletionTokens, req.MaxTokens, len(body)
	rec.IncludeUsage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	if req.Stream {
		rec.Complete = a.stream(w, r, &req, &rec, perChoice, n, finish)
	} else {
		rec.Complete = a.answer(w, r, &req, &rec, perChoice, n, finish)
	}
	rec.Ended = a.now()
	a.record(&rec)
}

// unmarshal reads a request's body into v: strictly, or as a lenient
// parser does.
func (a *openAIAPI) unmarshal(body []byte, v any) error {
	if a.lenient {
		b, err := lenientJSON(body)
		if err != nil {
			return err
		}
		body = b
	}
	return json.Unmarshal(body, v)
}

// cap is the completion tokens of a choice, and its finish reason, under
// the caps a request sets: the smallest of them (lenient: the largest)
// when below a.completion.
func (a *openAIAPI) cap(caps ...*int64) (int64, string) {
	limit := int64(-1)
	for _, c := range caps {
		if c != nil && (limit < 0 || a.lenient && *c > limit || !a.lenient && *c < limit) {
			limit = *c
		}
	}
	if limit >= 0 && limit < a.completion {
		return limit, "length"
	}
	return a.completion, "stop"
}

// promptTokens counts the prompt of messages, or says what is wrong.
func promptTokens(msgs []chatMessage) (tokens int64, param, msg string) {
	if len(msgs) == 0 {
		return 0, "messages", "messages must not be empty"
	}
	for i, m := range msgs {
		b, err := textBytes(m.Content)
		if err != nil {
			return 0, fmt.Sprintf("messages[%d].content", i), err.Error()
		}
		tokens += 3 + (b+3)/4
	}
	return tokens, "", ""
}

// textBytes is the number of bytes of the text of a message's content: a
// string, null, or an array of parts, each counting its text (or, if it
// has none, its JSON).
func textBytes(content json.RawMessage) (int64, error) {
	s := strings.TrimSpace(string(content))
	switch {
	case s == "" || s == "null":
		return 0, nil
	case s[0] == '"':
		var text string
		if err := json.Unmarshal(content, &text); err != nil {
			return 0, err
		}
		return int64(len(text)), nil
	case s[0] == '[':
		var parts []json.RawMessage
		if err := json.Unmarshal(content, &parts); err != nil {
			return 0, err
		}
		var n int64
		for _, p := range parts {
			var part struct {
				Text *string `json:"text"`
			}
			if json.Unmarshal(p, &part) == nil && part.Text != nil {
				n += int64(len(*part.Text))
			} else {
				n += int64(len(p))
			}
		}
		return n, nil
	}
	return 0, errors.New("content must be a string or an array of parts")
}

// chatWords are the text of answers, a token each.
var chatWords = [...]string{"The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", "."}

// chatText is the answer of tokens tokens.
func chatText(tokens int64) string {
	var b strings.Builder
	for i := range tokens {
		b.WriteString(chatWords[i%int64(len(chatWords))])
	}
	return b.String()
}

// waitUntil sleeps until t, or returns false when the client has gone.
func waitUntil(r *http.Request, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return r.Context().Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-r.Context().Done():
		return false
	}
}

// answer writes a chat.completion object after the delay.
func (a *openAIAPI) answer(w http.ResponseWriter, r *http.Request, req *chatRequest, rec *answerRecord, perChoice, n int64, finish string) bool {
	if !waitUntil(r, rec.Arrived.Add(a.delay)) {
		return false
	}
	choices := make([]map[string]any, n)
	content := chatText(perChoice)
	for i := range choices {
		choices[i] = map[string]any{
			"index":         i,
			"message":       map[string]any{"role": "assistant", "content": content, "refusal": nil},
			"logprobs":      nil,
			"finish_reason": finish,
		}
	}
	body, _ := json.Marshal(map[string]any{
		"id":                 rec.ID,
		"object":             "chat.completion",
		"created":            rec.Arrived.Unix(),
		"model":              req.Model,
		"choices":            choices,
		"usage":              rec.chatUsage,
		"system_fingerprint": nil,
	})
	return a.write(w, rec, body)
}

// nestedUsage is the member --nested-usage puts after an answer's usage.
const nestedUsage = `"x_provider":{"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}}`

// write sends body, a JSON answer whose last member is its usage (the keys
// of a map are sorted, and "usage" comes after the others).
func (a *openAIAPI) write(w http.ResponseWriter, rec *answerRecord, body []byte) bool {
	if a.nested {
		body = append(append(body[:len(body)-1:len(body)-1], ','), nestedUsage+"}"...)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Request-Id", rec.ID)
	_, err := w.Write(append(body, '\n'))
	return err == nil
}

// chatChunk is a chat.completion.chunk event.
type chatChunk struct {
	ID                string        `json:"id"`
	Object            string        `json:"object"`
	Created           int64         `json:"created"`
	Model             string        `json:"model"`
	SystemFingerprint *string       `json:"system_fingerprint"`
	Choices           []chunkChoice `json:"choices"`
	Usage             *chatUsage    `json:"usage,omitempty"`
	usageNull         bool
}

type chunkChoice struct {
	Index        int64          `json:"index"`
	Delta        map[string]any `json:"delta"`
	Logprobs     *struct{}      `json:"logprobs"`
	FinishReason *string        `json:"finish_reason"`
}

// stream writes a stream of chat.completion.chunk events: a chunk with
// the role for each choice, then a token of content per chunk with the
// delay spread over them, a chunk with the finish reason for each choice,
// when asked a last chunk with the usage and no choices, and [DONE]. With
// include_usage the other chunks carry "usage": null, as OpenAI's do.
func (a *openAIAPI) stream(w http.ResponseWriter, r *http.Request, req *chatRequest, rec *answerRecord, perChoice, n int64, finish string) bool {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Request-Id", rec.ID)
	rc := http.NewResponseController(w)
	c := chatChunk{ID: rec.ID, Object: "chat.completion.chunk", Created: rec.Arrived.Unix(), Model: req.Model, usageNull: rec.IncludeUsage}
	var buf []byte
	send := func(choices []chunkChoice, usage *chatUsage) {
		c.Choices, c.Usage = choices, usage
		buf = append(buf, "data: "...)
		b, _ := json.Marshal(c)
		switch {
		case c.usageNull && usage == nil:
			b = append(b[:len(b)-1], `,"usage":null}`...)
		case usage != nil && a.nested:
			b = append(b[:len(b)-1], ","+nestedUsage+"}"...)
		}
		buf = append(append(buf, b...), "\n\n"...)
	}
	flush := func() bool {
		if _, err := w.Write(buf); err != nil {
			return false
		}
		buf = buf[:0]
		return rc.Flush() == nil
	}
	one := func(i int64, delta map[string]any, fin *string) []chunkChoice {
		return []chunkChoice{{Index: i, Delta: delta, FinishReason: fin}}
	}
	for i := range n {
		send(one(i, map[string]any{"role": "assistant", "content": "", "refusal": nil}, nil), nil)
	}
	if !flush() {
		return false
	}
	total := perChoice * n
	for k := range total {
		send(one(k%n, map[string]any{"content": chatWords[(k/n)%int64(len(chatWords))]}, nil), nil)
		if a.delay > 0 {
			if !flush() || !waitUntil(r, rec.Arrived.Add(a.delay*time.Duration(k+1)/time.Duration(total))) {
				return false
			}
		}
	}
	for i := range n {
		send(one(i, map[string]any{}, &finish), nil)
	}
	if rec.IncludeUsage {
		send([]chunkChoice{}, &rec.chatUsage)
	}
	buf = append(buf, "data: [DONE]\n\n"...)
	return flush()
}

// record prints rec as a JSON line, when answers are recorded.
func (a *openAIAPI) record(rec *answerRecord) {
	if a.log == nil {
		return
	}
	b, _ := json.Marshal(rec)
	a.logm.Lock()
	defer a.logm.Unlock()
	a.log.Write(append(b, '\n'))
}

// api is the handler of the flags, in front of next; answers are recorded
// on log with --log-answers.
func (o *openAIFlags) api(next http.Handler, log io.Writer) *openAIAPI {
	a := &openAIAPI{completion: o.completion, delay: o.delay, lenient: o.lenient, nested: o.nested, next: next, now: time.Now}
	if o.logAnswers {
		a.log = log
	}
	return a
}
