package main

// The bound of token budgets, end to end: two sluice proxy processes
// sharing one redis-server, 64 clients streaming at once through them to
// one sluice nullapi --openai that takes its time, and the upstream's own
// record of what every admitted request spent.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

// sent is what a client knows of one request it sent.
type sent struct {
	id       string
	at       time.Time // before it was sent: no later than its admission
	status   int
	body     int64 // the size of the body sent
	output   int64 // the output it asked for
	complete bool  // a 200 whose stream ended with [DONE]
}

// TestTokensE2EBound: in each window of the token limit, the tokens spent
// by the requests admitted in it are at most the limit plus the
// under-reservations of the requests in flight when its last request was
// admitted; with enforce and prompt: bytes there are none, and the bound is
// the limit. The limit is reached (requests are denied) in every window.
func TestTokensE2EBound(t *testing.T) {
	beside(t)
	const (
		limit   = 20000
		window  = 5 * time.Second
		clients = 64
		windows = 2
		// Requests are sent from opening to closing into each window,
		// so that one admitted near an end is not taken for another
		// window's by the clocks of the client and the upstream.
		opening, closing = 200 * time.Millisecond, window - 1500*time.Millisecond
	)
	srv := redistest.Standalone(t)
	up := startOpenAIUpstream(t, "--completion-tokens", "1000", "--delay", "300ms")
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, file, tokenRulesWith(1000000, "minute", limit, "second, unit_multiplier: 5"))
	prefix := fmt.Sprintf("%s:%d:", t.Name(), time.Now().UnixNano())
	var proxies []string
	for range 2 {
		p := startProxy(t, "--config", file, "--upstream", "http://"+up.addr, "--store", "redis", "--redis-url", srv.URL(), "--redis-prefix", prefix)
		proxies = append(proxies, "http://"+p.addrs["proxy"]+"/v1/chat/completions")
	}
	httpc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	defer httpc.CloseIdleConnections()

	first := waitForWindow(window, window-opening)
	if d := time.Until(first.Add(opening)); d > 0 {
		time.Sleep(d)
	}
	var (
		mu   sync.Mutex
		all  []sent
		wg   sync.WaitGroup
		errs = make(chan error, clients)
	)
	for c := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), uint64(first.UnixNano())))
			for n := 0; ; n++ {
				now := time.Now()
				w := now.Sub(first) / window
				if w >= windows {
					return
				}
				start := first.Add(w * window)
				if now.Sub(start) >= closing {
					time.Sleep(time.Until(start.Add(window + opening)))
					continue
				}
				s, err := streamOnce(httpc, proxies[c%len(proxies)], fmt.Sprintf("c%d-%d", c, n), rng)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				all = append(all, s)
				mu.Unlock()
				if s.status != 200 {
					time.Sleep(time.Duration(150+rng.IntN(150)) * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// What the upstream recorded of every admitted request.
	type admitted struct {
		sent
		rec      answerRecord
		reserved int64
		windows  []int64 // the window it was admitted in; two when unsure
	}
	var adm []admitted
	denied := map[int64]int{}
	for _, s := range all {
		switch s.status {
		case 200:
		case 429:
			denied[s.at.Sub(first).Milliseconds()/window.Milliseconds()]++
			continue
		default:
			t.Fatalf("%s: status %d", s.id, s.status)
		}
		if !s.complete {
			t.Errorf("%s: the stream did not end with [DONE]", s.id)
		}
		a := admitted{sent: s, rec: up.record(s.id)}
		a.reserved = min(s.output, 4096) + s.body
		// Admitted after it was sent and before it arrived upstream.
		ws, wa := s.at.Sub(first)/window, a.rec.Arrived.Sub(first)/window
		a.windows = []int64{int64(ws)}
		if wa != ws {
			a.windows = append(a.windows, int64(wa))
			t.Logf("%s: sent in window %d, arrived upstream in %d: counted in both", s.id, ws, wa)
		}
		adm = append(adm, a)
	}
	if n := len(up.records()); n != len(adm) {
		t.Errorf("the upstream answered %d requests, the proxies admitted %d", n, len(adm))
	}
	for w := range int64(windows) {
		var in []admitted
		for _, a := range adm {
			if slices.Contains(a.windows, w) {
				in = append(in, a)
			}
		}
		var spent, lastSent, lastArrived int64
		for _, a := range in {
			spent += a.rec.TotalTokens
			lastSent = max(lastSent, a.at.UnixNano())
			lastArrived = max(lastArrived, a.rec.Arrived.UnixNano())
		}
		// In flight when the last was admitted (some time between its
		// sending and its arrival): sent before then, and not ended.
		bound, inFlight := int64(limit), 0
		for _, a := range adm {
			if a.at.UnixNano() <= lastArrived && a.rec.Ended.UnixNano() > lastSent {
				inFlight++
				bound += max(a.rec.TotalTokens-a.reserved, 0)
			}
		}
		t.Logf("window %d: %d admitted, %d denied; %d tokens spent, bound %d (limit %d, %d in flight at the last admission)",
			w, len(in), denied[w], spent, bound, limit, inFlight)
		if spent > bound {
			t.Errorf("window %d: %d tokens spent by the requests admitted in it, above the bound %d", w, spent, bound)
		}
		if denied[w] == 0 {
			t.Errorf("window %d: no request denied: the limit was not reached", w)
		}
	}
	// With enforce and prompt: bytes, no request spends more than it
	// reserved: the bound is the limit.
	for _, a := range adm {
		if a.rec.TotalTokens > a.reserved {
			t.Errorf("%s: spent %d, reserved %d", a.id, a.rec.TotalTokens, a.reserved)
		}
	}
}

// streamOnce sends one streaming chat completion, asking for between 300
// and 900 tokens, with a prompt of 20 to 200 bytes, and reads the answer
// to its end.
func streamOnce(c *http.Client, url, id string, rng *rand.Rand) (sent, error) {
	s := sent{id: id, output: int64(300 + rng.IntN(601))}
	body := fmt.Sprintf(`{"model":"gpt-test","stream":true,"max_completion_tokens":%d,"messages":[{"role":"user","content":%q}]}`,
		s.output, strings.Repeat("word ", 4+rng.IntN(37)))
	s.body = int64(len(body))
	// A stream of up to 900 tokens through a -race proxy, one of 64 at
	// once: in a full suite run one took longer than e2eWait (15 s). How
	// long a stream takes does not change the bound, which is counted by
	// admission time; a stream that never ends still fails the test.
	ctx, cancel := context.WithTimeout(context.Background(), 4*e2eWait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
	if err != nil {
		return s, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-shared")
	req.Header.Set("X-Request-Id", id)
	s.at = time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return s, fmt.Errorf("%s: %v", id, err)
	}
	defer resp.Body.Close()
	s.status = resp.StatusCode
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		return s, fmt.Errorf("%s: reading the answer: %v", id, err)
	}
	s.complete = bytes.HasSuffix(got, []byte("data: [DONE]\n\n"))
	return s, nil
}
