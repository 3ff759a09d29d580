package main

// End-to-end tests of --write-idle-timeout and --upstream-timeout: the
// attack's bin/slow (clients that read the first bytes of a large answer
// and then nothing) held every permit of a key for as long as it liked,
// renewed past the TTL; an upstream that never answers held a permit
// as long as its client waited.

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// stalledRules: 3 requests in flight per user, a TTL shorter than the
// write idle timeout below, so that a stalled request's permit is
// renewed until the abort.
const stalledRules = `domain: api
http:
  routes:
    - pattern: /
      descriptors: [[{key: user, header: X-User}]]
descriptors:
  - key: user
    concurrency: {max: 3, ttl: 1s}
`

// stalledUpstream answers /big without end (32 KB a write, flushed) until
// a write fails, /events with server-sent events and a pause of pause,
// /hang never, and anything else "ok". ended counts the handlers of /big
// and /hang that have returned: their requests were cancelled.
func stalledUpstream(t *testing.T, pause time.Duration, ended *atomic.Int64) string {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			defer ended.Add(1)
			chunk := []byte(strings.Repeat("x", 32<<10))
			for {
				if _, err := w.Write(chunk); err != nil {
					return
				}
				if http.NewResponseController(w).Flush() != nil {
					return
				}
			}
		case "/events":
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 4 {
				fmt.Fprintf(w, "data: %d\n\n", i)
				http.NewResponseController(w).Flush()
				if i == 1 {
					time.Sleep(pause)
				}
			}
		case "/hang":
			defer ended.Add(1)
			<-r.Context().Done()
		default:
			io.WriteString(w, "ok")
		}
	}))
	t.Cleanup(up.Close)
	return up.URL
}

// stallReading is bin/slow: it connects to addr with a small receive buffer,
// asks for path as user, reads the first 200 bytes of the answer and then
// nothing, until the test ends.
func stallReading(t *testing.T, addr, path, user string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, e2eWait)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.(*net.TCPConn).SetReadBuffer(4096)
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: x\r\nX-User: %s\r\n\r\n", path, user)
	conn.SetReadDeadline(time.Now().Add(e2eWait))
	first := make([]byte, 200)
	if _, err := io.ReadFull(conn, first); err != nil || !strings.HasPrefix(string(first), "HTTP/1.1 200") {
		t.Fatalf("the first bytes of the answer: %q %v", first, err)
	}
}

// TestProxyE2EStalledClients: 3 clients of one user that stop reading a
// large answer hold its 3 permits, renewed past the TTL, and a newcomer
// is refused; once a write to them has made no progress for
// --write-idle-timeout (not before), they are let go: their upstream
// requests cancelled, the permits released (the newcomer admitted), the
// aborts counted and logged. A stream that pauses for longer than the
// timeout is not cut.
func TestProxyE2EStalledClients(t *testing.T) {
	beside(t)
	const idle = 2 * time.Second
	var ended atomic.Int64
	up := stalledUpstream(t, idle+idle/2, &ended)
	rules := filepath.Join(t.TempDir(), "proxy.yaml")
	writeRules(t, rules, stalledRules)
	px := startProxy(t, "--config", rules, "--upstream", up, "--write-idle-timeout", idle.String())
	front := "http://" + px.addr("proxy")

	sent := time.Now()
	for range 3 {
		stallReading(t, px.addr("proxy"), "/big", "slow")
	}
	if code, _, _ := httpGet(t, front+"/ok", "slow"); code != http.StatusTooManyRequests && time.Since(sent) < idle {
		t.Errorf("a newcomer while 3 stalled clients hold the permits: %d, want 429", code)
	}
	poll(t, "the stalled clients' permits released", func() bool {
		return proxyMetric(t, px, "sluice_permits_held") == 0
	})
	if took := time.Since(sent); took < idle {
		t.Errorf("released %v after the requests, before --write-idle-timeout %v", took, idle)
	}
	poll(t, "the upstream requests cancelled", func() bool { return ended.Load() == 3 })
	if code, body, _ := httpGet(t, front+"/ok", "slow"); code != http.StatusOK || body != "ok" {
		t.Errorf("a newcomer after the aborts: %d %q, want 200 ok", code, body)
	}
	if n := proxyMetric(t, px, "sluice_proxy_timeouts_total", `timeout="write_idle"`); n != 3 {
		t.Errorf("%v write idle timeouts counted, want 3", n)
	}
	if n := proxyMetric(t, px, "sluice_permits_renewed_total"); n == 0 {
		t.Errorf("no renewal: the stalled requests outlived the TTL (1 s) and must have been renewed")
	}
	px.waitLog("request aborted", "read nothing of the answer")

	code, body, _ := httpGet(t, front+"/events", "reader")
	if code != http.StatusOK || strings.Count(body, "data: ") != 4 {
		t.Errorf("a stream with a pause of %v: %d %q, want its 4 events", idle+idle/2, code, body)
	}
	if n := proxyMetric(t, px, "sluice_proxy_timeouts_total", `timeout="write_idle"`); n != 3 {
		t.Errorf("%v write idle timeouts after the paused stream, want 3 still", n)
	}
}

// TestProxyE2EUpstreamTimeout: an upstream that sends no response headers
// within --upstream-timeout is answered 504, not before the timeout, its
// request cancelled and its permit released; counted and logged.
func TestProxyE2EUpstreamTimeout(t *testing.T) {
	beside(t)
	const timeout = time.Second
	var ended atomic.Int64
	up := stalledUpstream(t, 0, &ended)
	rules := filepath.Join(t.TempDir(), "proxy.yaml")
	writeRules(t, rules, stalledRules)
	px := startProxy(t, "--config", rules, "--upstream", up, "--upstream-timeout", timeout.String())

	start := time.Now()
	code, body, _ := httpGet(t, "http://"+px.addr("proxy")+"/hang", "u")
	if took := time.Since(start); code != http.StatusGatewayTimeout || took < timeout {
		t.Errorf("an upstream that never answers: %d %q after %v, want 504 after %v", code, body, took, timeout)
	}
	poll(t, "the upstream request cancelled", func() bool { return ended.Load() == 1 })
	poll(t, "the permit released", func() bool { return proxyMetric(t, px, "sluice_permits_held") == 0 })
	if n := proxyMetric(t, px, "sluice_proxy_timeouts_total", `timeout="upstream"`); n != 1 {
		t.Errorf("%v upstream timeouts counted, want 1", n)
	}
	px.waitLog("upstream timeout")
}

// httpGet sends a GET as user, waiting at most e2eWait.
func httpGet(t *testing.T, url, user string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-User", user)
	resp, err := (&http.Client{Timeout: e2eWait}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), resp.Header
}
