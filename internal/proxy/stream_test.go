package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// everyWriter has a route for each way the middleware may wrap the
// ResponseWriter between the proxy's own writer and ReverseProxy: none
// (plain, concurrency, shaping), the token budget's, the failure limits';
// and the requests no route matches, which skip the middleware.
const everyWriter = `domain: api
http:
  routes:
    - pattern: "POST /plain"
      name: plain
      descriptors: [[{key: api_key, api_key: Authorization}]]
    - pattern: "POST /tokens"
      name: tokens
      descriptors: [[{key: api_key, api_key: Authorization}]]
      tokens:
        descriptor: [{key: api_key_tokens, api_key: Authorization}]
        reserve: {default: 100}
    - pattern: "POST /failures"
      name: failures
      descriptors: [[{key: api_key, api_key: Authorization}]]
      failures: {statuses: [500], descriptors: [[{key: failed, api_key: Authorization}]]}
    - pattern: "POST /concurrency"
      name: concurrency
      descriptors: [[{key: api_key, api_key: Authorization}]]
      concurrency: {max: 10}
    - pattern: "POST /shaping"
      name: shaping
      descriptors: [[{key: api_key, api_key: Authorization}]]
      shaping: {max_delay: 1s}
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: sliding_log}
  - key: api_key_tokens
    rate_limit: {unit: hour, requests_per_unit: 1000000, algorithm: sliding_log}
  - key: failed
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: sliding_log}
`

// gatedEvents is an upstream that streams n server-sent events and sends
// each after the first only once the client has said it received the one
// before (release), so that a response held back anywhere between the two
// shows as an event the client did not get while the upstream waited. The
// last event carries a usage, for the token budget.
type gatedEvents struct {
	n int

	mu    sync.Mutex
	gates map[string]chan int // by X-Stream
	held  []string            // streams whose client did not get an event in time
}

func (g *gatedEvents) gate(id string) chan int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gates == nil {
		g.gates = map[string]chan int{}
	}
	if g.gates[id] == nil {
		g.gates[id] = make(chan int, g.n)
	}
	return g.gates[id]
}

// release tells the upstream of stream id that its client has event i.
func (g *gatedEvents) release(id string, i int) { g.gate(id) <- i }

func (g *gatedEvents) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("X-Stream")
	gate := g.gate(id)
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	waiting := true
	for i := 1; i <= g.n; i++ {
		if i == g.n {
			fmt.Fprintf(w, "data: {\"n\":%d,\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":%d}}\n\n", i, g.n)
		} else {
			fmt.Fprintf(w, "data: {\"n\":%d}\n\n", i)
		}
		if err := rc.Flush(); err != nil {
			return
		}
		if i == g.n || !waiting {
			continue
		}
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		case <-time.After(wait):
			// The client did not get event i: it was held back. Send
			// the rest at once, so that the test ends.
			g.mu.Lock()
			g.held = append(g.held, fmt.Sprintf("%s: event %d", id, i))
			g.mu.Unlock()
			waiting = false
		}
	}
}

// readEvents reads the events of resp's body, releasing each as it comes,
// and returns their data lines.
func readEvents(g *gatedEvents, id string, body io.Reader) ([]string, error) {
	var got []string
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			got = append(got, data)
			g.release(id, len(got))
		}
	}
	return got, sc.Err()
}

// Every event of a stream reaches the client before the upstream sends the
// next, through every writer a route may put between the two: a flush that
// a writer drops holds the stream back until it ends. The upstream sends
// event i+1 only once the client has event i; a client that did not get it
// in time is reported. Before, a route with a token budget dropped every
// flush (its writer looked for http.Flusher on the proxy's writer, which
// only unwraps) and its clients got the stream all at once, at its end.
func TestStreamingThroughEveryWriter(t *testing.T) {
	g := &gatedEvents{n: 5}
	up := newUpstream(t, g.ServeHTTP)
	f := start(t, everyWriter, up)
	for _, path := range []string{"/plain", "/tokens", "/failures", "/concurrency", "/shaping", "/unmatched"} {
		t.Run(path[1:], func(t *testing.T) {
			t.Parallel()
			req, _ := http.NewRequest(http.MethodPost, f.srv.URL+path, strings.NewReader(`{"stream":true}`))
			req.Header.Set("Authorization", "Bearer k")
			req.Header.Set("X-Stream", path)
			resp, err := f.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
			got, err := readEvents(g, path, resp.Body)
			if err != nil || len(got) != g.n {
				t.Fatalf("%d events of %d, %v", len(got), g.n, err)
			}
		})
	}
	t.Cleanup(func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		for _, h := range g.held {
			t.Errorf("held back: %s did not reach the client within %v while the upstream waited", h, wait)
		}
	})
}
