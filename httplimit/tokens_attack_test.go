package httplimit_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf16"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
)

// Token budgets attacked in the process: a hostile client's bodies, and
// answers that name a usage where it is not the answer's.

// budget is a middleware with a token budget, in front of an API that
// records what reaches it and answers as answer says.
type budget struct {
	h      http.Handler
	mu     sync.Mutex
	bodies [][]byte
	heads  []http.Header
	settle [][2]int64 // reserved, spent
	answer func(w http.ResponseWriter)
}

// newBudget is tok on a limit of a billion tokens a minute.
func newBudget(t testing.TB, tok httplimit.Tokens) *budget {
	t.Helper()
	const rules = `
domain: llm
descriptors:
  - key: api_key_tokens
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
`
	clock := func() time.Time { return fixedNow }
	store := memstore.New(memstore.Config{Now: clock})
	t.Cleanup(func() { store.Close() })
	d, err := decide.New(decide.Config{Limiter: sluice.NewLimiter(store), Rules: rulestest.Config(t, rules), Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	b := &budget{answer: func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`)
	}}
	if tok.Descriptor == nil {
		tok.Descriptor = httplimit.Descriptor{{Key: "api_key_tokens", Source: httplimit.APIKey("Authorization")}}
	}
	mw, err := httplimit.New(httplimit.Config{
		Decider: d, Domain: "llm", Tokens: &tok,
		OnSettle: func(_ http.ResponseWriter, _ *http.Request, reserved, spent int64) {
			b.mu.Lock()
			b.settle = append(b.settle, [2]int64{reserved, spent})
			b.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	b.h = mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		b.mu.Lock()
		b.bodies, b.heads = append(b.bodies, body), append(b.heads, r.Header.Clone())
		answer := b.answer
		b.mu.Unlock()
		answer(w)
	}))
	return b
}

// sent is what became of a request through a budget.
type sent struct {
	status   int
	detail   string // of a problem
	body     []byte // what the API received
	header   http.Header
	reserved int64
	spent    int64
}

// send sends a request with body and headers (name, value pairs) to
// target (a path, or a path with a query).
func (b *budget) send(t testing.TB, method, target string, body []byte, headers ...string) sent {
	t.Helper()
	r := httptest.NewRequest(method, target, bytes.NewReader(body))
	if body == nil {
		r = httptest.NewRequest(method, target, nil)
	}
	r.Header.Set("Authorization", "Bearer sk-1")
	r.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Set(headers[i], headers[i+1])
	}
	b.mu.Lock()
	nb, ns := len(b.bodies), len(b.settle)
	b.mu.Unlock()
	w := httptest.NewRecorder()
	b.h.ServeHTTP(w, r)
	s := sent{status: w.Code}
	if w.Code >= 400 {
		var p struct{ Detail string }
		_ = json.Unmarshal(w.Body.Bytes(), &p)
		s.detail = p.Detail
		if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" && len(b.bodies) == nb {
			t.Errorf("a refusal as %q: %s", ct, w.Body)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.bodies) > nb {
		s.body, s.header = b.bodies[nb], b.heads[nb]
	}
	if len(b.settle) > ns {
		s.reserved, s.spent = b.settle[ns][0], b.settle[ns][1]
	}
	return s
}

func (b *budget) post(t testing.TB, body string, headers ...string) sent {
	t.Helper()
	return b.send(t, "POST", "/v1/chat/completions", []byte(body), headers...)
}

// enforced is the LLM recipe's budget, reading no prompt: a reservation is
// its output alone.
func enforced() httplimit.Tokens {
	return httplimit.Tokens{Default: 100, Max: 1000, Enforce: true}
}

func utf16LE(s string) []byte {
	var b []byte
	for _, u := range utf16.Encode([]rune(s)) {
		b = append(b, byte(u), byte(u>>8))
	}
	return b
}

// TestTokensStrictBody: with Enforce, a body that parsers may read
// differently is refused 400, with a problem that says why, and reaches
// nothing; without Enforce it is forwarded as it is, on the default
// reservation. Bodies every parser reads alike pass.
func TestTokensStrictBody(t *testing.T) {
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	many := func(n int, repeat string) string {
		var sb strings.Builder
		sb.WriteString(`{"max_tokens":5`)
		for i := range n {
			fmt.Fprintf(&sb, `,"k%d":%d`, i, i)
		}
		return sb.String() + repeat + "}"
	}
	for _, tc := range []struct {
		name, body, reason string
	}{
		{"NaN", `{"temperature":NaN,"max_tokens":5}`, "unexpected 'N'"},
		{"Infinity", `{"temperature":-Infinity}`, "a number needs digits"},
		{"a byte order mark", "\xef\xbb\xbf{\"max_tokens\":5}", "byte order mark"},
		{"UTF-16", string(utf16LE(`{"max_tokens":5}`)), "NUL byte"},
		{"UTF-16 with its mark", "\xff\xfe" + string(utf16LE(`{"max_tokens":5}`)), "NUL byte"},
		{"invalid UTF-8", "{\"model\":\"\xff\",\"max_tokens\":5}", "not UTF-8"},
		{"a repeated key", `{"max_tokens":1,"max_tokens":100000}`, `key "max_tokens" is repeated`},
		{"a key repeated in another case", `{"max_tokens":1,"Max_Tokens":100000}`, `"max_tokens" and "Max_Tokens" are repeated`},
		{"a key repeated with the Kelvin sign", `{"max_tokens":1,"max_to` + "\u212a" + `ens":100000}`, "repeated"},
		{"a key repeated with an escape", `{"max\u005ftokens":100000,"max_tokens":1}`, `key "max_tokens" is repeated`},
		{"a nested key repeated", `{"messages":[{"role":"user","content":[{"type":"text","type":"image_url"}]}]}`, `key "type" is repeated`},
		{"a key repeated in a large object", many(40, `,"K39":1`), `"k39" and "K39" are repeated`},
		{"a key with a NUL", `{"max_tokens\u0000":100000}`, "holds a NUL"},
		{"a key with a lone surrogate", `{"max_tokens\ud800":100000}`, "lone surrogate"},
		{"a second value", `{"max_tokens":1}{"max_tokens":100000}`, "data follows"},
		{"trailing garbage", `{"max_tokens":1} x`, "data follows"},
		{"a trailing comma", `{"max_tokens":1,}`, "a key must be a string"},
		{"single quotes", `{'max_tokens':1}`, "a key must be a string"},
		{"a comment", `{"max_tokens":1 /* x */}`, "unexpected '/'"},
		{"a control character", "{\"model\":\"a\tb\"}", "control character"},
		{"a bad escape", `{"model":"\x41"}`, "unknown escape"},
		{"too deep", `{"x":` + deep(600) + `}`, "deeper than 512"},
		{"too many members", many(1<<14, ""), "more than 16384 members"},
		{"too many members around", many(1<<13, `,"y":`+strings.Replace(many(1<<13, ""), "max_tokens", "z", 1)), "more than 16384 members"},
		{"not an object", `[{"max_tokens":1}]`, "not a JSON object"},
		{"a leading zero", `{"max_tokens":0100}`, "unexpected '1'"},
		{"an exponent", `{"max_tokens":1e5}`, "whole number of tokens"},
		{"a fraction", `{"max_tokens":100000.0}`, "whole number of tokens"},
		{"a negative", `{"max_tokens":-1}`, "whole number of tokens"},
		{"a huge number", `{"max_tokens":100000000000000000000}`, "whole number of tokens"},
		{"a string", `{"max_tokens":"100000"}`, "whole number of tokens"},
		{"a field in another case", `{"MAX_TOKENS":100000}`, `must be spelled "max_tokens"`},
		{"n in another case", `{"N":128}`, `must be spelled "n"`},
		{"a stream that is not a boolean", `{"stream":"false","max_tokens":5}`, "true or false"},
		{"no body", ``, "must be a JSON object"},
		{"an output of 0", `{"max_tokens":0}`, "at least 1 token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBudget(t, enforced())
			got := b.post(t, tc.body)
			if got.status != 400 || !strings.Contains(got.detail, tc.reason) || got.body != nil {
				t.Fatalf("%d %q (forwarded %q), want 400 about %q", got.status, got.detail, got.body, tc.reason)
			}
			t.Logf("%s", got.detail)
		})
	}
	// Without Enforce, nothing is refused for its form: a body the budget
	// cannot read is forwarded as it is, on the default reservation.
	b := newBudget(t, httplimit.Tokens{Default: 100, Max: 1000})
	for _, body := range []string{`{"temperature":NaN,"max_tokens":5}`, `{"max_tokens":1,"max_tokens":2}`} {
		if got := b.post(t, body); got.status != 200 || string(got.body) != body || got.reserved != 100 {
			t.Errorf("without Enforce, %s: %d, forwarded %q, reserved %d", body, got.status, got.body, got.reserved)
		}
	}
	// What strict JSON allows passes, untouched when it asks for no more
	// than the reservation.
	b = newBudget(t, enforced())
	for _, body := range []string{
		` {"max_completion_tokens" : 100 , "model":"m\u00e9\ud83d\ude00", "messages":[{"role":"user","content":"caf` + "\u00e9" + ` \"q\" \\ \ud800"}]} `,
		`{"max_completion_tokens":100,"x":` + deep(500) + `}`,
		`{"max_completion_tokens":100,"a":{"b":1},"c":{"b":2},"d":[{"b":1},{"b":1}]}`,
		many(40, `,"k40":{"k0":1}`),
	} {
		if got := b.post(t, body); got.status != 200 || string(got.body) != body {
			t.Errorf("%.80s: %d %q, forwarded %.80q", body, got.status, got.detail, got.body)
		}
	}
}

// forwarded decodes what the API received.
func forwarded(t *testing.T, s sent) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(s.body, &m); err != nil {
		t.Fatalf("forwarded %q: %v", s.body, err)
	}
	return m
}

// TestTokensEnforceEveryField: Enforce caps every output field present,
// whichever the reservation read, and writes the first of Fields when none
// is; a field the budget reads cannot hide in the query.
func TestTokensEnforceEveryField(t *testing.T) {
	b := newBudget(t, enforced())
	got := b.post(t, `{"max_completion_tokens":50,"max_tokens":100000,"max_output_tokens":null}`)
	if m := forwarded(t, got); got.reserved != 50 || m["max_completion_tokens"] != 50.0 || m["max_tokens"] != 50.0 || m["max_output_tokens"] != 50.0 {
		t.Errorf("reserved %d, forwarded %s", got.reserved, got.body)
	}
	got = b.post(t, `{"max_completion_tokens":50,"max_tokens":0}`)
	if m := forwarded(t, got); got.reserved != 50 || m["max_tokens"] != 50.0 {
		t.Errorf("max_tokens 0 beside 50: reserved %d, forwarded %s (a cap of 0 is no cap to some parsers)", got.reserved, got.body)
	}
	got = b.post(t, `{"max_tokens":100000,"max_output_tokens":7}`)
	if m := forwarded(t, got); got.reserved != 1000 || m["max_tokens"] != 1000.0 || m["max_output_tokens"] != 7.0 {
		t.Errorf("reserved %d, forwarded %s (want max_tokens capped at Max, max_output_tokens below it kept)", got.reserved, got.body)
	}
	for body, want := range map[string]string{
		`{}`:                           `{"max_completion_tokens":100}`,
		`{"messages":[],"prompt":"x"}`: `{"messages":[],"prompt":"x","max_completion_tokens":100}`,
		`{"prompt":"x"}`:               `{"prompt":"x","max_tokens":100}`,
		`{"prompt":["x","y"]}`:         `{"prompt":["x","y"],"max_tokens":100}`,
		`{"input":"x"}`:                `{"input":"x","max_output_tokens":100}`,
		`{"input":[{"role":"user","content":"x"}]}`: `{"input":[{"role":"user","content":"x"}],"max_output_tokens":100}`,
	} {
		// None present: the field of the request's API is written.
		if got := b.post(t, body); string(got.body) != want {
			t.Errorf("%s: forwarded %s, want %s", body, got.body, want)
		}
	}
	for body, want := range map[string]string{
		// Only another API's cap present: reserved by it, and the
		// request's own API's cap written, so that the API stops there
		// (a chat's API ignores max_output_tokens: 1 reserved, 4,000
		// spent).
		`{"messages":[],"max_output_tokens":1}`:    `{"messages":[],"max_output_tokens":1,"max_completion_tokens":1}`,
		`{"prompt":"x","max_output_tokens":1}`:     `{"prompt":"x","max_output_tokens":1,"max_tokens":1}`,
		`{"prompt":"x","max_completion_tokens":1}`: `{"prompt":"x","max_completion_tokens":1,"max_tokens":1}`,
		`{"input":"x","max_tokens":1}`:             `{"input":"x","max_tokens":1,"max_output_tokens":1}`,
		`{"input":"x","max_completion_tokens":1}`:  `{"input":"x","max_completion_tokens":1,"max_output_tokens":1}`,
		// Its own present: nothing added.
		`{"messages":[],"max_tokens":1}`:      `{"messages":[],"max_tokens":1}`,
		`{"input":"x","max_output_tokens":1}`: `{"input":"x","max_output_tokens":1}`,
	} {
		if got := b.post(t, body); string(got.body) != want {
			t.Errorf("%s: forwarded %s, want %s", body, got.body, want)
		}
	}

	// Fields names max_tokens only: the others are capped all the same.
	tok := enforced()
	tok.Fields, tok.Header = []string{"max_tokens"}, "X-Max-Tokens"
	b = newBudget(t, tok)
	got = b.post(t, `{"max_completion_tokens":5000,"model":"m"}`)
	if m := forwarded(t, got); got.reserved != 100 || m["max_tokens"] != 100.0 || m["max_completion_tokens"] != 100.0 {
		t.Errorf("Fields [max_tokens]: reserved %d, forwarded %s", got.reserved, got.body)
	}
	if got := b.post(t, `{"model":"m"}`, "X-Max-Tokens", "0"); got.status != 400 {
		t.Errorf("an output of 0 asked by the header: %d", got.status)
	}
	got = b.post(t, `{"max_tokens":900}`, "X-Max-Tokens", "20")
	if m := forwarded(t, got); got.reserved != 20 || m["max_tokens"] != 20.0 {
		t.Errorf("a header of 20: reserved %d, forwarded %s", got.reserved, got.body)
	}

	b = newBudget(t, enforced())
	for _, target := range []string{"/v1/chat/completions?max_tokens=100000", "/v1/chat/completions?api-version=1&N=128", "/v1/chat/completions?x=1;stream=true"} {
		if got := b.send(t, "POST", target, []byte(`{"max_tokens":5}`)); got.status != 400 || !strings.Contains(got.detail, "query parameter") {
			t.Errorf("%s: %d %q, want 400", target, got.status, got.detail)
		}
	}
	if got := b.send(t, "POST", "/v1/chat/completions?api-version=2024-10-21", []byte(`{"max_tokens":5}`)); got.status != 200 {
		t.Errorf("a query that names no field: %d %q", got.status, got.detail)
	}

	// The body is forwarded as JSON, whatever the client called it.
	got = b.post(t, `{"max_tokens":5}`, "Content-Type", "application/x-www-form-urlencoded")
	if ct := got.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("forwarded as %q", ct)
	}
	// A request without a body is refused but for GET and HEAD.
	if got := b.send(t, "GET", "/v1/models", nil); got.status != 200 || got.reserved != 100 {
		t.Errorf("GET without a body: %d %q, reserved %d", got.status, got.detail, got.reserved)
	}
	if got := b.send(t, "DELETE", "/v1/responses/r1", nil); got.status != 400 {
		t.Errorf("DELETE without a body: %d", got.status)
	}
}

// TestTokensEnforceStreamOptions: a chat's stream is asked for its usage,
// the client's other stream options kept; a Responses stream, which sends
// its usage anyway and has no include_usage, is left alone.
func TestTokensEnforceStreamOptions(t *testing.T) {
	b := newBudget(t, enforced())
	for body, want := range map[string]string{
		`{"stream":true,"messages":[],"max_completion_tokens":5}`:                                                `{"stream":true,"messages":[],"max_completion_tokens":5,"stream_options":{"include_usage":true}}`,
		`{"stream":true,"messages":[],"max_completion_tokens":5,"stream_options":{"include_usage":false,"x":1}}`: `{"stream":true,"messages":[],"max_completion_tokens":5,"stream_options":{"x":1,"include_usage":true}}`,
		`{"stream":true,"messages":[],"max_completion_tokens":5,"stream_options":{"Include_Usage":true}}`:        `{"stream":true,"messages":[],"max_completion_tokens":5,"stream_options":{"include_usage":true}}`,
		`{"stream":true,"messages":[],"max_completion_tokens":5,"stream_options":null}`:                          `{"stream":true,"messages":[],"max_completion_tokens":5,"stream_options":{"include_usage":true}}`,
		`{"stream_options":{"include_usage":false},"max_tokens":9999,"stream":true,"prompt":"x"}`:                `{"stream_options":{"include_usage":true},"max_tokens":1000,"stream":true,"prompt":"x"}`,
		`{"max_tokens":9999,"stream":true,"stream_options":{"include_usage":false},"prompt":"x"}`:                `{"max_tokens":1000,"stream":true,"stream_options":{"include_usage":true},"prompt":"x"}`,
		`{"stream":true,"input":"hi","max_output_tokens":5}`:                                                     `{"stream":true,"input":"hi","max_output_tokens":5}`,
	} {
		if got := b.post(t, body); got.status != 200 || string(got.body) != want {
			t.Errorf("%s: %d %q\nforwarded %s\nwant      %s", body, got.status, got.detail, got.body, want)
		}
	}
}

// TestTokensChoices: the reservation is the output of every choice the
// request asks to be generated: n, best_of, a batch of prompts, echo and a
// prediction; weighed as the cost is.
func TestTokensChoices(t *testing.T) {
	tok := httplimit.Tokens{Default: 100, Max: 1000}
	for _, enforce := range []bool{false, true} {
		tok.Enforce = enforce
		b := newBudget(t, tok)
		for _, tc := range []struct {
			body string
			want int64
		}{
			{`{"max_tokens":100,"n":128,"messages":[]}`, 100 * 128},
			{`{"max_tokens":100,"n":null,"messages":[]}`, 100},
			{`{"max_tokens":100,"n":0,"messages":[]}`, 100},
			{`{"max_tokens":100,"best_of":20,"n":2,"prompt":"hi"}`, 100 * 20},
			{`{"max_tokens":100,"best_of":2,"n":5,"prompt":"hi"}`, 100 * 5},
			{`{"max_tokens":100,"best_of":20,"prompt":["a","b","c"]}`, 100 * 20 * 3},
			{`{"max_tokens":100,"prompt":[[1,2],[3]]}`, 100 * 2},
			{`{"max_tokens":100,"prompt":[1,2,3]}`, 100},
			{`{"max_tokens":100,"echo":true,"n":2,"prompt":"0123456789"}`, (100 + 12) * 2},
			{`{"max_tokens":100,"prediction":{"type":"content","content":"abcdef"},"messages":[]}`, 100 + int64(len(`{"type":"content","content":"abcdef"}`))},
		} {
			got := b.post(t, tc.body)
			if got.status != 200 || got.reserved != tc.want {
				t.Errorf("enforce %v: %s: %d %q, reserved %d, want %d", enforce, tc.body, got.status, got.detail, got.reserved, tc.want)
			}
		}
		// Above the limit, whatever the multiplication would overflow to.
		if got := b.post(t, `{"max_completion_tokens":5000,"n":999999999999999999,"messages":[]}`); got.status != 429 {
			t.Errorf("enforce %v: n of 10^18: %d %q, want 429", enforce, got.status, got.detail)
		}
		for _, body := range []string{`{"n":"2"}`, `{"n":2.5}`, `{"best_of":-1}`, `{"n":1000000000000000000}`} {
			if got := b.post(t, body); got.status != 400 {
				t.Errorf("enforce %v: %s: %d, want 400", enforce, body, got.status)
			}
		}
	}
	// Weighed: output by OutputWeight, the prompt's bytes by InputWeight.
	tok = httplimit.Tokens{Default: 100, Max: 1000, Enforce: true, PromptBytes: true, InputWeight: 2, OutputWeight: 3}
	b := newBudget(t, tok)
	body := `{"max_tokens":10,"n":2,"messages":[]}`
	if got := b.post(t, body); got.reserved != 10*2*3+int64(len(body))*2 {
		t.Errorf("weights 2 and 3: reserved %d, want %d", got.reserved, 10*2*3+len(body)*2)
	}
}

// TestTokensUnbounded: with Enforce, an input whose tokens its bytes do
// not bound is refused, unless AllowUnbounded; text passes.
func TestTokensUnbounded(t *testing.T) {
	refuse := newBudget(t, enforced())
	tok := enforced()
	tok.AllowUnbounded = true
	allow := newBudget(t, tok)
	msg := func(content string) string {
		return `{"model":"m","messages":[{"role":"system","content":"Be terse."},{"role":"user","content":` + content + `}]}`
	}
	for _, tc := range []struct{ name, body, reason string }{
		{"an image by URL", msg(`[{"type":"text","text":"What is this?"},{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]`), `messages[1].content[1] is a part of type "image_url"`},
		{"an inline image", msg(`[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]`), `"image_url"`},
		{"audio", msg(`[{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]`), `"input_audio"`},
		{"a file by ID", msg(`[{"type":"file","file":{"file_id":"file-1"}}]`), `"file"`},
		{"a part without a type", msg(`[{"text":"hi"}]`), "type none"},
		{"a part of a type in another case", msg(`[{"Type":"image_url","image_url":{"url":"x"}}]`), `"image_url"`},
		{"a text part carrying an image", msg(`[{"type":"text","text":"hi","image_url":{"url":"x"}}]`), `has "image_url"`},
		{"a text part spelled with an escape", msg(`[{"type":"t\u0065xt","text":"hi","image_url":{"url":"x"}}]`), `has "image_url"`},
		{"a message's stored audio", `{"messages":[{"role":"assistant","audio":{"id":"audio_1"}}]}`, `messages[0] has "audio"`},
		{"a message's images", `{"messages":[{"role":"user","content":"hi","images":["iVBORw0KGgo="]}]}`, `has "images"`},
		{"content that is not text", msg(`42`), "is not text"},
		{"web search", `{"messages":[],"web_search_options":{}}`, "web_search_options"},
		{"a server-side tool", `{"messages":[],"tools":[{"type":"function","function":{"name":"f"}},{"type":"web_search"}]}`, `tools[1] is a tool of type "web_search"`},
		{"an MCP tool", `{"input":"hi","tools":[{"type":"mcp","server_url":"https://x"}]}`, `"mcp"`},
		{"a previous response", `{"input":"hi","previous_response_id":"resp_1"}`, "previous_response_id"},
		{"a conversation", `{"input":"hi","conversation":"conv_1"}`, "conversation"},
		{"a stored prompt", `{"prompt":{"id":"pmpt_1"},"input":"hi"}`, "stored prompt"},
		{"an input image", `{"input":[{"role":"user","content":[{"type":"input_text","text":"hi"},{"type":"input_image","image_url":"https://x/a.png"}]}]}`, `input[0].content[1] is a part of type "input_image"`},
		{"an input file", `{"input":[{"type":"message","role":"user","content":[{"type":"input_file","file_id":"file-1"}]}]}`, `"input_file"`},
		{"an item reference", `{"input":[{"type":"item_reference","id":"msg_1"}]}`, `"item_reference"`},
		{"a function's output with an image", `{"input":[{"type":"function_call_output","call_id":"c","output":[{"type":"input_image","image_url":"x"}]}]}`, `input[0].output[0]`},
		{"a reasoning item", `{"input":[{"type":"reasoning","id":"rs_1","encrypted_content":"x"}]}`, `"reasoning"`},
		{"MCP servers", `{"messages":[],"mcp_servers":[{"url":"x"}]}`, "mcp_servers"},
		{"a prompt of objects", `{"prompt":[{"id":"x"}]}`, "prompt[0] is an object"},
	} {
		got := refuse.post(t, tc.body)
		if got.status != 400 || !strings.Contains(got.detail, tc.reason) || !strings.Contains(got.detail, "not bounded") {
			t.Errorf("%s: %d %q, want 400 about %q", tc.name, got.status, got.detail, tc.reason)
		}
		if got := allow.post(t, tc.body); got.status != 200 {
			t.Errorf("%s, with AllowUnbounded: %d %q", tc.name, got.status, got.detail)
		}
	}
	for _, body := range []string{
		msg(`"hello"`),
		msg(`null`),
		msg(`[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}},"plain"]`),
		`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"42"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"image":{"type":"string"}}}}}]}`,
		`{"input":"hi","tools":[{"type":"function","name":"f"},{"type":"custom","name":"g"}],"previous_response_id":null}`,
		`{"input":[{"role":"user","content":"hi"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"yo","annotations":[]}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"42"}]}`,
		`{"input":["one","two"],"model":"embed"}`,
		`{"input":[[1,2,3],[4]],"model":"embed"}`,
		`{"prompt":["a",[1,2]],"max_tokens":5}`,
	} {
		if got := refuse.post(t, body); got.status != 200 {
			t.Errorf("%.100s: %d %q, want it admitted", body, got.status, got.detail)
		}
	}
}

// TestTokensAllowUnboundedNeedsEnforce: AllowUnbounded alone is a
// configuration error.
func TestTokensAllowUnboundedNeedsEnforce(t *testing.T) {
	_, err := httplimit.New(httplimit.Config{Decider: decider(t, tokenRules), Domain: "llm", Tokens: &httplimit.Tokens{
		Descriptor: tokenBudget().Descriptor, Default: 1, AllowUnbounded: true}})
	if err == nil || !strings.Contains(err.Error(), "AllowUnbounded needs Enforce") {
		t.Fatalf("%v", err)
	}
}

// writeIn writes s to w in pieces of n bytes.
func writeIn(w http.ResponseWriter, s string, n int) {
	for len(s) > 0 {
		k := min(n, len(s))
		io.WriteString(w, s[:k])
		s = s[k:]
	}
}

// TestTokensUsageTopLevel: a JSON answer's usage is its top-level one,
// however the API's writes cut it: not one nested deeper, before or after
// it, nor one inside a string; with two top-level ones, the costlier.
func TestTokensUsageTopLevel(t *testing.T) {
	b := newBudget(t, httplimit.Tokens{Default: 5000, Max: 5000})
	for _, tc := range []struct {
		answer string
		spent  int64
	}{
		{`{"id":"x","usage":{"prompt_tokens":10,"completion_tokens":1000,"total_tokens":1010},"x_provider":{"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}}}`, 1010},
		{`{"choices":[{"message":{"content":"{\"usage\":{\"total_tokens\":0}}"},"usage":{"total_tokens":1}}],"usage" : {"prompt_tokens":10,"completion_tokens":1000,"prompt_tokens_details":{"cached_tokens":9}} , "z":[{"usage":{"total_tokens":2}}]}`, 1010},
		{`{"usage":{"total_tokens":7},"usage":{"prompt_tokens":10,"completion_tokens":1000}}`, 1010},
		{`{"usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":1010}}`, 1010},
		{`{"usage":{"input_tokens":10,"output_tokens":1000}}`, 1010},
		{`{"data":{"usage":{"total_tokens":1}}}`, 5000},
		{`{"usage":null}`, 5000},
		{`{"usage":{"prompt_tokens":-5,"completion_tokens":1}}`, 5000},
		{`[{"usage":{"total_tokens":1}}]`, 5000},
		{`not json "usage":{"total_tokens":1}`, 5000},
	} {
		for _, n := range []int{1, 2, 3, 7, 64, len(tc.answer)} {
			b.answer = func(w http.ResponseWriter) {
				w.Header().Set("Content-Type", "application/json")
				writeIn(w, tc.answer, n)
			}
			if got := b.post(t, `{"model":"m"}`); got.spent != tc.spent {
				t.Errorf("%s, in writes of %d: spent %d, want %d", tc.answer, n, got.spent, tc.spent)
			}
		}
	}
}

// TestTokensUsageEvents: a stream's usage is the last event's top-level
// one, or a Responses API terminal event's response.usage: not a usage
// nested elsewhere, nor a response's in another event.
func TestTokensUsageEvents(t *testing.T) {
	b := newBudget(t, httplimit.Tokens{Default: 5000, Max: 5000})
	for _, tc := range []struct {
		events []string
		spent  int64
	}{
		{[]string{
			`{"choices":[{"delta":{"content":"x"}}],"usage":null}`,
			`{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1000},"x_groq":{"usage":{"prompt_tokens":0,"completion_tokens":0}}}`,
		}, 1010},
		{[]string{
			`{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1000}}`,
			`{"choices":[{"delta":{}}],"x_groq":{"usage":{"prompt_tokens":0,"completion_tokens":0}}}`,
		}, 1010},
		{[]string{
			`{"type":"response.created","response":{"usage":null}}`,
			`{"type":"response.completed","response":{"id":"r","usage":{"input_tokens":10,"output_tokens":1000,"total_tokens":1010}}}`,
			`{"type":"response.output_item.done","item":{"type":"x"},"response":{"usage":{"input_tokens":0,"output_tokens":0}}}`,
		}, 1010},
		{[]string{
			`{"type":"response.in_progress","response":{"usage":{"input_tokens":1,"output_tokens":1}}}`,
		}, 5000},
		{[]string{
			`{"type":"response.incomplete","response":{"output":[{"usage":{"output_tokens":1}}],"usage":{"input_tokens":10,"output_tokens":1000}}}`,
		}, 1010},
	} {
		b.answer = func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/event-stream")
			var sb strings.Builder
			for _, e := range tc.events {
				sb.WriteString("data: " + e + "\n\n")
			}
			sb.WriteString("data: [DONE]\n\n")
			writeIn(w, sb.String(), 5)
		}
		if got := b.post(t, `{"model":"m","stream":true}`); got.spent != tc.spent {
			t.Errorf("%q: spent %d, want %d", tc.events, got.spent, tc.spent)
		}
	}
}
