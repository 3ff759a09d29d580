package openai

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
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
//     the like): see bounded.go.

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
// for an output cap its index in Format.outFields.
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

// bodyRead is what Reserve read of a body.
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
func (t *Format) read(s *strictJSON, b []byte, rd *bodyRead) error {
	*rd = bodyRead{out: -1, streamOpts: -1}
	var fold [128]byte
	for mi, m := range s.top {
		f, ok := t.known[string(appendFold(fold[:0], m.key))]
		if !ok {
			continue
		}
		if t.enforce && string(m.key) != f.name {
			return Invalid(fmt.Sprintf("body field %s must be spelled %q", quoteKey(m.key), f.name))
		}
		if err := t.member(rd, f, mi, b[m.vs:m.ve]); err != nil {
			return err
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

// member reads into rd the value v of the top-level member mi, the field
// f.
func (t *Format) member(rd *bodyRead, f knownField, mi int, v []byte) error {
	check := t.enforce && !t.allowUnbounded
	null := string(v) == "null"
	switch f.kind {
	case fieldOutput:
		return rd.output(f, mi, v, null)
	case fieldN, fieldBestOf:
		return rd.choices(f, v, null)
	case fieldEcho, fieldStream:
		return rd.flag(f, v, null, t.enforce)
	case fieldPrompt:
		rd.readPrompt(v, check)
	case fieldPrediction:
		if !null {
			rd.predicted = int64(len(v))
		}
	case fieldStreamOptions:
		rd.streamOpts = mi
	default:
		rd.inputs(f, v, null, check)
	}
	return nil
}

// output reads the output cap f, the member mi of value v.
func (rd *bodyRead) output(f knownField, mi int, v []byte, null bool) error {
	n := int64(-1)
	if !null {
		var ok bool
		if n, ok = wholeNumber(v); !ok {
			return Invalid(fmt.Sprintf("body field %s must be a whole number of tokens", f.name))
		}
	}
	if rd.outs == len(rd.outAt) {
		return Invalid("the body has too many output fields")
	}
	rd.outAt[rd.outs], rd.outIdx[rd.outs], rd.outVal[rd.outs] = mi, f.out, n
	rd.outs++
	return nil
}

// choices reads n or best_of.
func (rd *bodyRead) choices(f knownField, v []byte, null bool) error {
	if null {
		return nil
	}
	n, ok := wholeNumber(v)
	if !ok {
		return Invalid(fmt.Sprintf("body field %s must be a whole number", f.name))
	}
	if f.kind == fieldN {
		rd.n = n
	} else {
		rd.bestOf = n
	}
	return nil
}

// flag reads echo or stream: with enforce, true, false or null only.
func (rd *bodyRead) flag(f knownField, v []byte, null, enforce bool) error {
	yes := string(v) == "true"
	if enforce && !yes && !null && string(v) != "false" {
		return Invalid(fmt.Sprintf("body field %s must be true or false", f.name))
	}
	if f.kind == fieldEcho {
		rd.echo = yes
	} else {
		rd.stream = yes
	}
	return nil
}

// readPrompt reads a (legacy) completion's prompt: text, or a list of
// prompts (a batch when they are texts or token lists).
func (rd *bodyRead) readPrompt(v []byte, check bool) {
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
}

// inputs reads the fields that hold inputs: messages, input, tools, and
// the references to what the API holds; with check, each is checked for
// a bound.
func (rd *bodyRead) inputs(f knownField, v []byte, null, check bool) {
	switch f.kind {
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

// errNoBody is a request without the JSON body Enforce needs.
var errNoBody = Invalid("the body must be a JSON object (the token budget enforces its reservation in it)")

// Reserve reads r's body for its reservation, in the cost's units, and
// puts back a body to forward (rewritten with Enforce). Its errors are
// ErrEncodedBody, ErrBodyTooLarge, an Invalid request, or the body's
// reading failing.
func (t *Format) Reserve(r *http.Request) (int64, error) {
	body, err := t.body(r)
	if err != nil {
		return 0, err
	}
	out, named, err := t.headerOutput(r)
	if err != nil {
		return 0, err
	}
	if t.enforce {
		if err := t.checkQuery(r.URL); err != nil {
			return 0, err
		}
	}
	s := jsonScanners.Get().(*strictJSON)
	defer s.release()
	rd := bodyRead{out: -1, streamOpts: -1}
	parsed, err := t.parse(s, r.Method, body, &rd)
	if err != nil {
		return 0, err
	}
	if !named && rd.out >= 0 {
		out = rd.out
	}
	out = min(out, t.max)
	if t.enforce && out < 1 {
		// A parser may read a cap of 0 as no cap at all.
		return 0, Invalid("the output asked must be at least 1 token")
	}
	reserved := t.reservation(&rd, out, len(body))
	if t.enforce && parsed {
		body = t.enforceIn(s, body, &rd, out)
		r.Header.Set("Content-Type", "application/json")
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	if r.ContentLength > 0 || r.Header.Get("Content-Length") != "" {
		r.Header.Set("Content-Length", strconv.Itoa(len(body)))
	}
	return reserved, nil
}

// body reads r's body, at most MaxBody bytes, uncompressed; r's
// Accept-Encoding is removed, so that the answer comes uncompressed too.
func (t *Format) body(r *http.Request) ([]byte, error) {
	if encoded(r.Header) {
		return nil, ErrEncodedBody
	}
	r.Header.Del("Accept-Encoding")
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, t.maxBody+1))
	_ = r.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("reading the request body: %w", err)
	}
	if int64(len(b)) > t.maxBody {
		return nil, ErrBodyTooLarge
	}
	return b, nil
}

// headerOutput is the output asked by r's Header, named when present, else
// Default.
func (t *Format) headerOutput(r *http.Request) (out int64, named bool, err error) {
	if t.header == "" {
		return t.def, false, nil
	}
	v := r.Header.Get(t.header)
	if v == "" {
		return t.def, false, nil
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n < 0 {
		return 0, false, Invalid(fmt.Sprintf("header %s must be a whole number of tokens", t.header))
	}
	return n, true, nil
}

// parse scans body with s and reads it into rd: parsed when it is strict
// JSON. Without Enforce, a body that is not is read as none.
func (t *Format) parse(s *strictJSON, method string, body []byte, rd *bodyRead) (parsed bool, err error) {
	switch err := s.scan(body); {
	case len(body) == 0:
		if t.enforce && method != http.MethodGet && method != http.MethodHead {
			return false, errNoBody
		}
		return false, nil
	case err != nil:
		if t.enforce {
			return false, err
		}
		return false, nil
	}
	if err := t.read(s, body, rd); err != nil {
		return false, err
	}
	if rd.unbounded != "" {
		return false, Invalid(rd.unbounded + ": its tokens are not bounded by the token reservation")
	}
	return true, nil
}

// reservation is the cost reserved: the output of every choice generated
// (out each), and the prompt's bytes (a body of size bytes), weighed as
// the cost weighs them.
func (t *Format) reservation(rd *bodyRead, out int64, size int) int64 {
	choices := max(rd.n, rd.bestOf, 1)
	if rd.batch > 0 {
		choices = satMul(choices, rd.batch)
	}
	perChoice := satAdd(out, rd.predicted)
	if rd.echo {
		perChoice = satAdd(perChoice, rd.promptLen)
	}
	reserved := satMul(satMul(perChoice, choices), t.wOut)
	if t.promptBytes {
		reserved = satAdd(reserved, satMul(int64(size), t.wIn))
	}
	return reserved
}

// checkQuery refuses a query parameter named as a body field the budget
// reads: an API that reads its parameters from either would see two.
func (t *Format) checkQuery(u *url.URL) error {
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
				return Invalid("the query is not well formed")
			}
			if f, ok := t.known[string(appendFold(fold[:0], []byte(name)))]; ok {
				return Invalid(fmt.Sprintf("query parameter %q: the token budget reads %s from the body only", name, f.name))
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
func (t *Format) enforceIn(s *strictJSON, b []byte, rd *bodyRead, out int64) []byte {
	type edit = bodyEdit
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
	return rewrite(b, s.end, len(s.top) > 0, edits[:n], add)
}

// bodyEdit replaces a body's bytes at:end with with.
type bodyEdit struct {
	at, end int
	with    string
}

// rewrite returns the body b with edits made and the members add added at
// the end of its top object, whose closing brace is at end (members:
// it has some already).
func rewrite(b []byte, end int, members bool, edits []bodyEdit, add []string) []byte {
	for i := 1; i < len(edits); i++ { // in the order of the body
		for j := i; j > 0 && edits[j].at < edits[j-1].at; j-- {
			edits[j], edits[j-1] = edits[j-1], edits[j]
		}
	}
	grown := len(b) + 64
	for _, e := range edits {
		grown += len(e.with)
	}
	nb := make([]byte, 0, grown)
	at := 0
	for _, e := range edits {
		nb = append(append(nb, b[at:e.at]...), e.with...)
		at = e.end
	}
	nb = append(nb, b[at:end]...)
	for i, a := range add {
		if i > 0 || members {
			nb = append(nb, ',')
		}
		nb = append(nb, a...)
	}
	return append(nb, b[end:]...)
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
func (t *Format) missingCap(rd *bodyRead) string {
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
