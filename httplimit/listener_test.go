package httplimit_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/testsupport/loopback"
)

// keyServer starts a server that answers every request with the key c
// resolves for it, or "error: ..." when Resolve fails.
func keyServer(t *testing.T, c *httplimit.ClientIP) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := c.Resolve(r)
		if err != nil {
			fmt.Fprintf(w, "error: %v", err)
			return
		}
		io.WriteString(w, httplimit.Key(p))
	}))
	srv.Config.MaxHeaderBytes = 4 << 20 // room for a 1 MB X-Forwarded-For
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// clientFrom returns an HTTP client whose connections come from ip.
var clientFrom = loopback.Client

func get(t *testing.T, client *http.Client, url string, header http.Header) string {
	t.Helper()
	return readBody(t, send(t, client, http.MethodGet, url, header))
}

// send makes a request with the header lines of header and returns the
// response.
func send(t testing.TB, client *http.Client, method, url string, header http.Header) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// readBody returns the body of a 200 response, or "status N" for another.
func readBody(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("status %d", resp.StatusCode)
	}
	return string(body)
}

// appendingProxy starts a real httputil.ReverseProxy in front of upstream
// that keeps the incoming X-Forwarded-For and appends its client's address,
// connecting out through out.
func appendingProxy(t *testing.T, upstream string, out http.RoundTripper) *httptest.Server {
	t.Helper()
	target, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
			pr.SetXForwarded() // appends the client's address
		},
		Transport: out,
	})
	t.Cleanup(proxy.Close)
	return proxy
}

// A real client, a real httputil.ReverseProxy that appends X-Forwarded-For,
// and a real upstream. The client connects from 127.0.0.2 and the proxy
// from 127.0.0.3, so the two are told apart.
func TestResolveThroughReverseProxy(t *testing.T) {
	client := clientFrom(t, "127.0.0.2")
	proxyOut := clientFrom(t, "127.0.0.3").Transport

	spoof := http.Header{"X-Forwarded-For": {"192.0.2.66"}}
	for _, tt := range []struct {
		name    string
		trusted string
		header  http.Header
		want    string
	}{
		{"trusted proxy", "127.0.0.3", nil, "127.0.0.2"},
		{"trusted proxy, client spoofs", "127.0.0.3", spoof, "127.0.0.2"},
		{"untrusted proxy", "", nil, "127.0.0.3"},
		{"untrusted proxy, client spoofs", "127.0.0.9/32", spoof, "127.0.0.3"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			upstream := keyServer(t, &httplimit.ClientIP{TrustedProxies: mustProxies(t, tt.trusted)})
			proxy := appendingProxy(t, upstream.URL, proxyOut)

			if got := get(t, client, proxy.URL, tt.header); got != tt.want {
				t.Errorf("key through proxy = %q, want %q", got, tt.want)
			}
			// Straight to the upstream, the client is an untrusted peer
			// whatever it claims.
			if got := get(t, client, upstream.URL, spoof); got != "127.0.0.2" {
				t.Errorf("key direct = %q, want 127.0.0.2", got)
			}
		})
	}
}

// Header lines as they arrive on the wire: several X-Forwarded-For lines,
// a 1 MB one, and bytes a client library would refuse to send.
func TestResolveRawRequests(t *testing.T) {
	srv := keyServer(t, &httplimit.ClientIP{TrustedProxies: mustProxies(t, "127.0.0.0/8")})
	mb := 1 << 20
	many := strings.Repeat("192.0.2.66, ", mb/len("192.0.2.66, "))
	for _, tt := range []struct {
		name  string
		lines []string
		want  string
	}{
		{"no header", nil, "127.0.0.1"},
		{"two lines", []string{"X-Forwarded-For: 192.0.2.66, 198.51.100.1", "X-Forwarded-For: 127.0.0.5"}, "198.51.100.1"},
		{"lower-case name", []string{"x-forwarded-for: 198.51.100.1"}, "198.51.100.1"},
		{"1 MB of one entry", []string{"X-Forwarded-For: " + strings.Repeat("9", mb)}, "127.0.0.1"},
		{"1 MB of entries, then the client", []string{"X-Forwarded-For: " + many + "198.51.100.1"}, "198.51.100.1"},
		{"1 MB of entries: the right-most is the client", []string{"X-Forwarded-For: " + many}, "192.0.2.66"},
		{"1 MB of trusted entries: the hop furthest out", []string{"X-Forwarded-For: 198.51.100.1" + strings.Repeat(", 127.0.0.7", mb/len(", 127.0.0.7"))}, "127.0.0.7"},
		{"1 MB of commas", []string{"X-Forwarded-For: " + strings.Repeat(",", mb)}, "127.0.0.1"},
		{"high bytes", []string{"X-Forwarded-For: 198.51.100.1\xff\xfe"}, "127.0.0.1"},
		{"obs-fold continuation", []string{"X-Forwarded-For: 192.0.2.66,", " 198.51.100.1"}, "198.51.100.1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := rawGet(t, srv.Listener.Addr().String(), tt.lines); got != tt.want {
				t.Errorf("key = %.100q, want %q", got, tt.want)
			}
		})
	}
}

// rawGet writes a request with the given header lines on a new connection
// and returns what readBody makes of the response.
func rawGet(t *testing.T, addr string, lines []string) string {
	t.Helper()
	return readBody(t, rawRequest(t, addr, "/", lines))
}

// rawRequest writes a GET of path with the header lines on a new
// connection, for bytes a client library refuses to send, and returns the
// response.
func rawRequest(t testing.TB, addr, path string, lines []string) *http.Response {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	w := bufio.NewWriter(conn)
	w.WriteString("GET " + path + " HTTP/1.1\r\nHost: test\r\nConnection: close\r\n")
	for _, l := range lines {
		w.WriteString(l + "\r\n")
	}
	w.WriteString("\r\n")
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}
