package main

// End-to-end tests of token budgets: the official OpenAI Go SDK talks to
// a real sluice proxy, in front of a real sluice nullapi --openai, both
// processes of the binary under test. What the proxy advertises and does
// is checked against the usage the answers report and against the
// upstream's own record of what arrived.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// tokenRules is the configuration token budgets are written for: 60
// requests and 100,000 tokens a minute per API key, a reservation of the
// request's max_completion_tokens or max_tokens (1024 when it names
// none, at most 4096) plus its body's size, enforced on the upstream.
const tokenRules = `domain: llm
http:
  routes:
    - pattern: "POST /v1/chat/completions"
      name: chat
      descriptors:
        - [{key: api_key, api_key: Authorization}]
      tokens:
        descriptor: [{key: api_key_tokens, api_key: Authorization}]
        reserve:
          fields: [max_completion_tokens, max_tokens]
          default: 1024
          max: 4096
          prompt: bytes
        usage: {input_weight: 1, output_weight: 1}
        enforce: true
descriptors:
  - key: api_key
    rate_limit: {unit: REQUNIT, requests_per_unit: REQUESTS}
  - key: api_key_tokens
    rate_limit: {unit: TOKUNIT, requests_per_unit: TOKENS}
`

// tokenRulesWith is tokenRules with the given limits: requests per reqUnit
// and tokens per tokUnit (a unit, or "second, unit_multiplier: 5").
func tokenRulesWith(requests int, reqUnit string, tokens int, tokUnit string) string {
	return strings.NewReplacer("REQUESTS", strconv.Itoa(requests), "REQUNIT", reqUnit,
		"TOKENS", strconv.Itoa(tokens), "TOKUNIT", tokUnit).Replace(tokenRules)
}

// openAIUpstream is a running sluice nullapi --openai --log-answers.
type openAIUpstream struct {
	t    *testing.T
	addr string

	mu    sync.Mutex
	recs  []answerRecord
	lines []string
	done  chan struct{}
}

// startOpenAIUpstream runs sluice nullapi --openai with args on a loopback
// port and collects its record of answers.
func startOpenAIUpstream(t *testing.T, args ...string) *openAIUpstream {
	t.Helper()
	cmd := exec.Command(sluiceBinary(t), append([]string{"nullapi", "--openai", "--log-answers", "--listen", "127.0.0.1:0"}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "GORACE=halt_on_error=1 atexit_sleep_ms=50"}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	u := &openAIUpstream{t: t, done: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		defer close(u.done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			var rec answerRecord
			u.mu.Lock()
			if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &rec) == nil {
				u.recs = append(u.recs, rec)
			} else {
				u.lines = append(u.lines, line)
			}
			u.mu.Unlock()
			if _, a, ok := strings.Cut(line, ": HTTP on "); ok {
				addr <- a
			}
		}
		cmd.Wait()
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-u.done
		u.mu.Lock()
		defer u.mu.Unlock()
		if log := strings.Join(u.lines, "\n"); strings.Contains(log, "DATA RACE") || t.Failed() {
			t.Logf("sluice nullapi log:\n%s", log)
			if strings.Contains(log, "DATA RACE") {
				t.Error("a data race in sluice nullapi")
			}
		}
	})
	select {
	case u.addr = <-addr:
	case <-u.done:
		t.Fatalf("sluice nullapi exited: %s", strings.Join(u.lines, "\n"))
	case <-time.After(e2eWait):
		t.Fatalf("sluice nullapi did not start within %s", e2eWait)
	}
	return u
}

// records returns the answers recorded so far.
func (u *openAIUpstream) records() []answerRecord {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]answerRecord(nil), u.recs...)
}

// record waits for the record of the request with X-Request-Id id: the
// upstream writes it when its handler ends, which may be after the
// client has the answer.
func (u *openAIUpstream) record(id string) answerRecord {
	u.t.Helper()
	var got []answerRecord
	poll(u.t, "the upstream's record of "+id, func() bool {
		got = got[:0]
		for _, r := range u.records() {
			if r.RequestID == id {
				got = append(got, r)
			}
		}
		return len(got) > 0
	})
	if len(got) != 1 {
		u.t.Fatalf("the upstream answered %s %d times", id, len(got))
	}
	return got[0]
}

// waitForWindow waits, if need be, until the window of length period
// (aligned to the epoch, as fixed windows are) has at least need left, and
// returns the start of the window it is then in.
func waitForWindow(period, need time.Duration) time.Time {
	now := time.Now()
	if end := now.Truncate(period).Add(period); end.Sub(now) < need {
		time.Sleep(time.Until(end) + 20*time.Millisecond)
	}
	return time.Now().Truncate(period)
}

// sentBodies is an SDK middleware that notes the size of the body of each
// request it sends, by X-Request-Id.
type sentBodies struct {
	mu    sync.Mutex
	sizes map[string]int64
}

func (s *sentBodies) middleware(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
	s.mu.Lock()
	if s.sizes == nil {
		s.sizes = map[string]int64{}
	}
	s.sizes[req.Header.Get("X-Request-Id")] = req.ContentLength
	s.mu.Unlock()
	return next(req)
}

func (s *sentBodies) size(id string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sizes[id]
}

// headerInt reads an integer header.
func headerInt(t *testing.T, h http.Header, name string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(h.Get(name), 10, 64)
	if err != nil {
		t.Fatalf("header %s: %q: %v (headers %v)", name, h.Get(name), err, h)
	}
	return n
}

// checkReset checks that a reset header is a Go duration within (0, period].
func checkReset(t *testing.T, step string, h http.Header, name string, period time.Duration) {
	t.Helper()
	d, err := time.ParseDuration(h.Get(name))
	if err != nil || d <= 0 || d > period {
		t.Errorf("%s: %s %q, want a duration in (0, %s]", step, name, h.Get(name), period)
	}
}

// TestTokensE2E: one API key's chat completions through the proxy, JSON
// and streamed. Each answer's headers say what its admission left: the
// limit less the usage of the answers before it (each settled when its
// response ended) less its own reservation.
func TestTokensE2E(t *testing.T) {
	beside(t)
	const limit, requests = 100000, 60
	up := startOpenAIUpstream(t, "--completion-tokens", "200")
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, file, tokenRulesWith(requests, "minute", limit, "minute"))
	p := startProxy(t, "--config", file, "--upstream", "http://"+up.addr)
	var bodies sentBodies
	client := sdkClient("http://"+p.addrs["proxy"], option.WithAPIKey("sk-alice"), option.WithMiddleware(bodies.middleware))
	ctx := context.Background()

	type step struct {
		name                 string
		maxCompl, maxTok     int64 // 0: absent
		stream, includeUsage bool
		field                string // the field the upstream must see the output reserved in
	}
	steps := []step{
		{name: "json max_completion_tokens", maxCompl: 50, field: "max_completion_tokens"},
		{name: "json no cap", field: "max_completion_tokens"},
		{name: "json max_tokens over max", maxTok: 5000, field: "max_tokens"},
		{name: "stream include_usage", maxCompl: 30, stream: true, includeUsage: true, field: "max_completion_tokens"},
		{name: "stream without include_usage", stream: true, field: "max_completion_tokens"},
		{name: "json after the streams", maxTok: 10, field: "max_tokens"},
	}
	// The minute's window must hold every step.
	waitForWindow(time.Minute, 10*time.Second)
	var spent int64 // the usage of the answers so far
	for i, s := range steps {
		params := openai.ChatCompletionNewParams{Model: "gpt-test", Messages: testMessages}
		if s.maxCompl > 0 {
			params.MaxCompletionTokens = openai.Int(s.maxCompl)
		}
		if s.maxTok > 0 {
			params.MaxTokens = openai.Int(s.maxTok)
		}
		var resp *http.Response
		opts := []option.RequestOption{option.WithResponseInto(&resp), option.WithHeader("X-Request-Id", s.name)}
		var usage openai.CompletionUsage
		var sawUsage bool
		if !s.stream {
			c, err := client.Chat.Completions.New(ctx, params, opts...)
			if err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
			usage, sawUsage = c.Usage, c.JSON.Usage.Valid()
		} else {
			if s.includeUsage {
				params.StreamOptions.IncludeUsage = openai.Bool(true)
			}
			stream := client.Chat.Completions.NewStreaming(ctx, params, opts...)
			var acc openai.ChatCompletionAccumulator
			var last openai.ChatCompletionChunk
			for stream.Next() {
				last = stream.Current()
				acc.AddChunk(last)
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
			if len(acc.Choices) != 1 || acc.Choices[0].Message.Content == "" {
				t.Errorf("%s: accumulated %s", s.name, acc.RawJSON())
			}
			usage, sawUsage = last.Usage, last.JSON.Usage.Valid()
			if sawUsage && len(last.Choices) != 0 {
				t.Errorf("%s: the usage chunk has choices: %s", s.name, last.RawJSON())
			}
		}
		rec := up.record(s.name)
		// What the reservation is, by the configuration.
		output := int64(1024)
		if s.maxCompl > 0 {
			output = s.maxCompl
		} else if s.maxTok > 0 {
			output = s.maxTok
		}
		output = min(output, 4096)
		reserved := output + bodies.size(s.name)
		// Enforce: the upstream was told the output reserved and, for a
		// stream, to send its usage.
		seen := map[string]*int64{"max_completion_tokens": rec.MaxCompletionTokens, "max_tokens": rec.MaxTokens}[s.field]
		if seen == nil || *seen != output {
			t.Errorf("%s: the upstream saw max_completion_tokens %v, max_tokens %v; want %s %d (enforce)", s.name, deref(rec.MaxCompletionTokens), deref(rec.MaxTokens), s.field, output)
		}
		if s.stream && !rec.IncludeUsage {
			t.Errorf("%s: the upstream was not asked for the stream's usage (enforce)", s.name)
		}
		switch {
		case s.includeUsage && !sawUsage, !s.stream && !sawUsage:
			t.Errorf("%s: the answer has no usage", s.name)
		case sawUsage && (usage.PromptTokens != rec.PromptTokens || usage.CompletionTokens != rec.CompletionTokens):
			t.Errorf("%s: the client read usage %s, the upstream sent %+v", s.name, usage.RawJSON(), rec.chatUsage)
		case s.stream && !s.includeUsage:
			// The proxy asked for the usage; the client did not.
			t.Logf("%s: the client read a usage chunk it did not ask for: %v", s.name, sawUsage)
		}
		if rec.CompletionTokens > output || rec.PromptTokens+rec.CompletionTokens > reserved {
			t.Errorf("%s: usage %+v above the reservation %d (output %d)", s.name, rec.chatUsage, reserved, output)
		}

		h := resp.Header
		want := map[string]int64{
			"X-Ratelimit-Limit-Tokens":       limit,
			"X-Ratelimit-Remaining-Tokens":   limit - spent - reserved,
			"X-Ratelimit-Limit-Requests":     requests,
			"X-Ratelimit-Remaining-Requests": requests - int64(i) - 1,
		}
		for name, w := range want {
			if got := headerInt(t, h, name); got != w {
				t.Errorf("%s: %s %d, want %d (limit %d, spent before %d, reserved %d)", s.name, name, got, w, limit, spent, reserved)
			}
		}
		checkReset(t, s.name, h, "X-Ratelimit-Reset-Tokens", time.Minute)
		checkReset(t, s.name, h, "X-Ratelimit-Reset-Requests", time.Minute)
		if h.Get("RateLimit") == "" || h.Get("RateLimit-Policy") == "" {
			t.Errorf("%s: no RateLimit or RateLimit-Policy: %v", s.name, h)
		}
		t.Logf("%s: reserved %d (output %d + body %d), spent %d (prompt %d, completion %d); remaining tokens %s, requests %s; RateLimit %q; RateLimit-Policy %q",
			s.name, reserved, output, reserved-output, rec.TotalTokens, rec.PromptTokens, rec.CompletionTokens,
			h.Get("X-Ratelimit-Remaining-Tokens"), h.Get("X-Ratelimit-Remaining-Requests"), h.Get("RateLimit"), h.Get("RateLimit-Policy"))
		spent += rec.PromptTokens + rec.CompletionTokens
		// The proxy settles when the response has ended, after the client
		// may have read it; it counts the request once settled.
		waitAllowed(t, p, "chat", i+1)
	}
}

// waitAllowed waits until the proxy has counted n requests allowed on
// route: it counts a request when its handler returns, after the
// settlement of its tokens.
func waitAllowed(t *testing.T, p *proc, route string, n int) {
	t.Helper()
	series := fmt.Sprintf(`sluice_proxy_requests_total{result="allowed",route=%q} %d`, route, n)
	poll(t, series, func() bool {
		_, _, metrics := fetch(t, "GET", "http://"+p.addrs["admin"]+"/metrics")
		return strings.Contains(metrics, series+"\n")
	})
}

// attempt is what an SDK middleware saw of one attempt of a request.
type attempt struct {
	id         string
	status     int
	retryAfter string
	answered   time.Time // when the client had the response's headers
}

// attempts records every attempt the SDK makes, retries included.
type attempts struct {
	mu  sync.Mutex
	all []attempt
}

func (a attempt) String() string {
	return fmt.Sprintf("%d (Retry-After %q) at %s", a.status, a.retryAfter, a.answered.Format("15:04:05.000"))
}

func (a *attempts) middleware(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
	resp, err := next(req)
	at := attempt{id: req.Header.Get("X-Request-Id"), answered: time.Now()}
	if resp != nil {
		at.status, at.retryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
	}
	a.mu.Lock()
	a.all = append(a.all, at)
	a.mu.Unlock()
	return resp, err
}

func (a *attempts) of(id string) []attempt {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []attempt
	for _, at := range a.all {
		if at.id == id {
			out = append(out, at)
		}
	}
	return out
}

// TestTokensE2ERetry: with 2 requests per 2-second window, a burst is
// denied 429 with Retry-After; the SDK without retries returns an
// *openai.Error of 429, and with retries waits Retry-After (as the
// upstream's record of the retry's arrival shows) and succeeds.
func TestTokensE2ERetry(t *testing.T) {
	beside(t)
	const window = 2 * time.Second
	up := startOpenAIUpstream(t, "--completion-tokens", "20")
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, file, tokenRulesWith(2, "second, unit_multiplier: 2", 100000, "minute"))
	p := startProxy(t, "--config", file, "--upstream", "http://"+up.addr)
	var seen attempts
	base := "http://" + p.addrs["proxy"]
	noRetry := sdkClient(base, option.WithAPIKey("sk-bob"), option.WithMiddleware(seen.middleware))
	retry := sdkClient(base, option.WithAPIKey("sk-bob"), option.WithMiddleware(seen.middleware), option.WithMaxRetries(2))
	params := openai.ChatCompletionNewParams{Model: "gpt-test", Messages: testMessages, MaxCompletionTokens: openai.Int(20)}
	ctx := context.Background()

	// The burst and the first attempt of the retried request in one
	// window: 2 admitted, the rest denied until it ends.
	for round := 0; ; round++ {
		start := waitForWindow(window, window-100*time.Millisecond)
		var codes []int
		for i := range 3 {
			id := fmt.Sprintf("burst %d.%d", round, i)
			_, err := noRetry.Chat.Completions.New(ctx, params, option.WithHeader("X-Request-Id", id))
			var apiErr *openai.Error
			switch {
			case err == nil:
				codes = append(codes, 200)
			case errors.As(err, &apiErr):
				codes = append(codes, apiErr.StatusCode)
				if apiErr.StatusCode == 429 && (apiErr.Response.Header.Get("Retry-After") == "" || apiErr.Response.Header.Get("X-Ratelimit-Remaining-Requests") != "0") {
					t.Errorf("%s: 429 without Retry-After or with requests remaining: %v", id, apiErr.Response.Header)
				}
			default:
				t.Fatalf("%s: %v", id, err)
			}
		}
		id := fmt.Sprintf("retried %d", round)
		c, err := retry.Chat.Completions.New(ctx, params, option.WithHeader("X-Request-Id", id))
		if err != nil {
			t.Fatalf("%s, with 2 retries: %v", id, err)
		}
		if c.Usage.CompletionTokens != 20 {
			t.Errorf("%s: usage %s", id, c.Usage.RawJSON())
		}
		tries := seen.of(id)
		if fmt.Sprint(codes) != "[200 200 429]" || len(tries) == 1 {
			// The window ended during the burst, or before the retried
			// request: again, in the next.
			if crossed := !time.Now().Truncate(window).Equal(start); crossed && round < 3 {
				t.Logf("round %d: the burst %v, then %d attempts: the window ended in between; again", round, codes, len(tries))
				continue
			}
			t.Fatalf("round %d: the burst %v, then %d attempts, all in the window of %s", round, codes, len(tries), start.Format(time.TimeOnly))
		}
		// The first attempt denied with Retry-After, the retry after it
		// admitted; the upstream saw the retry only, no earlier than
		// Retry-After after the denial.
		if len(tries) != 2 || tries[0].status != 429 || tries[1].status != 200 {
			t.Fatalf("%s: attempts %v, want a 429 then, after its Retry-After, a 200", id, tries)
		}
		arrived := up.record(id).Arrived
		prev := tries[0]
		secs, err := strconv.Atoi(prev.retryAfter)
		if err != nil || secs < 1 {
			t.Fatalf("%s: Retry-After %q", id, prev.retryAfter)
		}
		if waited := arrived.Sub(prev.answered); waited < time.Duration(secs)*time.Second {
			t.Errorf("%s: the retry arrived %s after the 429, before its Retry-After %ds", id, waited, secs)
		} else {
			t.Logf("%s: %d attempts; the retry arrived %s after a 429 with Retry-After %d", id, len(tries), waited, secs)
		}
		break
	}
	// The upstream saw none of the denied attempts.
	admitted := 0
	seen.mu.Lock()
	for _, at := range seen.all {
		if at.status == 200 {
			admitted++
		}
	}
	seen.mu.Unlock()
	if n := len(up.records()); n != admitted {
		t.Errorf("the upstream answered %d requests, the proxy admitted %d", n, admitted)
	}
}
