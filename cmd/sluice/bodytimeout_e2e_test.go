package main

// End-to-end tests of --body-timeout: on every HTTP listener of sluice
// serve and sluice proxy, a client that sends its headers and part of a
// body and then stalls is let go after the timeout; through the proxy, an
// upload that keeps sending is never cut, however long it takes.

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// stallBody connects to addr, sends a request for path with headers
// announcing a body of 1000 bytes and the first 10 of them, then sends
// nothing more. It returns how long after it began to send the server
// closed the connection (the server cannot have read those bytes before),
// and false if the server kept it open for e2eWait.
func stallBody(addr, method, path string) (time.Duration, bool, error) {
	conn, err := net.DialTimeout("tcp", addr, e2eWait)
	if err != nil {
		return 0, false, err
	}
	defer conn.Close()
	req := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n0123456789", method, path, addr)
	sent := time.Now()
	if _, err := io.WriteString(conn, req); err != nil {
		return 0, false, err
	}
	conn.SetReadDeadline(sent.Add(e2eWait))
	_, err = io.Copy(io.Discard, conn) // an answer, if any, then the end
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return time.Since(sent), false, nil
	}
	return time.Since(sent), true, nil
}

// TestBodyTimeoutE2E: 10 connections to each HTTP listener of sluice serve
// (HTTP, debug, admin) and sluice proxy (proxy, admin) that stall in
// their request bodies are all closed by the server, not before
// --body-timeout and well within e2eWait; before, they were held for ever.
func TestBodyTimeoutE2E(t *testing.T) {
	beside(t)
	const timeout = 2 * time.Second
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	writeRules(t, rules, "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n")
	tokens := writeFile(t, "tokens", "ops:0123456789abcdef0123456789abcdef\n")
	sv := startSluice(t, nil, "--config", rules, "--body-timeout", timeout.String(),
		"--admin-addr", "127.0.0.1:0", "--admin-token-file", tokens, "--overrides-file", filepath.Join(dir, "overrides.jsonl"))

	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		if d, err := time.ParseDuration(r.URL.Query().Get("then_wait")); err == nil {
			time.Sleep(d) // an upstream slower than --body-timeout, after the body
		}
		fmt.Fprintf(w, "%d bytes", n)
	}))
	defer up.Close()
	proxyFile := filepath.Join(dir, "proxy.yaml")
	writeRules(t, proxyFile, "domain: api\nhttp:\n  routes:\n    - pattern: /\n      descriptors: [[{key: user, header: X-User}]]\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n")
	px := startProxy(t, "--config", proxyFile, "--upstream", up.URL, "--body-timeout", timeout.String())

	listeners := []struct{ name, addr, method, path string }{
		{"serve http", sv.httpAddr, "POST", "/json"},
		{"serve debug", sv.dbg, "POST", "/rules"},
		{"serve admin", sv.addr("admin"), "PUT", "/v1/override"},
		{"proxy", px.addrs["proxy"], "POST", "/upload"},
		{"proxy admin", px.addrs["admin"], "POST", "/metrics"},
	}
	const conns = 10
	type result struct {
		name   string
		took   time.Duration
		closed bool
		err    error
	}
	results := make(chan result, len(listeners)*conns)
	var wg sync.WaitGroup
	for _, l := range listeners {
		for range conns {
			wg.Go(func() {
				took, closed, err := stallBody(l.addr, l.method, l.path)
				results <- result{l.name, took, closed, err}
			})
		}
	}
	wg.Wait()
	close(results)
	for r := range results {
		switch {
		case r.err != nil:
			t.Errorf("%s: %v", r.name, r.err)
		case !r.closed:
			t.Errorf("%s: a stalled request body held its connection for %v (--body-timeout %v)", r.name, r.took.Round(time.Millisecond), timeout)
		case r.took < timeout:
			t.Errorf("%s: closed %v after the last byte, before --body-timeout %v", r.name, r.took.Round(time.Millisecond), timeout)
		}
	}

	// An upload that keeps sending, for longer than the timeout in all,
	// goes through whole; so does a body followed by an upstream slower
	// than the timeout, and an answer slower than it to a request with no
	// body.
	t.Run("steady upload", func(t *testing.T) {
		const chunks, size = 40, 1024
		pr, pw := io.Pipe()
		go func() {
			chunk := strings.Repeat("x", size)
			for range chunks {
				time.Sleep(timeout / 20)
				if _, err := io.WriteString(pw, chunk); err != nil {
					return
				}
			}
			pw.Close()
		}()
		req, err := http.NewRequest("POST", "http://"+px.addrs["proxy"]+"/upload", pr)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		resp, err := (&http.Client{Timeout: 4 * e2eWait}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := strconv.Itoa(chunks*size) + " bytes"; resp.StatusCode != 200 || string(body) != want {
			t.Errorf("a steady upload of %v: %d %q, want 200 %q", time.Since(start).Round(time.Millisecond), resp.StatusCode, body, want)
		}
	})
	for _, c := range []struct{ name, method, body string }{
		{"slow upstream after the body", "POST", `{"a":1}`},
		{"slow upstream without a body", "GET", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			wait := timeout + timeout/2
			code, body, _ := httpDo(t, c.method, "http://"+px.addrs["proxy"]+"/slow?then_wait="+wait.String(), c.body)
			if want := fmt.Sprintf("%d bytes", len(c.body)); code != 200 || body != want {
				t.Errorf("%d %q, want 200 %q", code, body, want)
			}
		})
	}
}
