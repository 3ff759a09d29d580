package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// serveBodyTest serves h with newHTTPServer and a body timeout of idle on
// a loopback listener, and returns its address.
func serveBodyTest(t *testing.T, idle time.Duration, h http.HandlerFunc) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := newHTTPServer(h, slog.New(slog.DiscardHandler), idle)
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	return ln.Addr().String()
}

// TestBodyTimeoutLeavesHandlersAlone: the body timeout bounds the reads
// of a body, not the handler: one that waits longer than it before it
// reads a body the client sent gets the whole body, and one that reads
// the body (and past its end) and then works longer than it keeps its
// request (its context is not cancelled: the server watches the
// connection without a deadline once the body has ended) and answers.
func TestBodyTimeoutLeavesHandlersAlone(t *testing.T) {
	const idle = 200 * time.Millisecond
	body := strings.Repeat("b", 10000)
	addr := serveBodyTest(t, idle, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/wait-then-read" {
			time.Sleep(3 * idle)
		}
		got, err := io.ReadAll(r.Body)
		if r.URL.Path == "/read-then-wait" {
			r.Body.Read(make([]byte, 1)) // past the end, as some decoders do
			time.Sleep(3 * idle)
		}
		fmt.Fprintf(w, "%d %v %v", len(got), err, r.Context().Err())
	})
	for _, path := range []string{"/wait-then-read", "/read-then-wait"} {
		resp, err := http.Post("http://"+addr+path, "text/plain", strings.NewReader(body))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := fmt.Sprintf("%d <nil> <nil>", len(body)); string(got) != want {
			t.Errorf("%s: the handler saw %q, want %q", path, got, want)
		}
	}
}

// TestBodyTimeoutFailsAStalledRead: a read of a body whose client stalls
// fails with a timeout, and the connection is closed.
func TestBodyTimeoutFailsAStalledRead(t *testing.T) {
	const idle = 200 * time.Millisecond
	readErr := make(chan error, 1)
	addr := serveBodyTest(t, idle, func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		readErr <- err
	})
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
	var ne net.Error
	select {
	case err := <-readErr:
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("the handler's read: %v, want a timeout", err)
		}
	case <-time.After(e2eWait):
		t.Fatalf("the handler's read of a stalled body did not end within %v", e2eWait)
	}
	conn.SetReadDeadline(time.Now().Add(e2eWait))
	if _, err := io.Copy(io.Discard, conn); errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("the connection of a stalled body stayed open")
	}
}
