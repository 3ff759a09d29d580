package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/edges/httpconf"
	"github.com/sluicehq/sluice/internal/edges/proxy"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
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

// lateTail is a request body whose read after its end (the transport
// reads once more after the Content-Length, to check that nothing
// follows) waits for after, as when the transport's writing goroutine is
// descheduled on a busy machine; read is closed once that read returned.
type lateTail struct {
	io.ReadCloser
	after <-chan struct{}
	read  chan<- struct{}
	ended bool
	late  sync.Once
}

func (b *lateTail) Read(p []byte) (n int, err error) {
	if !b.ended {
		n, err = b.ReadCloser.Read(p)
		b.ended = err == io.EOF
		return n, err
	}
	first := false
	b.late.Do(func() {
		first = true
		select {
		case <-b.after:
		case <-time.After(wait):
		}
	})
	n, err = b.ReadCloser.Read(p)
	if first {
		close(b.read)
	}
	return n, err
}

// lateTails is a transport whose one request's body is a lateTail.
type lateTails struct {
	http.RoundTripper
	after <-chan struct{}
	read  chan<- struct{}
}

func (t lateTails) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		r.Body = &lateTail{ReadCloser: r.Body, after: t.after, read: t.read}
	}
	return t.RoundTripper.RoundTrip(r)
}

// A stream with a request body is not cut when the transport forwarding
// the body reads it once more after the response has begun. Before, the
// server drained and closed the request body when the response's header
// went out (what net/http's HTTP/1 server does unless the handler enables
// full duplex); the transport's last read then failed, and the transport
// closed the connection to the upstream in the middle of the stream:
// "ReverseProxy read error during body copy: use of closed network
// connection", and a client with the first event only. Beside two CPU
// hogs about one stream in a hundred lost that race.
func TestStreamNotCutByTheRequestBody(t *testing.T) {
	g := &gatedEvents{n: 3}
	up := newUpstream(t, g.ServeHTTP)
	src := `domain: api
http:
  routes:
    - pattern: /
      descriptors: [[{key: api_key, api_key: Authorization}]]
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: sliding_log}
`
	section, err := httpconf.Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	store := memstore.New(memstore.Config{})
	t.Cleanup(func() { store.Close() })
	first, read := make(chan struct{}), make(chan struct{})
	u, _ := url.Parse(up.URL)
	p, err := proxy.New(proxy.Config{
		Upstream: u, Decider: mustDecider(sluice.NewLimiter(store), rulestest.Config(t, src)), Domain: "api", HTTP: section,
		Transport: lateTails{RoundTripper: http.DefaultTransport.(*http.Transport).Clone(), after: first, read: read},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(`{"stream":true}`))
	req.Header.Set("Authorization", "Bearer k")
	req.Header.Set("X-Stream", "s")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			got = append(got, data)
			if len(got) == 1 {
				// The response has begun: now the transport's last
				// read of the body, before the stream goes on.
				close(first)
				select {
				case <-read:
				case <-time.After(wait):
					t.Fatal("the transport did not read the body's end")
				}
			}
			g.release("s", len(got))
		}
	}
	if len(got) != g.n || sc.Err() != nil {
		t.Fatalf("the stream was cut: %d events of %d, %v", len(got), g.n, sc.Err())
	}
}

// A request whose body the proxy never forwards (the upstream is down) is
// answered, and its connection serves the next request. This holds as
// long as the server, not the handler, owns the request body: a handler
// serving full duplex (http.ResponseController.EnableFullDuplex) must close
// the body before it returns (ReverseProxy only closes its own wrapper of
// it), or the server reads what is left of it while it reads the next
// request, and panics (golang/go#68560).
func TestBodyUnreadThenKeepAlive(t *testing.T) {
	up := newUpstream(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up.URL = "http://" + ln.Addr().String()
	ln.Close()
	f := start(t, perIP, up)
	conn, err := net.DialTimeout("tcp", f.srv.Listener.Addr().String(), wait)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(wait))
	br := bufio.NewReader(conn)
	body := strings.Repeat("x", 1000)
	for i := range 3 {
		fmt.Fprintf(conn, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d on the connection: %v", i+1, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("request %d: %d, want 502", i+1, resp.StatusCode)
		}
	}
}
