package httplimit

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice"
)

// What a token budget reads of a request's body, and what Enforce writes
// into it.
//
// The body's top-level fields are found as a parser that folds case finds
// them (max_tokens, MAX_TOKENS and max_to\u212Aens are one field); with
// Enforce a field a budget reads must be spelled exactly, so that every
// parser finds it. The fields that raise what an answer may cost, in the
// dialects of OpenAI's Chat Completions, (legacy) Completions and
// Responses APIs, and of APIs that copy them:
//
//   - the output caps (Tokens.Fields, and max_completion_tokens,
//     max_tokens and max_output_tokens whatever Fields says): the tokens
//     of a choice;
//   - n and best_of: the choices generated (the larger of the two);
//   - prompt, when a list of prompts (strings or lists of token ids): a
//     batch, each prompt generating its choices;
//   - echo: each choice repeats its prompt;
//   - prediction: its rejected tokens are billed as output, per choice;
//   - inputs whose tokens the body's size does not bound: a part of a
//     message that is not text (an image, audio, a file, by URL, ID or
//     inline), an input item that is not a message or a function call or
//     output, a stored prompt, a previous response or conversation, and
//     server-side tools (web and file search, code interpreter, MCP and
//     the like): see unboundedReason.

// fieldKind is what a top-level field of a body is to a token budget.
type fieldKind uint8

const (
	fieldOutput fieldKind = iota + 1
	fieldN
	fieldBestOf
	fieldEcho
	fieldPrompt
	fieldPrediction
	fieldStream
	fieldStreamOptions
	fieldMessages
	fieldInput
	fieldTools
	fieldReference // server-side state, files or tools: unbounded unless null
)

// knownField is a field a token budget reads: its kind, its spelling, and
// for an output cap its index in tokens.outFields.
type knownField struct {
	kind fieldKind
	name string
	out  int
}

// dialectFields are the fields of the dialects, but the output caps.
var dialectFields = map[string]fieldKind{
	"n":                    fieldN,
	"best_of":              fieldBestOf,
	"echo":                 fieldEcho,
	"prompt":               fieldPrompt,
	"prediction":           fieldPrediction,
	"stream":               fieldStream,
	"stream_options":       fieldStreamOptions,
	"messages":             fieldMessages,
	"input":                fieldInput,
	"tools":                fieldTools,
	"web_search_options":   fieldReference,
	"previous_response_id": fieldReference,
	"conversation":         fieldReference,
	"mcp_servers":          fieldReference,
	"container":            fieldReference,
	"file_ids":             fieldReference,
	"attachments":          fieldReference,
	"tool_resources":       fieldReference,
}

// knownFields builds the table of the fields a budget reads, by folded
// name: dialectFields, and the output caps outFields (Fields first).
func knownFields(outFields []string) map[string]knownField {
	known := make(map[string]knownField, len(dialectFields)+len(outFields))
	for name, kind := range dialectFields {
		known[string(appendFold(nil, []byte(name)))] = knownField{kind: kind, name: name, out: -1}
	}
	for i, name := range outFields {
		f := string(appendFold(nil, []byte(name)))
		if _, ok := known[f]; !ok {
			known[f] = knownField{kind: fieldOutput, name: name, out: i}
		}
	}
	return known
}

// The kinds of content a message or an input may hold and still be
// bounded by the body's size: text.
var (
	textParts    = []string{"text", "input_text", "output_text", "refusal"}
	textPartKeys = []string{"type", "text", "refusal", "annotations", "logprobs", "cache_control", "citations", "prompt_cache_breakpoint"}
	textItems    = []string{"message", "function_call", "custom_tool_call"}
	outputItems  = []string{"function_call_output", "custom_tool_call_output"}
	clientTools  = []string{"function", "custom"}
	mediaKeys    = []string{"audio", "images", "image", "files", "file", "file_ids", "attachments"}
)

// bodyRead is what reserve read of a body.
type bodyRead struct {
	out                  int64    // the output asked by the first of Fields present; -1: none
	outAt, outIdx        [8]int   // per output cap present (up to 8): its member, its index in outFields,
	outVal               [8]int64 // and its value (-1: null)
	outs                 int
	named                bool // one of Fields is present, if null
	n, bestOf, batch     int64
	echo                 bool
	promptLen, predicted int64
	stream               bool
	messages, prompt     bool // a chat's messages; a (legacy) completion's prompt, text or a list
	input                bool // a Responses request's input
	streamOpts           int  // the member stream_options, or -1
	unbounded            string
}

// read reads the members of the scanned body b into rd.
func (t *tokens) read(s *strictJSON, b []byte, rd *bodyRead) error {
	*rd = bodyRead{out: -1, streamOpts: -1}
	check := t.enforce && !t.allowUnbounded
	var fold [128]byte
	for mi, m := range s.top {
		f, ok := t.known[string(appendFold(fold[:0], m.key))]
		if !ok {
			continue
		}
		if t.enforce && string(m.key) != f.name {
			return invalidError{fmt.Sprintf("body field %s must be spelled %q", quoteKey(m.key), f.name)}
		}
		v := b[m.vs:m.ve]
		null := string(v) == "null"
		switch f.kind {
		case fieldOutput:
			n := int64(-1)
			if !null {
				var ok bool
				if n, ok = wholeNumber(v); !ok {
					return invalidError{fmt.Sprintf("body field %s must be a whole number of tokens", f.name)}
				}
			}
			if rd.outs == len(rd.outAt) {
				return invalidError{"the body has too many output fields"}
			}
			rd.outAt[rd.outs], rd.outIdx[rd.outs], rd.outVal[rd.outs] = mi, f.out, n
			rd.outs++
		case fieldN, fieldBestOf:
			if null {
				continue
			}
			n, ok := wholeNumber(v)
			if !ok {
				return invalidError{fmt.Sprintf("body field %s must be a whole number", f.name)}
			}
			if f.kind == fieldN {
				rd.n = n
			} else {
				rd.bestOf = n
			}
		case fieldEcho, fieldStream:
			yes := string(v) == "true"
			if t.enforce && !yes && !null && string(v) != "false" {
				return invalidError{fmt.Sprintf("body field %s must be true or false", f.name)}
			}
			if f.kind == fieldEcho {
				rd.echo = yes
			} else {
				rd.stream = yes
			}
		case fieldPrompt:
			rd.promptLen = int64(len(v))
			switch v[0] {
			case '"':
				rd.prompt = true
			case '[':
				rd.prompt = true
				var prompts int64
				var texts bool
				eachElement(v, func(e []byte) bool {
					prompts++
					switch e[0] {
					case '"', '[':
						texts = true
					case '{':
						rd.unboundedOnce(check, "prompt[%d] is an object", prompts-1)
					}
					return true
				})
				if texts {
					rd.batch = prompts
				}
			case '{':
				rd.unboundedOnce(check, "prompt is an object (a stored prompt)")
			}
		case fieldPrediction:
			if !null {
				rd.predicted = int64(len(v))
			}
		case fieldStreamOptions:
			rd.streamOpts = mi
		case fieldMessages:
			rd.messages = true
			if check && !null {
				rd.checkMessages(v)
			}
		case fieldInput:
			rd.input = !null
			if check && !null {
				rd.checkInput(v)
			}
		case fieldTools:
			if check && !null {
				rd.checkTools(v)
			}
		case fieldReference:
			if !null {
				rd.unboundedOnce(check, "body field %s refers to what the API holds or fetches", f.name)
			}
		}
	}
	best := len(t.fields) // the first of Fields present
	for i := range rd.outs {
		idx := rd.outIdx[i]
		rd.named = rd.named || idx < len(t.fields)
		if idx < best && rd.outVal[i] >= 0 {
			best, rd.out = idx, rd.outVal[i]
		}
	}
	return nil
}

// unboundedOnce notes, when checking, the first reason the body's cost
// cannot be bounded.
func (rd *bodyRead) unboundedOnce(check bool, format string, args ...any) {
	if check && rd.unbounded == "" {
		rd.unbounded = fmt.Sprintf(format, args...)
	}
}

// stringIn reports whether the JSON value v is a string among names.
func stringIn(v []byte, names []string) bool {
	if len(v) < 2 || v[0] != '"' {
		return false
	}
	s := v[1 : len(v)-1]
	if bytes.IndexByte(s, '\\') >= 0 {
		d, err := decodeKey(s)
		if err != nil {
			return false
		}
		s = d
	}
	for _, n := range names {
		if string(s) == n {
			return true
		}
	}
	return false
}

// keyIn reports whether the raw key k names one of names, as a parser
// that folds case reads it.
func keyIn(k []byte, names []string) bool {
	for _, n := range names {
		if keyIs(k, n) {
			return true
		}
	}
	return false
}

// member finds the value of the member name of the object obj, as a parser
// that folds case finds it; nil when absent.
func member(obj []byte, name string) []byte {
	var got []byte
	eachMember(obj, func(k, v []byte) bool {
		if keyIs(k, name) {
			got = v
			return false
		}
		return true
	})
	return got
}

// where is the place of a message, an item or a part in a body, for a
// message: list[i].field[j], without .field when field is empty, without
// [j] when j < 0. It is made a string only to say what is refused.
type where struct {
	list  string
	i     int
	field string
	j     int
}

func (w where) String() string {
	s := w.list + "[" + strconv.Itoa(w.i) + "]"
	if w.field != "" {
		s += "." + w.field
	}
	if w.j >= 0 {
		s += "[" + strconv.Itoa(w.j) + "]"
	}
	return s
}

// checkMessages checks the messages of a chat: text only.
func (rd *bodyRead) checkMessages(v []byte) {
	if v[0] != '[' {
		rd.unboundedOnce(true, "messages is not a list")
		return
	}
	at := where{list: "messages", j: -1}
	eachElement(v, func(msg []byte) bool {
		rd.checkMessage(msg, at)
		at.i++
		return rd.unbounded == ""
	})
}

// checkMessage checks a message (or an input item that is one) at at:
// its content text, and nothing that carries media beside it.
func (rd *bodyRead) checkMessage(msg []byte, at where) {
	if msg[0] != '{' {
		rd.unboundedOnce(true, "%s is not an object", at)
		return
	}
	eachMember(msg, func(k, v []byte) bool {
		switch {
		case keyIs(k, "content"):
			at.field = "content"
			rd.checkContent(v, at)
		case string(v) != "null" && keyIn(k, mediaKeys):
			rd.unboundedOnce(true, "%s has %s", at, quoteKey(k))
		}
		return rd.unbounded == ""
	})
}

// checkContent checks a message's content (or a function call's output)
// at at: a string, or a list of text parts.
func (rd *bodyRead) checkContent(v []byte, at where) {
	switch v[0] {
	case '"', 'n':
	case '{':
		rd.checkPart(v, at)
	case '[':
		at.j = 0
		eachElement(v, func(part []byte) bool {
			switch part[0] {
			case '"':
			case '{':
				rd.checkPart(part, at)
			default:
				rd.unboundedOnce(true, "%s is not text", at)
			}
			at.j++
			return rd.unbounded == ""
		})
	default:
		rd.unboundedOnce(true, "%s is not text", at)
	}
}

// checkPart checks a part of a message's content at at: text, and nothing
// else.
func (rd *bodyRead) checkPart(part []byte, at where) {
	if typ := member(part, "type"); !stringIn(typ, textParts) {
		if typ == nil {
			typ = []byte("none")
		}
		rd.unboundedOnce(true, "%s is a part of type %s, not text", at, typ)
		return
	}
	eachMember(part, func(k, _ []byte) bool {
		if !keyIn(k, textPartKeys) {
			rd.unboundedOnce(true, "%s, a text part, has %s", at, quoteKey(k))
		}
		return rd.unbounded == ""
	})
}

// checkInput checks the input of a Responses (or embeddings) request:
// text, token IDs, messages, function calls and their outputs.
func (rd *bodyRead) checkInput(v []byte) {
	switch v[0] {
	case '"':
		return
	case '[':
	default:
		rd.unboundedOnce(true, "input is not text or a list")
		return
	}
	at := where{list: "input", j: -1}
	eachElement(v, func(item []byte) bool {
		switch item[0] {
		case '"', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		case '[': // token IDs
			eachElement(item, func(e []byte) bool {
				if e[0] == '{' || e[0] == '[' {
					rd.unboundedOnce(true, "%s is not text or token IDs", at)
				}
				return rd.unbounded == ""
			})
		case '{':
			typ := member(item, "type")
			switch {
			case typ == nil || stringIn(typ, textItems[:1]):
				rd.checkMessage(item, at)
			case stringIn(typ, textItems):
			case stringIn(typ, outputItems):
				if out := member(item, "output"); out != nil {
					o := at
					o.field = "output"
					rd.checkContent(out, o)
				}
			default:
				rd.unboundedOnce(true, "%s is an item of type %s", at, typ)
			}
		default:
			rd.unboundedOnce(true, "%s is not text", at)
		}
		at.i++
		return rd.unbounded == ""
	})
}

// checkTools checks the tools of a request: functions the client runs,
// not tools the API runs.
func (rd *bodyRead) checkTools(v []byte) {
	if v[0] != '[' {
		rd.unboundedOnce(true, "tools is not a list")
		return
	}
	i := 0
	eachElement(v, func(tool []byte) bool {
		if tool[0] != '{' {
			rd.unboundedOnce(true, "tools[%d] is not an object", i)
		} else if typ := member(tool, "type"); typ != nil && !stringIn(typ, clientTools) {
			rd.unboundedOnce(true, "tools[%d] is a tool of type %s, which the API runs", i, typ)
		}
		i++
		return rd.unbounded == ""
	})
}

// errNoBody is a request without the JSON body Enforce needs.
var errNoBody = invalidError{"the body must be a JSON object (the token budget enforces its reservation in it)"}

// encoded reports whether a request's Content-Encoding, of every line and
// every item of each, names any coding but identity: an upstream reads
// them all ("identity" then "gzip" is a gzip body).
func encoded(h http.Header) bool {
	for _, v := range h.Values("Content-Encoding") {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") {
				return true
			}
		}
	}
	return false
}

// reserve reads r's body for the reservation, putting back a body to
// forward (rewritten with Enforce).
func (t *tokens) reserve(r *http.Request) (tokenRequest, error) {
	var tr tokenRequest
	if encoded(r.Header) {
		return tr, errEncodedBody
	}
	r.Header.Del("Accept-Encoding")
	var body []byte
	if r.Body != nil && r.Body != http.NoBody {
		b, err := io.ReadAll(io.LimitReader(r.Body, t.maxBody+1))
		_ = r.Body.Close()
		if err != nil {
			return tr, fmt.Errorf("reading the request body: %w", err)
		}
		if int64(len(b)) > t.maxBody {
			return tr, errBodyTooLarge
		}
		body = b
	}
	out, named := t.def, false
	if t.header != "" {
		if v := r.Header.Get(t.header); v != "" {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil || n < 0 {
				return tr, invalidError{fmt.Sprintf("header %s must be a whole number of tokens", t.header)}
			}
			out, named = n, true
		}
	}
	if t.enforce {
		if err := t.checkQuery(r.URL); err != nil {
			return tr, err
		}
	}
	s := jsonScanners.Get().(*strictJSON)
	defer s.release()
	rd := bodyRead{out: -1, streamOpts: -1}
	parsed := false
	switch err := s.scan(body); {
	case len(body) == 0:
		if t.enforce && r.Method != http.MethodGet && r.Method != http.MethodHead {
			return tr, errNoBody
		}
	case err != nil:
		if t.enforce {
			return tr, err
		}
	default:
		if err := t.read(s, body, &rd); err != nil {
			return tr, err
		}
		if rd.unbounded != "" {
			return tr, invalidError{rd.unbounded + ": its tokens are not bounded by the token reservation"}
		}
		parsed = true
	}
	if !named && rd.out >= 0 {
		out = rd.out
	}
	out = min(out, t.max)
	if t.enforce && out < 1 {
		// A parser may read a cap of 0 as no cap at all.
		return tr, invalidError{"the output asked must be at least 1 token"}
	}
	tr.stream = rd.stream
	// The reservation: the output of every choice generated, and the
	// prompt's bytes, weighed as the cost weighs them.
	choices := max(rd.n, rd.bestOf, 1)
	if rd.batch > 0 {
		choices = satMul(choices, rd.batch)
	}
	perChoice := satAdd(out, rd.predicted)
	if rd.echo {
		perChoice = satAdd(perChoice, rd.promptLen)
	}
	tr.reserved = satMul(satMul(perChoice, choices), t.wOut)
	if t.promptBytes {
		tr.reserved = satAdd(tr.reserved, satMul(int64(len(body)), t.wIn))
	}
	if t.enforce && parsed {
		body = t.enforceIn(s, body, &rd, out)
		r.Header.Set("Content-Type", "application/json")
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	if r.ContentLength > 0 || r.Header.Get("Content-Length") != "" {
		r.Header.Set("Content-Length", strconv.Itoa(len(body)))
	}
	return tr, nil
}

// checkQuery refuses a query parameter named as a body field the budget
// reads: an API that reads its parameters from either would see two.
func (t *tokens) checkQuery(u *url.URL) error {
	q := u.RawQuery
	var fold [128]byte
	for q != "" {
		var kv string
		kv, q, _ = strings.Cut(q, "&")
		for kv != "" {
			var part string
			part, kv, _ = strings.Cut(kv, ";")
			name, _, _ := strings.Cut(part, "=")
			name, err := url.QueryUnescape(name)
			if err != nil {
				return invalidError{"the query is not well formed"}
			}
			if f, ok := t.known[string(appendFold(fold[:0], []byte(name)))]; ok {
				return invalidError{fmt.Sprintf("query parameter %q: the token budget reads %s from the body only", name, f.name)}
			}
		}
	}
	return nil
}

// enforceIn returns the body b to forward with the output asked (out)
// written in: every output cap present above it (or null, or 0) set to
// it, and
// when none of Fields is present, the first of them added (max_tokens to
// a legacy completion, max_output_tokens to a Responses request: the one
// its API reads); and a chat or completion's stream asked for its usage
// (stream_options.include_usage). b is returned as it is when it needs
// nothing.
func (t *tokens) enforceIn(s *strictJSON, b []byte, rd *bodyRead, out int64) []byte {
	type edit struct {
		at, end int
		with    string
	}
	var edits [10]edit
	n := 0
	num := strconv.FormatInt(out, 10)
	for i := range rd.outs {
		if v := rd.outVal[i]; v < 1 || v > out { // null, or 0 (no cap to some), or above
			m := s.top[rd.outAt[i]]
			edits[n] = edit{m.vs, m.ve, num}
			n++
		}
	}
	var add []string
	if field := t.missingCap(rd); field != "" {
		add = append(add, strconv.Quote(field)+":"+num)
	}
	if rd.stream && (rd.messages || rd.prompt) {
		if rd.streamOpts < 0 {
			add = append(add, `"stream_options":{"include_usage":true}`)
		} else if m := s.top[rd.streamOpts]; !asksUsage(b[m.vs:m.ve]) {
			edits[n] = edit{m.vs, m.ve, withUsage(b[m.vs:m.ve])}
			n++
		}
	}
	if n == 0 && len(add) == 0 {
		return b
	}
	for i := 1; i < n; i++ { // in the order of the body
		for j := i; j > 0 && edits[j].at < edits[j-1].at; j-- {
			edits[j], edits[j-1] = edits[j-1], edits[j]
		}
	}
	grown := len(b) + 64
	for _, e := range edits[:n] {
		grown += len(e.with)
	}
	nb := make([]byte, 0, grown)
	at := 0
	for _, e := range edits[:n] {
		nb = append(append(nb, b[at:e.at]...), e.with...)
		at = e.end
	}
	nb = append(nb, b[at:s.end]...)
	for i, a := range add {
		if i > 0 || len(s.top) > 0 {
			nb = append(nb, ',')
		}
		nb = append(nb, a...)
	}
	return append(nb, b[s.end:]...)
}

// missingCap returns the output field to add to a body in which the API
// it is for would find no cap of its own, or "" when it has one. A cap of
// another API's does not count: a chat's API ignores max_output_tokens (a
// Responses field), so a chat request that names only that one would be
// reserved by it and answered at full length. A chat's own caps are
// max_completion_tokens, max_tokens and those of Fields (an API that
// copies the chat's); a legacy completion's, max_tokens; a Responses
// request's, max_output_tokens. A body of none of them needs one of
// Fields.
func (t *tokens) missingCap(rd *bodyRead) string {
	var own []string
	field := t.fields[0]
	switch {
	case rd.messages:
		own = []string{"max_completion_tokens", "max_tokens"}
		for _, f := range t.fields {
			if f != "max_output_tokens" {
				own = append(own, f)
			}
		}
		if field == "max_output_tokens" {
			field = "max_completion_tokens"
		}
	case rd.prompt:
		own, field = []string{"max_tokens"}, "max_tokens"
	case rd.input:
		own, field = []string{"max_output_tokens"}, "max_output_tokens"
	default:
		if rd.named {
			return ""
		}
		return field
	}
	for i := range rd.outs {
		if slices.Contains(own, t.outFields[rd.outIdx[i]]) {
			return ""
		}
	}
	return field
}

// asksUsage reports whether the stream options so ask for the usage,
// spelled exactly.
func asksUsage(so []byte) bool {
	if so[0] != '{' {
		return false
	}
	yes := false
	eachMember(so, func(k, v []byte) bool {
		if string(k) == "include_usage" && string(v) == "true" {
			yes = true
		}
		return true
	})
	return yes
}

// withUsage returns the stream options so with include_usage set, and
// every other member as it was.
func withUsage(so []byte) string {
	var sb strings.Builder
	sb.WriteByte('{')
	if so[0] == '{' {
		eachMember(so, func(k, v []byte) bool {
			if !keyIs(k, "include_usage") {
				sb.WriteByte('"')
				sb.Write(k)
				sb.WriteString(`":`)
				sb.Write(v)
				sb.WriteByte(',')
			}
			return true
		})
	}
	sb.WriteString(`"include_usage":true}`)
	return sb.String()
}

// release clears what s holds of the last body, and puts it back.
func (s *strictJSON) release() {
	clear(s.top[:cap(s.top)])
	clear(s.keys[:cap(s.keys)])
	s.top, s.keys = s.top[:0], s.keys[:0]
	jsonScanners.Put(s)
}

func satAdd(a, b int64) int64 {
	return min(a+b, sluice.MaxCost) // both at most MaxCost: no overflow
}
