package main

// Token budgets attacked end to end: a hostile client of a real sluice
// proxy, configured as the LLM recipe of docs/recipes.md, in front of a
// real sluice nullapi --openai that honours what it reads (n, best_of,
// batches of prompts; with --lenient, what a lenient JSON parser reads;
// with --nested-usage, answers whose usage is followed by a nested one).
// The upstream's own record of what it generated is the measure.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf16"
)

// recipeRules is the LLM recipe's configuration (1,500 tokens and 60
// requests a minute per API key, enforce, prompt: bytes), with the legacy
// completions routed as the chat completions are.
const recipeRules = `domain: llm
http:
  routes:
    - pattern: "POST /v1/chat/completions"
      name: chat
      descriptors: [[{key: api_key, api_key: Authorization}]]
      tokens:
        descriptor: [{key: api_key_tokens, api_key: Authorization}]
        reserve: {default: 512, max: 4096, prompt: bytes}
        enforce: true
    - pattern: "POST /v1/completions"
      name: completions
      descriptors: [[{key: api_key, api_key: Authorization}]]
      tokens:
        descriptor: [{key: api_key_tokens, api_key: Authorization}]
        reserve: {default: 512, max: 4096, prompt: bytes}
        enforce: true
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: api_key_tokens
    rate_limit: {unit: minute, requests_per_unit: 1500}
`

// recipeLimit is recipeRules' tokens a minute.
const recipeLimit = 1500

// attackResult is what the client saw of one request.
type attackResult struct {
	id      string
	status  int
	header  http.Header
	body    string
	sentLen int
}

// post sends body to path on the proxy with API key key.
func post(t *testing.T, p *proc, path, key, id string, body []byte) attackResult {
	t.Helper()
	req, err := http.NewRequest("POST", "http://"+p.addrs["proxy"]+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", id, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s: reading the answer: %v", id, err)
	}
	return attackResult{id: id, status: resp.StatusCode, header: resp.Header, body: string(b), sentLen: len(body)}
}

// TestTokensE2EChoices: requests that ask for many choices (chat's n, the
// legacy completions' best_of and a batch of prompts) cannot spend more
// than the limit in a window. 20 parallel requests per key, each asking
// for 100 tokens a choice and 128 choices (or 20 candidates for each of 2
// prompts), against an upstream that takes 2 s and generates every
// choice; and 20 asking for 2 choices, some of which fit.
func TestTokensE2EChoices(t *testing.T) {
	beside(t)
	up := startOpenAIUpstream(t, "--delay", "2s")
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, file, recipeRules)
	p := startProxy(t, "--config", file, "--upstream", "http://"+up.addr)
	const parallel = 20
	attacks := []struct {
		name, key, path, body string
		mustDeny              bool // the reservation alone is above the limit
	}{
		{"n=128", "sk-n", "/v1/chat/completions", `{"model":"m","max_tokens":100,"n":128,"messages":[{"role":"user","content":"Hello"}]}`, true},
		{"best_of=20 over 2 prompts", "sk-best-of", "/v1/completions", `{"model":"m","max_tokens":100,"best_of":20,"prompt":["Hello","Bye"]}`, true},
		{"n=2", "sk-n2", "/v1/chat/completions", `{"model":"m","max_tokens":100,"n":2,"messages":[{"role":"user","content":"Hello"}]}`, false},
	}
	// Every request of the test is admitted (or not) in one window of the
	// minute, and the upstream takes 2 s: 20 s is plenty.
	start := waitForWindow(time.Minute, 20*time.Second)
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		got = map[string][]attackResult{}
	)
	for _, a := range attacks {
		for i := range parallel {
			wg.Go(func() {
				r := post(t, p, a.path, a.key, fmt.Sprintf("%s #%d", a.name, i), []byte(a.body))
				mu.Lock()
				got[a.name] = append(got[a.name], r)
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	if end := time.Now().Truncate(time.Minute); !end.Equal(start) {
		t.Fatalf("the requests crossed into the next minute (%s, then %s)", start.Format(time.TimeOnly), end.Format(time.TimeOnly))
	}
	for _, a := range attacks {
		var admitted, denied int
		var spent, generated int64
		for _, r := range got[a.name] {
			switch r.status {
			case 200:
				admitted++
				rec := up.record(r.id)
				spent += rec.TotalTokens
				generated += rec.Choices
			case 429:
				denied++
			default:
				t.Errorf("%s: status %d %s", r.id, r.status, r.body)
			}
		}
		t.Logf("%s: %d of %d admitted, %d denied; %d tokens spent in one window (%d choices generated), limit %d",
			a.name, admitted, parallel, denied, spent, generated, recipeLimit)
		if spent > recipeLimit {
			t.Errorf("%s: %d tokens spent in one window, %.1fx the limit of %d", a.name, spent, float64(spent)/recipeLimit, recipeLimit)
		}
		if a.mustDeny && admitted > 0 {
			t.Errorf("%s: %d admitted, though one alone asks for more than the limit", a.name, admitted)
		}
		if !a.mustDeny && (admitted == 0 || denied == 0) {
			t.Errorf("%s: %d admitted, %d denied: want some of each", a.name, admitted, denied)
		}
	}
}

// utf16LE encodes s as UTF-16, little-endian, without a byte order mark.
func utf16LE(s string) []byte {
	var b []byte
	for _, u := range utf16.Encode([]rune(s)) {
		b = append(b, byte(u), byte(u>>8))
	}
	return b
}

// TestTokensE2EStrictBody: with enforce, a body is read as every parser
// reads it or refused. Against an upstream that parses leniently (a byte
// order mark, UTF-16, NaN, the first of repeated keys in any case, the
// larger of max_tokens and max_completion_tokens) and would generate
// 100,000 tokens a choice, no request is admitted that spends more than
// it reserved: each is refused 400 with a problem+json that says why, or
// capped. Each attack has its own API key, so its own 1,500 tokens.
func TestTokensE2EStrictBody(t *testing.T) {
	beside(t)
	up := startOpenAIUpstream(t, "--lenient", "--completion-tokens", "100000")
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, file, recipeRules)
	p := startProxy(t, "--config", file, "--upstream", "http://"+up.addr)
	const msgs = `"messages":[{"role":"user","content":"Hello"}]`
	for _, tc := range []struct {
		name   string
		body   []byte
		reason string // in the 400's detail; empty: admitted, and capped
	}{
		{"NaN", []byte(`{"model":"m","temperature":NaN,"max_tokens":100000,` + msgs + `}`), "not strict JSON"},
		{"byte order mark", []byte("\xef\xbb\xbf" + `{"model":"m","max_tokens":100000,` + msgs + `}`), "not strict JSON"},
		{"UTF-16", utf16LE(`{"model":"m","max_tokens":100000,` + msgs + `}`), "not strict JSON"},
		{"two output fields", []byte(`{"model":"m","max_completion_tokens":1,"max_tokens":100000,` + msgs + `}`), ""},
		{"only a Responses cap on a chat", []byte(`{"model":"m","max_output_tokens":1,` + msgs + `}`), ""},
		{"a repeated key", []byte(`{"model":"m","max_tokens":100000,"max_tokens":1,` + msgs + `}`), "repeated"},
		{"a key repeated in another case", []byte(`{"model":"m","MAX_TOKENS":100000,"max_tokens":1,` + msgs + `}`), "repeated"},
		{"a key repeated with an escape", []byte(`{"model":"m","max\u005ftokens":100000,"max_tokens":1,` + msgs + `}`), "repeated"},
		{"a second value", []byte(`{"model":"m","max_tokens":1,` + msgs + `}{"max_tokens":100000}`), "not strict JSON"},
	} {
		key := "sk-" + strings.ReplaceAll(tc.name, " ", "-")
		r := post(t, p, "/v1/chat/completions", key, tc.name, tc.body)
		switch {
		case r.status == 200:
			rec := up.record(tc.name)
			reserved := recipeLimit - headerInt(t, r.header, "X-Ratelimit-Remaining-Tokens")
			t.Logf("%s: admitted, reserved %d, the upstream read max_tokens %v, max_completion_tokens %v and spent %d",
				tc.name, reserved, deref(rec.MaxTokens), deref(rec.MaxCompletionTokens), rec.TotalTokens)
			if rec.TotalTokens > reserved {
				t.Errorf("%s: spent %d, reserved %d", tc.name, rec.TotalTokens, reserved)
			}
			if tc.reason != "" {
				t.Errorf("%s: admitted, want a 400 about %q", tc.name, tc.reason)
			}
		case r.status == 400:
			var prob struct {
				Type, Title, Detail string
				Status              int
			}
			if err := json.Unmarshal([]byte(r.body), &prob); err != nil || r.header.Get("Content-Type") != "application/problem+json" || prob.Status != 400 {
				t.Errorf("%s: 400 %q (%s), want problem+json", tc.name, r.body, r.header.Get("Content-Type"))
			}
			t.Logf("%s: refused: %s", tc.name, prob.Detail)
			if tc.reason == "" || !strings.Contains(prob.Detail, tc.reason) {
				t.Errorf("%s: refused %q, want %s", tc.name, prob.Detail, map[bool]string{true: "admitted and capped", false: "a reason with " + strconv.Quote(tc.reason)}[tc.reason == ""])
			}
		default:
			t.Errorf("%s: status %d %s", tc.name, r.status, r.body)
		}
	}
	if n := len(up.records()); n != 2 {
		t.Errorf("the upstream answered %d requests, want 2 (the capped ones)", n)
	}
}

// spentMetric reads sluice_proxy_tokens_total{kind="spent"} of route.
func spentMetric(t *testing.T, p *proc, route string) int64 {
	t.Helper()
	_, _, metrics := fetch(t, "GET", "http://"+p.addrs["admin"]+"/metrics")
	m := regexp.MustCompile(`(?m)^sluice_proxy_tokens_total\{kind="spent",route="` + route + `"\} (\d+)$`).FindStringSubmatch(metrics)
	if m == nil {
		return 0
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}

// TestTokensE2ENestedUsage: an answer's usage is its top-level one (in a
// stream, the last chunk's), whatever nested object after it is named
// usage too.
func TestTokensE2ENestedUsage(t *testing.T) {
	beside(t)
	up := startOpenAIUpstream(t, "--nested-usage", "--completion-tokens", "1000")
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, file, recipeRules)
	p := startProxy(t, "--config", file, "--upstream", "http://"+up.addr)
	var want int64
	for i, body := range []string{
		`{"model":"m","max_tokens":1000,"messages":[{"role":"user","content":"Hello, this is a prompt of forty bytes."}]}`,
		`{"model":"m","max_tokens":1000,"stream":true,"messages":[{"role":"user","content":"Hello, this is a prompt of forty bytes."}]}`,
	} {
		id := fmt.Sprintf("answer %d", i)
		r := post(t, p, "/v1/chat/completions", fmt.Sprintf("sk-%d", i), id, []byte(body))
		if r.status != 200 || !strings.Contains(r.body, `"x_provider":{"usage"`) {
			t.Fatalf("%s: %d %s", id, r.status, r.body[:min(len(r.body), 300)])
		}
		rec := up.record(id)
		want += rec.TotalTokens
		waitAllowed(t, p, "chat", i+1)
		got := spentMetric(t, p, "chat")
		t.Logf("%s: the upstream's usage %d tokens (prompt %d, completion %d); the proxy charged %d", id, rec.TotalTokens, rec.PromptTokens, rec.CompletionTokens, got-(want-rec.TotalTokens))
		if got != want {
			t.Errorf("%s: the proxy counts %d tokens spent, the upstream's usages say %d", id, got, want)
		}
	}
}
