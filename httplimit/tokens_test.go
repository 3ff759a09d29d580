package httplimit_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
)

const tokenRules = `
domain: llm
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: api_key_tokens
    rate_limit: {unit: minute, requests_per_unit: 1000}
`

// llm is a stand-in for an OpenAI-compatible API: it records the bodies it
// receives and answers with the usage the test sets.
type llm struct {
	mu     sync.Mutex
	bodies []map[string]any
	prompt int64
	output int64
	status int
	cut    bool // a stream that breaks off before its usage
}

func (a *llm) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	_ = json.NewDecoder(r.Body).Decode(&body)
	a.mu.Lock()
	a.bodies = append(a.bodies, body)
	prompt, output, status, cut := a.prompt, a.output, a.status, a.cut
	a.mu.Unlock()
	if status != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, `{"error":{"message":"no"}}`)
		return
	}
	u := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, prompt, output, prompt+output)
	if body["stream"] == true {
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for i := 0; i < 3; i++ {
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n")
			fl.Flush()
		}
		if cut {
			panic(http.ErrAbortHandler)
		}
		if so, _ := body["stream_options"].(map[string]any); so["include_usage"] == true {
			fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":%s}\n\n", u)
		}
		io.WriteString(w, "data: [DONE]\n\n")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":%s}`, u)
}

func (a *llm) set(prompt, output int64, status int, cut bool) {
	a.mu.Lock()
	a.prompt, a.output, a.status, a.cut = prompt, output, status, cut
	a.mu.Unlock()
}

func (a *llm) last() map[string]any {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.bodies[len(a.bodies)-1]
}

// tokenServer starts the llm behind a middleware with a token budget.
func tokenServer(t *testing.T, tok httplimit.Tokens) (*llm, string) {
	t.Helper()
	a := &llm{}
	mw, err := httplimit.New(httplimit.Config{
		Decider:     tokenDecider(t),
		Domain:      "llm",
		Descriptors: []httplimit.Descriptor{{{Key: "api_key", Source: httplimit.APIKey("Authorization")}}},
		Tokens:      &tok,
	})
	if err != nil {
		t.Fatal(err)
	}
	return a, server(t, mw(a)).URL
}

// tokenDecider is decider's, with the store's clock as its own: the
// settlements' At.
func tokenDecider(t *testing.T) *decide.Decider {
	t.Helper()
	clock := func() time.Time { return fixedNow }
	store := memstore.New(memstore.Config{Now: clock})
	t.Cleanup(func() { store.Close() })
	d, err := decide.New(decide.Config{Limiter: sluice.NewLimiter(store), Rules: rulestest.Config(t, tokenRules), Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func tokenBudget() httplimit.Tokens {
	return httplimit.Tokens{
		Descriptor: httplimit.Descriptor{{Key: "api_key_tokens", Source: httplimit.APIKey("Authorization")}},
		Default:    100,
		Max:        300,
	}
}

// chat posts body with key k.
func chat(t *testing.T, url, k, body string) reply {
	t.Helper()
	req, err := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+k)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return readReply(t, resp)
}

func remainingTokens(t *testing.T, r reply) int64 {
	t.Helper()
	n, err := strconv.ParseInt(r.header.Get("X-Ratelimit-Remaining-Tokens"), 10, 64)
	if err != nil {
		t.Fatalf("x-ratelimit-remaining-tokens %q: %v (headers %v)", r.header.Get("X-Ratelimit-Remaining-Tokens"), err, r.header)
	}
	return n
}

// TestTokensSettleJSON: a JSON answer's usage settles the reservation; the
// next response's headers show what was spent, not what was reserved.
func TestTokensSettleJSON(t *testing.T) {
	a, url := tokenServer(t, tokenBudget())
	a.set(30, 40, 0, false)
	r1 := chat(t, url, "k1", `{"model":"m","max_tokens":250}`)
	if r1.status != 200 {
		t.Fatalf("first: %d %s", r1.status, r1.body)
	}
	if got := remainingTokens(t, r1); got != 1000-250 {
		t.Fatalf("after a reservation of 250: remaining %d, want 750", got)
	}
	if got := r1.header.Get("X-Ratelimit-Remaining-Requests"); got != "9" {
		t.Fatalf("remaining requests %q, want 9", got)
	}
	if got := r1.header.Get("X-Ratelimit-Reset-Tokens"); got != "40s" {
		t.Fatalf("reset tokens %q, want 40s (the window ends 39.75 s later)", got)
	}
	if r1.header.Get("RateLimit-Policy") == "" {
		t.Fatal("no IETF RateLimit-Policy")
	}
	// 70 spent: the second request's reservation (a default of 100) sees
	// 1000 - 70 - 100.
	r2 := chat(t, url, "k1", `{"model":"m"}`)
	if got := remainingTokens(t, r2); got != 1000-70-100 {
		t.Fatalf("after settling 70 and reserving 100: remaining %d, want 830", got)
	}
	// Capped at Max: 5000 asked, 300 reserved.
	r3 := chat(t, url, "k1", `{"model":"m","max_completion_tokens":5000}`)
	if got := remainingTokens(t, r3); got != 1000-70-70-300 {
		t.Fatalf("a request over Max: remaining %d, want %d", got, 1000-70-70-300)
	}
}

// TestTokensDenied: a reservation that does not fit is denied with a
// Retry-After, and consumes nothing, requests included.
func TestTokensDenied(t *testing.T) {
	tok := tokenBudget()
	tok.Max = 1000
	a, url := tokenServer(t, tok)
	a.set(0, 900, 0, false)
	if r := chat(t, url, "k", `{"max_tokens":900}`); r.status != 200 {
		t.Fatalf("first: %d", r.status)
	}
	r := chat(t, url, "k", `{"max_tokens":200}`)
	if r.status != 429 || r.header.Get("Retry-After") != "40" {
		t.Fatalf("a reservation of 200 beside 900 spent: %d Retry-After %q, want 429 after 40", r.status, r.header.Get("Retry-After"))
	}
	if got := r.header.Get("X-Ratelimit-Remaining-Requests"); got != "9" {
		t.Fatalf("the denied request consumed a request: remaining %q, want 9", got)
	}
	if r := chat(t, url, "k", `{"max_tokens":100}`); r.status != 200 {
		t.Fatalf("100 fits beside 900: %d", r.status)
	}
}

// TestTokensEnforceStream: Enforce writes the reservation and asks a
// stream for its usage; the last event's usage settles it.
func TestTokensEnforceStream(t *testing.T) {
	tok := tokenBudget()
	tok.Enforce, tok.PromptBytes = true, true
	a, url := tokenServer(t, tok)
	a.set(12, 20, 0, false)
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}`
	r := chat(t, url, "k", body)
	if r.status != 200 || !strings.Contains(r.body, `"usage"`) {
		t.Fatalf("stream: %d %q", r.status, r.body)
	}
	got := a.last()
	if got["max_completion_tokens"] != float64(100) {
		t.Fatalf("forwarded max_completion_tokens %v, want 100", got["max_completion_tokens"])
	}
	if so, _ := got["stream_options"].(map[string]any); so["include_usage"] != true {
		t.Fatalf("forwarded stream_options %v, want include_usage", got["stream_options"])
	}
	if rem := remainingTokens(t, r); rem != 1000-100-int64(len(body)) {
		t.Fatalf("reservation of 100 + %d bytes: remaining %d", len(body), rem)
	}
	r2 := chat(t, url, "k", `{"model":"m"}`)
	if rem := remainingTokens(t, r2); rem != 1000-32-(100+int64(len(`{"model":"m"}`))) {
		t.Fatalf("after a stream that spent 32: remaining %d", rem)
	}
}

// TestTokensWithoutUsage: an error status refunds the reservation; a
// stream cut off keeps it whole.
func TestTokensWithoutUsage(t *testing.T) {
	a, url := tokenServer(t, tokenBudget())
	a.set(0, 0, 503, false)
	if r := chat(t, url, "k", `{"max_tokens":200}`); r.status != 503 {
		t.Fatalf("upstream error: %d", r.status)
	}
	a.set(5, 5, 0, false)
	r := chat(t, url, "k", `{"max_tokens":10}`)
	if rem := remainingTokens(t, r); rem != 1000-10 {
		t.Fatalf("after an error answer: remaining %d, want 990 (refunded)", rem)
	}
	a.set(5, 5, 0, true)
	req, _ := http.NewRequest("POST", url, strings.NewReader(`{"stream":true,"max_tokens":200}`))
	req.Header.Set("Authorization", "Bearer k")
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, bufio.NewReader(resp.Body))
		resp.Body.Close()
	}
	a.set(5, 5, 0, false)
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := chat(t, url, "k", `{"max_tokens":1}`)
		// 10 spent, 200 held by the cut stream, 1 reserved now; the
		// earlier reservations of 1 were settled to 10 each.
		rem := remainingTokens(t, r)
		if rem <= 1000-10-200-1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a stream cut off: remaining %d, want the reservation of 200 kept", rem)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTokensConfig: bad configurations are refused.
func TestTokensConfig(t *testing.T) {
	d := decider(t, tokenRules)
	for name, cfg := range map[string]httplimit.Config{
		"no default":    {Decider: d, Domain: "llm", Tokens: &httplimit.Tokens{Descriptor: tokenBudget().Descriptor}},
		"no descriptor": {Decider: d, Domain: "llm", Tokens: &httplimit.Tokens{Default: 1}},
		"max below":     {Decider: d, Domain: "llm", Tokens: &httplimit.Tokens{Descriptor: tokenBudget().Descriptor, Default: 10, Max: 5}},
		"with shaping":  {Decider: d, Domain: "llm", Tokens: ptr(tokenBudget()), Shaping: &httplimit.Shaping{MaxDelay: time.Second}},
		"no settle":     {Decider: decideOnly{d}, Domain: "llm", Tokens: ptr(tokenBudget())},
	} {
		if _, err := httplimit.New(cfg); !errors.Is(err, httplimit.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// decideOnly is a Decider that cannot settle, as a remote's client.
type decideOnly struct{ d *decide.Decider }

func (d decideOnly) Decide(ctx context.Context, r *decide.Request, o *decide.Outcome) error {
	return d.d.Decide(ctx, r, o)
}

// TestTokensBadBodies: a body over MaxBody is 413, a compressed one 415,
// a reservation that is not a number 400; none consumes anything.
func TestTokensBadBodies(t *testing.T) {
	tok := tokenBudget()
	tok.MaxBody = 64
	_, url := tokenServer(t, tok)
	if r := chat(t, url, "k", `{"max_tokens":1,"x":"`+strings.Repeat("a", 100)+`"}`); r.status != 413 {
		t.Fatalf("a long body: %d", r.status)
	}
	if r := chat(t, url, "k", `{"max_tokens":"many"}`); r.status != 400 {
		t.Fatalf("max_tokens not a number: %d", r.status)
	}
	// Compressed, however the header says it: one line, a list, or a
	// second line after an identity (which the upstream reads whole).
	for _, ce := range [][]string{{"gzip"}, {"GZIP"}, {"identity, gzip"}, {"identity", "gzip"}, {"identity", "br"}} {
		req, _ := http.NewRequest("POST", url, strings.NewReader("xx"))
		req.Header["Content-Encoding"] = ce
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 415 {
			t.Errorf("a body with Content-Encoding %q: %d, want 415", ce, resp.StatusCode)
		}
	}
	if r := chat(t, url, "k", `{}`); remainingTokens(t, r) != 900 || r.header.Get("X-Ratelimit-Remaining-Requests") != "9" {
		t.Fatalf("bad requests consumed something: %v", r.header)
	}
}
