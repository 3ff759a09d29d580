package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

// TestTokensE2ERedisBlip: a settlement that finds Redis silent is not
// lost. A streamed answer reserves 2,000 tokens and spends 206; Redis is
// stopped (SIGSTOP: connections open, nothing answered) before the answer
// ends, so the settlement fails; once Redis answers again, the retry in the
// background refunds what was not spent, exactly once, and the next
// answer's headers show it.
func TestTokensE2ERedisBlip(t *testing.T) {
	beside(t)
	const limit = 100000
	srv := redistest.Standalone(t)
	up := startOpenAIUpstream(t, "--completion-tokens", "200", "--delay", "1500ms")
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, file, tokenRulesWith(1000, "minute", limit, "hour"))
	p := startProxy(t, "--config", file, "--upstream", "http://"+up.addr, "--store", "redis",
		"--redis-url", srv.URL(), "--redis-timeout", "200ms",
		"--redis-prefix", fmt.Sprintf("%s:%d:", t.Name(), time.Now().UnixNano()))
	url := "http://" + p.addrs["proxy"] + "/v1/chat/completions"
	// An hour's window: the test is over long before it ends, unless it
	// starts in its last minute.
	waitForWindow(time.Hour, time.Minute)

	body := `{"model":"m","stream":true,"max_tokens":2000,"messages":[{"role":"user","content":"Say hello."}]}`
	post := func(b string) (*http.Response, error) {
		req, err := http.NewRequest("POST", url, strings.NewReader(b))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer sk-blip")
		req.Header.Set("Content-Type", "application/json")
		return http.DefaultClient.Do(req)
	}
	resp, err := post(body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("the reservation: %d", resp.StatusCode)
	}
	reserved := int64(2000 + len(body))
	if got := headerInt(t, resp.Header, "X-Ratelimit-Remaining-Tokens"); got != limit-reserved {
		t.Fatalf("after reserving %d: remaining %d", reserved, got)
	}
	// The answer takes 1.5 s: stop Redis while it streams, and keep it
	// stopped past its end and the settlement's first attempts.
	srv.Freeze()
	frozen := true
	defer func() {
		if frozen {
			srv.Thaw()
		}
	}()
	streamed, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !bytes.Contains(streamed, []byte(`"usage"`)) {
		t.Fatalf("the stream: %v, %q", err, streamed)
	}
	time.Sleep(time.Second)
	srv.Thaw()
	frozen = false
	// Until the circuit breaker closes again, the failure policy answers
	// (from this node's own count, which never saw the reservation): wait
	// for Redis to answer the proxy again before reading its count.
	breakerClosed := func() bool {
		last := ""
		for line := range strings.SplitSeq(p.log(), "\n") {
			if strings.Contains(line, "redis circuit breaker") {
				last = line
			}
		}
		return last == "" || strings.Contains(last, `"to":"closed"`)
	}
	for wait := time.Now().Add(20 * time.Second); !breakerClosed(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(wait) {
			t.Fatalf("the circuit breaker did not close within 20 s of Redis answering again")
		}
	}

	// The answer spent 6 + 200 (the prompt of "Say hello.": 3 for the
	// message and ⌈10/4⌉ for its text; and the completion); the refund
	// lands once Redis answers.
	const spent = 6 + 200
	small := `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"Say hello."}]}`
	deadline := time.Now().Add(20 * time.Second)
	var seen []int64
	for n := int64(0); ; n++ {
		resp, err := post(small)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 && resp.Header.Get("X-Ratelimit-Remaining-Tokens") != "" {
			got := headerInt(t, resp.Header, "X-Ratelimit-Remaining-Tokens")
			seen = append(seen, got)
			// Each small request spends 7 (6 + 1) of its reservation
			// of 1 + its body, settled before the next.
			want := limit - spent - 7*n - int64(1+len(small))
			if got == want {
				break
			}
			if got > want {
				t.Fatalf("remaining %d, above %d: refunded more than was not spent (seen %v)", got, want, seen)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the refund did not land within 20 s of Redis answering again: remaining seen %v", seen)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("remaining tokens seen after Redis came back: %v", seen)
}
