package proxy_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

const guarded = `domain: api
http:
  client_ip:
    trusted_proxies: [127.0.0.2]
  routes:
    - pattern: /ip/
    - pattern: /
      descriptors:
        - [{key: user, header: X-User}]
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: sliding_log}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: sliding_log}
`

// raw sends request as it is over a new connection to the proxy and
// returns the status of the answer (0 when the proxy closed the connection
// without one).
func (f *fixture) raw(request string) int {
	f.t.Helper()
	conn, err := net.DialTimeout("tcp", f.srv.Listener.Addr().String(), wait)
	if err != nil {
		f.t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(wait))
	if _, err := io.WriteString(conn, request); err != nil {
		f.t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Garbage, enormous and malicious headers never panic the proxy, are
// answered 4xx or normally, and never charge or change another client's
// limit.
func TestBadInput(t *testing.T) {
	up := newUpstream(t, nil)
	f := start(t, guarded, up)
	trusted := clientFrom(t, "127.0.0.2")
	const victimIP = "203.0.113.50"
	mb := strings.Repeat("x", 1<<20)
	mbChain := strings.Repeat("198.51.100.1, ", 1<<20/14) + victimIP

	statusOK := func(what string, status int) {
		t.Helper()
		if status >= 500 || status == 0 {
			t.Errorf("%s: answered %d", what, status)
		}
	}
	// Untrusted peers naming the victim, in every way.
	for _, h := range []string{
		"X-Forwarded-For: " + victimIP,
		"X-Forwarded-For: " + mbChain,
		"X-Real-IP: " + victimIP,
		"Forwarded: for=" + victimIP,
	} {
		resp, _ := f.get("/ip/", h)
		statusOK("untrusted "+h[:20], resp.StatusCode)
	}
	// A trusted peer with garbage where addresses belong: the client is
	// the peer itself, whatever the header holds.
	for _, xff := range []string{mb, "999.1.1.1", "not-an-ip, ::zz", "1.2.3.4:99999", "\t,,,,", "[::1", "1.2.3.4%eth0"} {
		resp, _ := f.do(trusted, "GET", "/ip/", "X-Forwarded-For: "+xff)
		statusOK("trusted garbage", resp.StatusCode)
	}
	// Header-sourced keys: too long, repeated, and what the server
	// refuses before the proxy sees it (CR, LF, NUL inside a value).
	for _, tc := range []struct {
		req  string
		want int // 0: any 4xx
	}{
		{"GET / HTTP/1.1\r\nHost: a\r\nX-User: " + strings.Repeat("v", 200<<10) + "\r\n\r\n", 400},
		{"GET / HTTP/1.1\r\nHost: a\r\nX-User: attacker\r\nX-User: victim\r\n\r\n", 400},
		{"GET / HTTP/1.1\r\nHost: a\r\nX-User: victim\rX-Admin: 1\r\n\r\n", 0},
		{"GET / HTTP/1.1\r\nHost: a\r\nX-User: vic\x00tim\r\n\r\n", 0},
		{"GET / HTTP/1.1\r\nHost: a\r\nX-User: victim\nX-User: victim\r\n\r\n", 0},
		{"GET / HTTP/1.1\r\nHost: a\r\nX-User: \xff\xfevictim\r\n\r\n", 400},
		{"GET / HTTP/1.1\r\nHost: a\r\nX-Junk: " + strings.Repeat("j", 200<<10) + "\r\n\r\n", 200},
		{"GET /\x00 HTTP/1.1\r\nHost: a\r\n\r\n", 0},
	} {
		got := f.raw(tc.req)
		if tc.want == 0 && (got < 400 || got > 499) || tc.want != 0 && got != tc.want {
			t.Errorf("%.60q: answered %d, want %d (0: any 4xx)", tc.req, got, tc.want)
		}
	}
	// A 1 MB header of any kind is answered, even where the server's
	// bound refuses it (431 on a default server).
	resp, _ := f.get("/", "X-Junk: "+mb)
	statusOK("1 MB header", resp.StatusCode)

	// The victims' limits are whole: two requests each.
	resp, _ = f.do(trusted, "GET", "/ip/", "X-Forwarded-For: "+victimIP)
	if resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Remaining") != "1" {
		t.Errorf("victim address: %d, remaining %q, want 200 and 1", resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"))
	}
	resp, _ = f.get("/", "X-User: victim")
	if resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Remaining") != "1" {
		t.Errorf("victim user: %d, remaining %q, want 200 and 1", resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"))
	}
	// Invalid: the long value, the repeated header twice (the bare LF
	// ends a header line), the invalid UTF-8.
	if n := f.count("sluice_proxy_requests_total", "route", "/", "result", "invalid"); n != 4 {
		t.Errorf("invalid requests counted: %v, want 4", n)
	}
}
