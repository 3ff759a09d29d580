package main

// sluice nullapi --openai, driven by the official OpenAI Go SDK on a real
// listener: what it answers must parse as OpenAI's answers do, with the
// usage its help states.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// lockedBuffer is a bytes.Buffer safe for a handler and a test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// records parses the JSON lines written so far.
func (l *lockedBuffer) records(t *testing.T) []answerRecord {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var recs []answerRecord
	for _, line := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		if line == "" {
			continue
		}
		var r answerRecord
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("record %q: %v", line, err)
		}
		recs = append(recs, r)
	}
	return recs
}

// last waits for the record of the answer id: the handler writes it
// after the answer, so it may come after the client has read it.
func (l *lockedBuffer) last(t *testing.T, id string) answerRecord {
	t.Helper()
	var r answerRecord
	poll(t, "the record of "+id, func() bool {
		recs := l.records(t)
		if len(recs) > 0 {
			r = recs[len(recs)-1]
		}
		return r.ID == id
	})
	return r
}

// startOpenAI serves the stand-in on a loopback listener, its answers
// recorded on the buffer it returns, and a client of the official SDK.
func startOpenAI(t *testing.T, completion int64, delay time.Duration) (openai.Client, *lockedBuffer, string) {
	t.Helper()
	log := &lockedBuffer{}
	f := openAIFlags{on: true, completion: completion, delay: delay, logAnswers: true}
	srv := httptest.NewServer(f.api(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(nullBody)
	}), log))
	t.Cleanup(srv.Close)
	return sdkClient(srv.URL), log, srv.URL
}

// sdkClient is a client of the SDK for the API at base (without /v1),
// which does not retry.
func sdkClient(base string, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{
		option.WithBaseURL(base + "/v1/"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0),
	}, opts...)...)
}

// The prompt of testMessages: (3 + ⌈14/4⌉) + (3 + ⌈10/4⌉).
var testMessages = []openai.ChatCompletionMessageParamUnion{
	openai.SystemMessage("You are terse."),
	openai.UserMessage("Say hello."),
}

const testPrompt = 7 + 6

func TestNullAPIOpenAIChat(t *testing.T) {
	client, log, _ := startOpenAI(t, 20, 0)
	ctx := context.Background()
	for _, tc := range []struct {
		name             string
		params           openai.ChatCompletionNewParams
		completion       int64
		finish, content  string
		choices          int
		maxCompl, maxTok int64
	}{
		{"no cap", openai.ChatCompletionNewParams{Model: "m", Messages: testMessages}, 20, "stop", strings.Repeat("The quick brown fox jumps over the lazy dog.", 2), 1, 0, 0},
		{"max_completion_tokens", openai.ChatCompletionNewParams{Model: "m", Messages: testMessages, MaxCompletionTokens: openai.Int(5)}, 5, "length", "The quick brown fox jumps", 1, 5, 0},
		{"max_tokens", openai.ChatCompletionNewParams{Model: "m", Messages: testMessages, MaxTokens: openai.Int(3)}, 3, "length", "The quick brown", 1, 0, 3},
		{"the smaller of both", openai.ChatCompletionNewParams{Model: "m", Messages: testMessages, MaxTokens: openai.Int(4), MaxCompletionTokens: openai.Int(2)}, 2, "length", "The quick", 1, 2, 4},
		{"a cap above the default", openai.ChatCompletionNewParams{Model: "m", Messages: testMessages, MaxCompletionTokens: openai.Int(1000)}, 20, "stop", strings.Repeat("The quick brown fox jumps over the lazy dog.", 2), 1, 1000, 0},
		{"n=3", openai.ChatCompletionNewParams{Model: "m", Messages: testMessages, MaxCompletionTokens: openai.Int(2), N: openai.Int(3)}, 6, "length", "The quick", 3, 2, 0},
	} {
		var resp *http.Response
		c, err := client.Chat.Completions.New(ctx, tc.params, option.WithResponseInto(&resp), option.WithHeader("X-Request-Id", tc.name))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		u := c.Usage
		if u.PromptTokens != testPrompt || u.CompletionTokens != tc.completion || u.TotalTokens != testPrompt+tc.completion {
			t.Errorf("%s: usage %+v, want %d + %d", tc.name, u.RawJSON(), testPrompt, tc.completion)
		}
		if c.Object != "chat.completion" || c.Model != "m" || !strings.HasPrefix(c.ID, "chatcmpl-") || len(c.Choices) != tc.choices {
			t.Fatalf("%s: %s", tc.name, c.RawJSON())
		}
		for i, ch := range c.Choices {
			if ch.Index != int64(i) || ch.Message.Content != tc.content || string(ch.FinishReason) != tc.finish || ch.Message.Role != "assistant" {
				t.Errorf("%s: choice %d: %s", tc.name, i, ch.RawJSON())
			}
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q", tc.name, ct)
		}
		r := log.last(t, c.ID)
		if r.ID != c.ID || r.RequestID != tc.name || r.Stream || !r.Complete || r.chatUsage != (chatUsage{testPrompt, tc.completion, testPrompt + tc.completion}) ||
			deref(r.MaxCompletionTokens) != tc.maxCompl || deref(r.MaxTokens) != tc.maxTok || r.Ended.Before(r.Arrived) || r.BodyBytes < 50 {
			t.Errorf("%s: record %+v", tc.name, r)
		}
	}
}

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// Text in parts counts its text; prompt_tokens rounds each message up.
func TestNullAPIOpenAIPromptParts(t *testing.T) {
	client, _, _ := startOpenAI(t, 1, 0)
	c, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{
		openai.UserMessage([]openai.ChatCompletionContentPartUnionParam{openai.TextContentPart("abcde"), openai.TextContentPart("fgh")}), // 8 bytes: 3 + 2
		openai.AssistantMessage("x"), // 3 + 1
		openai.UserMessage(""),       // 3 + 0
	}})
	if err != nil {
		t.Fatal(err)
	}
	if c.Usage.PromptTokens != 5+4+3 || c.Usage.CompletionTokens != 1 {
		t.Errorf("usage %s, want prompt 12, completion 1", c.Usage.RawJSON())
	}
}

// A stream: a chunk with the role, a token of content a chunk, the finish
// reason, then with include_usage a last chunk with the usage and no
// choices (every other chunk has "usage": null), and [DONE], which the
// SDK's stream reads as its end.
func TestNullAPIOpenAIStream(t *testing.T) {
	const delay = 100 * time.Millisecond
	client, log, _ := startOpenAI(t, 7, delay)
	for _, include := range []bool{true, false} {
		params := openai.ChatCompletionNewParams{Model: "m", Messages: testMessages, MaxCompletionTokens: openai.Int(5)}
		if include {
			params.StreamOptions.IncludeUsage = openai.Bool(true)
		}
		start := time.Now()
		var resp *http.Response
		stream := client.Chat.Completions.NewStreaming(context.Background(), params, option.WithResponseInto(&resp))
		var acc openai.ChatCompletionAccumulator
		var chunks []openai.ChatCompletionChunk
		for stream.Next() {
			ch := stream.Current()
			if !acc.AddChunk(ch) {
				t.Fatalf("include_usage %v: the accumulator refused chunk %s", include, ch.RawJSON())
			}
			chunks = append(chunks, ch)
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("include_usage %v: %v", include, err)
		}
		took := time.Since(start)
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
			t.Errorf("Content-Type %q", ct)
		}
		// role, 5 tokens, finish, and the usage.
		want := 1 + 5 + 1
		if include {
			want++
		}
		if len(chunks) != want {
			t.Fatalf("include_usage %v: %d chunks, want %d", include, len(chunks), want)
		}
		for i, ch := range chunks {
			last := include && i == len(chunks)-1
			if ch.Object != "chat.completion.chunk" || ch.ID != chunks[0].ID || (len(ch.Choices) == 0) != last {
				t.Errorf("include_usage %v: chunk %d: %s", include, i, ch.RawJSON())
			}
			hasNull := strings.Contains(ch.RawJSON(), `"usage":null`)
			if ch.JSON.Usage.Valid() != last || hasNull != (include && !last) {
				t.Errorf("include_usage %v: chunk %d's usage: %s", include, i, ch.RawJSON())
			}
		}
		if c := acc.Choices; len(c) != 1 || c[0].Message.Content != "The quick brown fox jumps" || c[0].FinishReason != "length" {
			t.Errorf("include_usage %v: accumulated %s", include, acc.RawJSON())
		}
		if u := chunks[len(chunks)-1].Usage; include && (u.PromptTokens != testPrompt || u.CompletionTokens != 5 || u.TotalTokens != testPrompt+5) {
			t.Errorf("usage %s", u.RawJSON())
		}
		// The last token comes --delay after the request arrived, which
		// is after it was sent.
		if took < delay {
			t.Errorf("include_usage %v: the stream ended %s after the request, before --delay %s", include, took, delay)
		}
		if r := log.last(t, chunks[0].ID); !r.Stream || r.IncludeUsage != include || !r.Complete || r.CompletionTokens != 5 || r.Ended.Sub(r.Arrived) < delay {
			t.Errorf("record %+v", r)
		}
	}
}

// A client that leaves in the middle of a stream is recorded as such.
func TestNullAPIOpenAIStreamLeft(t *testing.T) {
	client, log, _ := startOpenAI(t, 100, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "m", Messages: testMessages})
	if !stream.Next() || stream.Current().Choices[0].Delta.Role != "assistant" {
		t.Fatalf("first chunk: %v %s", stream.Err(), stream.Current().RawJSON())
	}
	cancel()
	for stream.Next() {
	}
	stream.Close()
	poll(t, "the record of the stream left", func() bool { return len(log.records(t)) == 1 })
	if r := log.records(t)[0]; r.Complete || !r.Stream {
		t.Errorf("record %+v", r)
	}
}

// Requests the stand-in refuses are OpenAI errors the SDK reads; paths
// other than /v1/ answer as plain nullapi.
func TestNullAPIOpenAIErrors(t *testing.T) {
	client, log, base := startOpenAI(t, 10, 0)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		params openai.ChatCompletionNewParams
		param  string
	}{
		{"no model", openai.ChatCompletionNewParams{Messages: testMessages}, "model"},
		{"no messages", openai.ChatCompletionNewParams{Model: "m"}, "messages"},
		{"max_tokens 0", openai.ChatCompletionNewParams{Model: "m", Messages: testMessages, MaxTokens: openai.Int(0)}, "max_tokens"},
		{"n 0", openai.ChatCompletionNewParams{Model: "m", Messages: testMessages, N: openai.Int(0)}, "n"},
	} {
		_, err := client.Chat.Completions.New(ctx, tc.params)
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != tc.param || apiErr.Type != "invalid_request_error" {
			t.Errorf("%s: %v, want a 400 about %s", tc.name, err, tc.param)
		}
	}
	_, err := client.Models.Get(ctx, "m")
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Errorf("GET /v1/models/m: %v, want 404", err)
	}
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/v1/chat/completions", "{"},
		{"POST", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":42}]}`},
		{"GET", "/v1/chat/completions", ""},
	} {
		code, body, _ := httpDo(t, tc.method, base+tc.path, tc.body)
		if code/100 != 4 || !strings.Contains(body, `"error":{`) {
			t.Errorf("%s %s %s: %d %s", tc.method, tc.path, tc.body, code, body)
		}
	}
	if code, body, _ := httpDo(t, "GET", base+"/items/1", ""); code != 200 || body != string(nullBody) {
		t.Errorf("GET /items/1: %d %q", code, body)
	}
	if n := len(log.records(t)); n != 0 {
		t.Errorf("%d answers recorded for refused requests", n)
	}
}

// The command: --openai and its flags, parsed and served.
func TestNullAPIOpenAICommand(t *testing.T) {
	addr := startServing(t, "nullapi", "--openai", "--listen", "127.0.0.1:0", "--completion-tokens", "3")
	client := sdkClient("http://" + addr)
	c, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "m", Messages: testMessages})
	if err != nil || c.Usage.CompletionTokens != 3 || c.Usage.PromptTokens != testPrompt {
		t.Errorf("%v %s", err, c.RawJSON())
	}
	for _, args := range [][]string{
		{"nullapi", "--delay", "1s"},
		{"nullapi", "--log-answers"},
		{"nullapi", "--openai", "--completion-tokens", "0"},
		{"nullapi", "--openai", "--delay", "-1s"},
		{"nullapi", "--lenient"},
		{"nullapi", "--nested-usage"},
	} {
		if code, _, errOut := runCmd(t, "", args...); code != 2 || !strings.Contains(errOut, "sluice nullapi: --") {
			t.Errorf("%v: exit %d %q, want 2", args, code, errOut)
		}
	}
}

// startOpenAIWith is startOpenAI with the flags f (on, log-answers set).
func startOpenAIWith(t *testing.T, f openAIFlags) (*lockedBuffer, string) {
	t.Helper()
	log := &lockedBuffer{}
	f.on, f.logAnswers = true, true
	srv := httptest.NewServer(f.api(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(nullBody)
	}), log))
	t.Cleanup(srv.Close)
	return log, srv.URL
}

// The legacy completions: a choice per prompt and per candidate (the
// larger of n and best_of), read by the SDK.
func TestNullAPIOpenAILegacy(t *testing.T) {
	log, base := startOpenAIWith(t, openAIFlags{completion: 20})
	client := sdkClient(base)
	ctx := context.Background()
	for _, tc := range []struct {
		name                     string
		params                   openai.CompletionNewParams
		prompt, completion       int64
		choices, generatedPerReq int64
	}{
		{"one prompt", openai.CompletionNewParams{Model: "m", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Say hello.")}, MaxTokens: openai.Int(5)}, 3, 5, 1, 1},
		{"a batch, best_of", openai.CompletionNewParams{Model: "m", Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfStrings: []string{"Say hello.", "Bye"}}, MaxTokens: openai.Int(5), BestOf: openai.Int(4), N: openai.Int(2)}, 3 + 1, 5 * 4 * 2, 2 * 2, 4 * 2},
		{"token IDs, n", openai.CompletionNewParams{Model: "m", Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{1, 2, 3}}, N: openai.Int(3)}, 3, 20 * 3, 3, 3},
	} {
		c, err := client.Completions.New(ctx, tc.params, option.WithHeader("X-Request-Id", tc.name))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if c.Usage.PromptTokens != tc.prompt || c.Usage.CompletionTokens != tc.completion || int64(len(c.Choices)) != tc.choices || c.Object != "text_completion" {
			t.Errorf("%s: %s", tc.name, c.RawJSON())
		}
		if r := log.last(t, c.ID); r.Choices != tc.generatedPerReq || r.TotalTokens != tc.prompt+tc.completion {
			t.Errorf("%s: record %+v", tc.name, r)
		}
	}
	for _, body := range []string{`{"model":"m","prompt":"x","best_of":21}`, `{"model":"m","prompt":{"id":"p"}}`, `{"model":"m","prompt":"x","stream":true}`} {
		if code, b, _ := httpDo(t, "POST", base+"/v1/completions", body); code != 400 || !strings.Contains(b, `"error":{`) {
			t.Errorf("%s: %d %s", body, code, b)
		}
	}
}

// --lenient reads what a lenient parser reads, and caps a choice by the
// larger output field; without it, the stand-in is strict and takes the
// smaller.
func TestNullAPIOpenAILenient(t *testing.T) {
	utf16 := func(s string) string {
		var b []byte
		for _, r := range s {
			b = append(b, byte(r), 0)
		}
		return string(b)
	}
	const msgs = `"messages":[{"role":"user","content":"Hello"}]`
	lenient, lbase := startOpenAIWith(t, openAIFlags{completion: 1000, lenient: true})
	_, sbase := startOpenAIWith(t, openAIFlags{completion: 1000})
	for _, tc := range []struct {
		name, body string
		lenient    int64 // completion tokens with --lenient
		strict     int64 // without; 0: refused
	}{
		{"NaN", `{"model":"m","temperature":NaN,"max_tokens":100,` + msgs + `}`, 100, 0},
		{"a byte order mark", "\xef\xbb\xbf" + `{"model":"m","max_tokens":100,` + msgs + `}`, 100, 0},
		{"UTF-16", utf16(`{"model":"m","max_tokens":100,` + msgs + `}`), 100, 0},
		{"UTF-16 with its mark", "\xff\xfe" + utf16(`{"model":"m","max_tokens":100,`+msgs+`}`), 100, 0},
		{"two output fields", `{"model":"m","max_completion_tokens":1,"max_tokens":100,` + msgs + `}`, 100, 1},
		{"a repeated key", `{"model":"m","max_tokens":100,"max_tokens":1,` + msgs + `}`, 100, 1},
		{"a key repeated in another case", `{"model":"m","MAX_TOKENS":100,"max_tokens":1,` + msgs + `}`, 100, 1},
		{"a second value", `{"model":"m","max_tokens":100,` + msgs + `}{"max_tokens":7}`, 100, 0},
	} {
		code, body, _ := httpDo(t, "POST", lbase+"/v1/chat/completions", tc.body)
		var c struct{ ID string }
		if code != 200 || json.Unmarshal([]byte(body), &c) != nil {
			t.Fatalf("%s, lenient: %d %s", tc.name, code, body)
		}
		if r := lenient.last(t, c.ID); r.CompletionTokens != tc.lenient {
			t.Errorf("%s, lenient: %d completion tokens, want %d", tc.name, r.CompletionTokens, tc.lenient)
		}
		code, body, _ = httpDo(t, "POST", sbase+"/v1/chat/completions", tc.body)
		switch {
		case tc.strict == 0 && code != 400:
			t.Errorf("%s, strict: %d %s, want 400", tc.name, code, body)
		case tc.strict > 0 && (code != 200 || !strings.Contains(body, fmt.Sprintf(`"completion_tokens":%d,`, tc.strict))):
			t.Errorf("%s, strict: %d %s, want %d completion tokens", tc.name, code, body, tc.strict)
		}
	}
}

// --nested-usage follows the usage of an answer, and of a stream's last
// chunk, with a member that nests a usage of zero.
func TestNullAPIOpenAINestedUsage(t *testing.T) {
	_, base := startOpenAIWith(t, openAIFlags{completion: 5, nested: true})
	client := sdkClient(base)
	c, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "m", Messages: testMessages})
	if err != nil || c.Usage.CompletionTokens != 5 || !strings.HasSuffix(strings.TrimSpace(c.RawJSON()), `"usage":{"prompt_tokens":13,"completion_tokens":5,"total_tokens":18},`+nestedUsage+`}`) {
		t.Errorf("%v %s", err, c.RawJSON())
	}
	params := openai.ChatCompletionNewParams{Model: "m", Messages: testMessages}
	params.StreamOptions.IncludeUsage = openai.Bool(true)
	stream := client.Chat.Completions.NewStreaming(context.Background(), params)
	var last openai.ChatCompletionChunk
	for stream.Next() {
		last = stream.Current()
	}
	if err := stream.Err(); err != nil || last.Usage.TotalTokens != 18 || !strings.Contains(last.RawJSON(), `"usage":{"prompt_tokens":13,"completion_tokens":5,"total_tokens":18},`+nestedUsage) {
		t.Errorf("%v %s", err, last.RawJSON())
	}
}
