package proxy_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/edges/proxy"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
)

// timeoutRoutes: one request in flight per API key on "/", a permit of a
// TTL shorter than the write idle timeout below (so that the permit of a
// stalled request is renewed until the abort), and a token budget on
// the chat route.
const timeoutRoutes = `domain: api
http:
  routes:
    - pattern: "/"
      name: api
      descriptors: [[{key: api_key, api_key: Authorization}]]
    - pattern: "POST /v1/chat/completions"
      name: chat
      descriptors: [[{key: api_key, api_key: Authorization}]]
      tokens:
        descriptor: [{key: tokens, api_key: Authorization}]
        reserve: {default: 500}
descriptors:
  - key: api_key
    concurrency: {max: 1, ttl: 1s}
  - key: tokens
    rate_limit: {unit: hour, requests_per_unit: 100000}
`

// writeIdle is the write idle timeout of these tests: long beside the
// TTL (1 s, renewed every third of it), short beside wait.
const writeIdle = 1500 * time.Millisecond

// startTimeouts starts a proxy of timeoutRoutes in front of up, with
// the timeouts of edit.
func startTimeouts(t *testing.T, up *upstream, edit func(*proxy.Config)) *fixture {
	t.Helper()
	store := memstore.New(memstore.Config{})
	t.Cleanup(func() { store.Close() })
	return startEdited(t, timeoutRoutes, up, store, nil, edit)
}

// endless is an upstream handler that writes its answer (32 KB a write,
// flushed) until a write fails: until the proxy gives up its request.
// ended is told when it has.
func endless(ended chan<- string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		defer func() { ended <- r.URL.Path }()
		chunk := []byte(strings.Repeat("x", 32<<10))
		for {
			if _, err := w.Write(chunk); err != nil {
				return
			}
			if http.NewResponseController(w).Flush() != nil {
				return
			}
		}
	}
}

// stallingClient is a client that stops reading: it connects with a
// small receive buffer, sends request, reads the first bytes of the
// answer and then nothing, as bin/slow of the attack does.
func stallingClient(t *testing.T, addr, request string) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, wait)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.(*net.TCPConn).SetReadBuffer(4096)
	if _, err := io.WriteString(conn, request); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(wait))
	first := make([]byte, 200)
	if _, err := io.ReadFull(conn, first); err != nil {
		t.Fatalf("the first bytes of the answer: %v", err)
	}
	if !strings.HasPrefix(string(first), "HTTP/1.1 ") {
		t.Fatalf("the answer begins %q", first)
	}
	return conn
}

// waitEnded waits until the upstream's handler of path has returned.
func waitEnded(t *testing.T, ended <-chan string, path string) {
	t.Helper()
	select {
	case p := <-ended:
		if p != path {
			t.Fatalf("the upstream's handler of %s ended, want %s's", p, path)
		}
	case <-time.After(wait):
		t.Fatalf("the upstream's handler of %s still runs after %v: its request was not cancelled", path, wait)
	}
}

// waitClosed waits until the server has closed conn. (The client cannot
// tell soon: once its small receive window has been shut for a while,
// the server's kernel probes it at long intervals.)
func (f *fixture) waitClosed(conn net.Conn) {
	f.t.Helper()
	deadline := time.Now().Add(wait)
	for {
		if _, ok := f.closed.Load(conn.LocalAddr().String()); ok {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the stalled client's connection still open after %v", wait)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestWriteIdleTimeoutReleasesPermit: a client that stops reading a large
// answer (the attack's bin/slow: 3 such clients held 3 of 3 permits for
// as long as they liked, renewed, newcomers refused) is let go once a
// write to it has made no progress for the write idle timeout, not
// before: its upstream request is cancelled, its permit released and the
// next request of its key admitted; the abort is logged once and counted
// (timeout="write_idle"), and the result stays the middleware's.
func TestWriteIdleTimeoutReleasesPermit(t *testing.T) {
	ended := make(chan string, 4)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			endless(ended)(w, r)
			return
		}
		io.WriteString(w, "ok")
	})
	f := startTimeouts(t, up, func(c *proxy.Config) { c.WriteIdleTimeout = writeIdle })
	route := []string{"route", "api"}

	sent := time.Now()
	conn := stallingClient(t, f.srv.Listener.Addr().String(), "GET /big HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer a\r\n\r\n")
	if resp, _ := f.get("/next", "Authorization: Bearer a"); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a second request of the key while the first runs: %d, want 429", resp.StatusCode)
	}
	f.waitMetric(0, "sluice_permits_held", route...)
	if took := time.Since(sent); took < writeIdle {
		t.Errorf("the permit released %v after the request, before the write idle timeout %v", took, writeIdle)
	}
	waitEnded(t, ended, "/big")
	f.waitClosed(conn)
	if resp, body := f.get("/next", "Authorization: Bearer a"); resp.StatusCode != http.StatusOK || body != "ok" {
		t.Errorf("the next request of the key: %d %q, want 200 ok", resp.StatusCode, body)
	}
	f.waitMetric(1, "sluice_proxy_timeouts_total", "route", "api", "timeout", "write_idle")
	if n := f.metric("sluice_permits_lost_total", route...); n != 0 {
		t.Errorf("%v permits lost: the stalled request's was renewed until the abort, want 0", n)
	}
	if r := f.metric("sluice_permits_renewed_total", route...); r == 0 {
		t.Errorf("no renewal: the stall (%v) outlasts the TTL and its permit must be renewed until the abort", writeIdle)
	}
	f.waitMetric(2, "sluice_proxy_requests_total", "route", "api", "result", "allowed")
	if n := strings.Count(f.logs.String(), "read nothing of the answer"); n != 1 {
		t.Errorf("%d log lines of the abort, want 1:\n%s", n, f.logs.String())
	}
	if n := f.metric("sluice_proxy_upstream_errors_total", route...); n != 0 {
		t.Errorf("the stalled client counted as %v upstream errors, want 0", n)
	}
}

// TestWriteIdleTimeoutSettlesTokens: a stalled client of a token
// budget's route is let go as any other, and its reservation settled
// whole (the stream, cut off, gave no usage): the abort does not skip the
// settlement.
func TestWriteIdleTimeoutSettlesTokens(t *testing.T) {
	ended := make(chan string, 4)
	up := newUpstream(t, endless(ended))
	f := startTimeouts(t, up, func(c *proxy.Config) { c.WriteIdleTimeout = writeIdle })
	stallingClient(t, f.srv.Listener.Addr().String(), "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\nContent-Length: 0\r\n\r\n")
	f.waitMetric(1, "sluice_proxy_timeouts_total", "route", "chat", "timeout", "write_idle")
	waitEnded(t, ended, "/v1/chat/completions")
	f.waitMetric(0, "sluice_permits_held", "route", "chat")
	if r, s := f.metric("sluice_proxy_tokens_total", "route", "chat", "kind", "reserved"), f.metric("sluice_proxy_tokens_total", "route", "chat", "kind", "spent"); r != 500 || s != 500 {
		t.Errorf("the stalled stream: tokens reserved %v, spent %v; want 500 and 500 (cut off: the whole reservation)", r, s)
	}
}

// TestWriteIdleTimeoutSparesFlowingStreams: answers whose client reads
// them are never cut, however long they last: server-sent events with a
// pause of twice the write idle timeout, and 8 MB read slowly but
// steadily for longer than the timeout. Nothing is counted as a timeout.
func TestWriteIdleTimeoutSparesFlowingStreams(t *testing.T) {
	const size = 8 << 20
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/events":
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 10 {
				fmt.Fprintf(w, "data: %d\n\n", i)
				http.NewResponseController(w).Flush()
				pause := 50 * time.Millisecond
				if i == 4 {
					pause = 2 * writeIdle
				}
				time.Sleep(pause)
			}
		case "/big":
			w.Header().Set("Content-Length", fmt.Sprint(size))
			w.Write([]byte(strings.Repeat("y", size)))
		}
	})
	f := startTimeouts(t, up, func(c *proxy.Config) { c.WriteIdleTimeout = writeIdle })

	client := &http.Client{Timeout: 2 * wait}
	resp, body := f.do(client, http.MethodGet, "/events", "Authorization: Bearer e")
	if resp.StatusCode != http.StatusOK || strings.Count(body, "data: ") != 10 {
		t.Errorf("events with a pause of %v: %d, %d events of 10: %q", 2*writeIdle, resp.StatusCode, strings.Count(body, "data: "), body)
	}

	req, _ := http.NewRequest(http.MethodGet, f.srv.URL+"/big", nil)
	req.Header.Set("Authorization", "Bearer s")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	start, n, buf := time.Now(), 0, make([]byte, 64<<10)
	for {
		m, err := io.ReadFull(resp.Body, buf)
		n += m
		if err != nil {
			break
		}
		time.Sleep(20 * time.Millisecond) // 3.2 MB/s at most: 2.5 s
	}
	if took := time.Since(start); n != size || took < writeIdle {
		t.Errorf("a slow steady reader read %d bytes of %d in %v (want all, over more than %v)", n, size, took, writeIdle)
	}
	f.waitMetric(0, "sluice_permits_held", "route", "api")
	if n := f.metric("sluice_proxy_timeouts_total", "route", "api", "timeout", "write_idle"); n != 0 {
		t.Errorf("%v write idle timeouts, want 0", n)
	}
}

// TestWriteIdleTimeoutUpgrade: an upgraded connection (WebSocket) whose
// client stops reading while the upstream sends is let go, and its
// permit released; one that is quiet for longer than the timeout (nothing
// to send) is not cut.
func TestWriteIdleTimeoutUpgrade(t *testing.T) {
	ended := make(chan string, 4)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		defer func() { ended <- r.URL.Path }()
		io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: sluice-test\r\nConnection: Upgrade\r\n\r\n")
		if r.URL.Path == "/ws/quiet" {
			time.Sleep(2 * writeIdle)
			io.WriteString(conn, "late\n")
			io.Copy(io.Discard, brw) // until the client closes
			return
		}
		chunk := []byte(strings.Repeat("w", 32<<10))
		for {
			if _, err := conn.Write(chunk); err != nil {
				return
			}
		}
	})
	f := startTimeouts(t, up, func(c *proxy.Config) { c.WriteIdleTimeout = writeIdle })
	const upgrade = "GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: sluice-test\r\n\r\n"
	addr := f.srv.Listener.Addr().String()

	// Quiet for twice the timeout, then a line: not cut.
	conn, err := net.DialTimeout("tcp", addr, wait)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, upgrade, "/ws/quiet", "q")
	conn.SetReadDeadline(time.Now().Add(wait))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("the upgrade: %v %v", resp, err)
	}
	if line, err := br.ReadString('\n'); line != "late\n" {
		t.Errorf("after a quiet %v: %q %v, want the upstream's late line", 2*writeIdle, line, err)
	}
	conn.Close()
	waitEnded(t, ended, "/ws/quiet")
	f.waitMetric(0, "sluice_permits_held", "route", "api")

	// Stalled: let go (the proxy closes a hijacked connection itself, so
	// the server sees no close of it).
	stallingClient(t, addr, fmt.Sprintf(upgrade, "/ws/stall", "w"))
	f.waitMetric(0, "sluice_permits_held", "route", "api")
	waitEnded(t, ended, "/ws/stall")
	f.waitMetric(1, "sluice_proxy_timeouts_total", "route", "api", "timeout", "write_idle")
}

// TestUpstreamTimeout: an upstream that sends no response headers within
// the upstream timeout is answered 504 (problem+json), not before it,
// and its request cancelled, its permit released, logged and counted
// (timeout="upstream", an upstream error); on a token budget's route the
// reservation is charged whole (the upstream may have spent it). Headers
// in time and a body slower than the timeout pass.
func TestUpstreamTimeout(t *testing.T) {
	const timeout = 500 * time.Millisecond
	ended := make(chan string, 4)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow-body" {
			w.WriteHeader(http.StatusOK)
			http.NewResponseController(w).Flush()
			time.Sleep(3 * timeout)
			io.WriteString(w, "late body")
			return
		}
		defer func() { ended <- r.URL.Path }()
		<-r.Context().Done() // never answers
	})
	f := startTimeouts(t, up, func(c *proxy.Config) { c.UpstreamTimeout = timeout })
	client := &http.Client{Timeout: wait}

	for _, c := range []struct{ route, method, path string }{
		{"api", http.MethodGet, "/hang"},
		{"chat", http.MethodPost, "/v1/chat/completions"},
	} {
		start := time.Now()
		resp, body := f.do(client, c.method, c.path, "Authorization: Bearer u")
		took := time.Since(start)
		var problem struct{ Type string }
		json.Unmarshal([]byte(body), &problem)
		if resp.StatusCode != http.StatusGatewayTimeout || problem.Type != proxy.ProblemGatewayTimeout {
			t.Errorf("%s: %d %q, want 504 %s", c.path, resp.StatusCode, body, proxy.ProblemGatewayTimeout)
		}
		if took < timeout {
			t.Errorf("%s: answered after %v, before the upstream timeout %v", c.path, took, timeout)
		}
		waitEnded(t, ended, c.path)
		f.waitMetric(0, "sluice_permits_held", "route", c.route)
		f.waitMetric(1, "sluice_proxy_timeouts_total", "route", c.route, "timeout", "upstream")
		if n := f.metric("sluice_proxy_upstream_errors_total", "route", c.route); n != 1 {
			t.Errorf("%s: %v upstream errors, want 1", c.path, n)
		}
	}
	if r, s := f.metric("sluice_proxy_tokens_total", "route", "chat", "kind", "reserved"), f.metric("sluice_proxy_tokens_total", "route", "chat", "kind", "spent"); r == 0 || s != r {
		t.Errorf("the chat timed out: tokens reserved %v, spent %v; want the whole reservation spent", r, s)
	}
	if !strings.Contains(f.logs.String(), "upstream timeout") {
		t.Errorf("no log line of the upstream timeout:\n%s", f.logs.String())
	}
	if resp, body := f.do(client, http.MethodGet, "/slow-body", "Authorization: Bearer b"); resp.StatusCode != http.StatusOK || body != "late body" {
		t.Errorf("headers at once, the body after %v: %d %q, want 200 and the body", 3*timeout, resp.StatusCode, body)
	}
}

// TestTimeoutsConfig: negative timeouts are refused, and an upstream
// timeout with a Transport of the caller's (which has its own).
func TestTimeoutsConfig(t *testing.T) {
	u, _ := url.Parse("http://127.0.0.1:1")
	store := memstore.New(memstore.Config{})
	defer store.Close()
	dec := mustDecider(sluice.NewLimiter(store), rulestest.Config(t, perIP))
	for _, c := range []proxy.Config{
		{WriteIdleTimeout: -time.Second},
		{UpstreamTimeout: -time.Second},
		{UpstreamTimeout: time.Second, Transport: http.DefaultTransport},
	} {
		c.Upstream, c.Decider, c.Domain = u, dec, "api"
		if _, err := proxy.New(c); !errors.Is(err, proxy.ErrConfig) {
			t.Errorf("write idle %v, upstream %v, transport %v: %v, want ErrConfig", c.WriteIdleTimeout, c.UpstreamTimeout, c.Transport != nil, err)
		}
	}
}
