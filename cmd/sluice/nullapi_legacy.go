package main

// sluice nullapi --openai: the legacy completions, and the lenient reading
// of requests (--lenient) that a token budget's enforce must not be
// fooled by.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf16"
)

// completionRequest is what the stand-in reads of a legacy completion.
type completionRequest struct {
	Model     string          `json:"model"`
	Prompt    json.RawMessage `json:"prompt"`
	MaxTokens *int64          `json:"max_tokens"`
	N         *int64          `json:"n"`
	BestOf    *int64          `json:"best_of"`
	Stream    bool            `json:"stream"`
}

// legacy answers a legacy completion (POST /v1/completions), after the
// delay.
func (a *openAIAPI) legacy(w http.ResponseWriter, r *http.Request) {
	rec := answerRecord{Arrived: a.now(), RequestID: r.Header.Get("X-Request-Id")}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxChatBody))
	if err != nil {
		openAIError(w, http.StatusBadRequest, "invalid_request_error", "", "reading the body: "+err.Error())
		return
	}
	var req completionRequest
	if err := a.unmarshal(body, &req); err != nil {
		openAIError(w, http.StatusBadRequest, "invalid_request_error", "", "the body is not a completion request: "+err.Error())
		return
	}
	prompts, prompt, perr := legacyPrompts(req.Prompt)
	var param, msg string
	switch {
	case perr != nil:
		param, msg = "prompt", perr.Error()
	case req.Model == "":
		param, msg = "model", "you must provide a model parameter"
	case req.MaxTokens != nil && *req.MaxTokens < 1:
		param, msg = "max_tokens", "max_tokens must be at least 1"
	case req.N != nil && (*req.N < 1 || *req.N > 128):
		param, msg = "n", "n must be from 1 to 128"
	case req.BestOf != nil && (*req.BestOf < 1 || *req.BestOf > 20):
		param, msg = "best_of", "best_of must be from 1 to 20"
	case req.Stream:
		param, msg = "stream", "this stand-in does not stream legacy completions"
	}
	if msg != "" {
		openAIError(w, http.StatusBadRequest, "invalid_request_error", param, msg)
		return
	}
	perChoice, finish := a.cap(req.MaxTokens)
	n, gen := int64(1), int64(1)
	if req.N != nil {
		n = *req.N
	}
	if req.BestOf != nil {
		gen = *req.BestOf
	}
	gen = max(gen, n)
	rec.Choices = gen * prompts
	rec.chatUsage = chatUsage{PromptTokens: prompt, CompletionTokens: perChoice * rec.Choices}
	rec.TotalTokens = rec.PromptTokens + rec.CompletionTokens
	rec.ID = "cmpl-" + strconv.FormatInt(a.seq.Add(1), 10)
	rec.MaxTokens, rec.BodyBytes = req.MaxTokens, len(body)
	rec.Complete = waitUntil(r, rec.Arrived.Add(a.delay))
	if rec.Complete {
		choices := make([]map[string]any, n*prompts)
		text := chatText(perChoice)
		for i := range choices {
			choices[i] = map[string]any{"index": i, "text": text, "logprobs": nil, "finish_reason": finish}
		}
		b, _ := json.Marshal(map[string]any{
			"id":      rec.ID,
			"object":  "text_completion",
			"created": rec.Arrived.Unix(),
			"model":   req.Model,
			"choices": choices,
			"usage":   rec.chatUsage,
		})
		rec.Complete = a.write(w, &rec, b)
	}
	rec.Ended = a.now()
	a.record(&rec)
}

// legacyPrompts reads a legacy completion's prompt: how many prompts it
// holds and their tokens.
func legacyPrompts(raw json.RawMessage) (prompts, tokens int64, err error) {
	s := strings.TrimSpace(string(raw))
	switch {
	case s == "" || s == "null":
		return 1, 0, nil
	case s[0] == '"':
		var text string
		if err := json.Unmarshal(raw, &text); err != nil {
			return 0, 0, err
		}
		return 1, (int64(len(text)) + 3) / 4, nil
	case s[0] != '[':
		return 0, 0, errors.New("prompt must be a string or a list")
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return 0, 0, err
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		return 1, int64(len(ids)), nil // one prompt of token ids
	}
	for _, p := range list {
		var text string
		if json.Unmarshal(p, &text) == nil {
			tokens += (int64(len(text)) + 3) / 4
			continue
		}
		if json.Unmarshal(p, &ids) != nil {
			return 0, 0, errors.New("prompt must be strings or lists of token ids")
		}
		tokens += int64(len(ids))
	}
	return int64(len(list)), tokens, nil
}

// lenientJSON turns body, read as a lenient parser reads it, into the JSON
// that says the same to a strict one: a UTF-8 byte order mark is dropped;
// UTF-16, with a byte order mark or told by its zero bytes as Python's
// json.loads does, is decoded; NaN, Infinity and -Infinity are numbers
// (0); in every object the first of keys equal but for case is kept, the
// others dropped; and what follows the first value is ignored.
func lenientJSON(body []byte) ([]byte, error) {
	body = bytes.TrimPrefix(body, []byte("\xef\xbb\xbf"))
	if len(body) >= 2 {
		var be bool
		switch {
		case body[0] == 0xfe && body[1] == 0xff:
			be, body = true, body[2:]
		case body[0] == 0xff && body[1] == 0xfe:
			body = body[2:]
		case body[0] == 0:
			be = true
		case body[1] == 0:
		default:
			goto utf8
		}
		u := make([]uint16, len(body)/2)
		for i := range u {
			if be {
				u[i] = uint16(body[2*i])<<8 | uint16(body[2*i+1])
			} else {
				u[i] = uint16(body[2*i+1])<<8 | uint16(body[2*i])
			}
		}
		body = []byte(string(utf16.Decode(u)))
	}
utf8:
	// NaN and the infinities, outside strings, read as 0.
	var clean []byte
	in := false
	for i := 0; i < len(body); i++ {
		c := body[i]
		switch {
		case in && c == '\\' && i+1 < len(body):
			clean = append(clean, c, body[i+1])
			i++
			continue
		case c == '"':
			in = !in
		case !in:
			for _, w := range []string{"-Infinity", "Infinity", "NaN"} {
				if bytes.HasPrefix(body[i:], []byte(w)) {
					clean, i, c = append(clean, '0'), i+len(w)-1, 0
					break
				}
			}
			if c == 0 {
				continue
			}
		}
		clean = append(clean, c)
	}
	dec := json.NewDecoder(bytes.NewReader(clean))
	dec.UseNumber()
	var out bytes.Buffer
	if err := firstKeys(dec, &out); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// firstKeys copies the next value of dec to out, keeping the first of
// keys equal but for case.
func firstKeys(dec *json.Decoder, out *bytes.Buffer) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		out.WriteByte('{')
		first := true
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return err
			}
			key := k.(string)
			var v bytes.Buffer
			if err := firstKeys(dec, &v); err != nil {
				return err
			}
			if seen[strings.ToLower(key)] {
				continue
			}
			seen[strings.ToLower(key)] = true
			if !first {
				out.WriteByte(',')
			}
			first = false
			kb, _ := json.Marshal(key)
			out.Write(kb)
			out.WriteByte(':')
			out.Write(v.Bytes())
		}
		_, err := dec.Token()
		out.WriteByte('}')
		return err
	case json.Delim('['):
		out.WriteByte('[')
		for i := 0; dec.More(); i++ {
			if i > 0 {
				out.WriteByte(',')
			}
			if err := firstKeys(dec, out); err != nil {
				return err
			}
		}
		_, err := dec.Token()
		out.WriteByte(']')
		return err
	}
	b, err := json.Marshal(tok)
	if err != nil {
		return fmt.Errorf("a value: %w", err)
	}
	out.Write(b)
	return nil
}
