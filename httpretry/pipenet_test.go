package httpretry_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
)

// pipeNet is an in-memory network for tests in a synctest bubble, where a
// goroutine blocked on a real socket would keep the fake clock from
// moving. Each host is a real httptest.Server (an http.Server speaking
// HTTP/1.1) whose listener accepts the server ends of net.Pipe
// connections; the client's http.Transport dials the other ends.
type pipeNet struct {
	mu    sync.Mutex
	hosts map[string]*pipeListener
	dials atomic.Int64 // connections opened
}

func newPipeNet() *pipeNet { return &pipeNet{hosts: make(map[string]*pipeListener)} }

// serve starts a server for host (host:port, as in a URL) and closes it
// when the test ends.
func (n *pipeNet) serve(t *testing.T, host string, h http.Handler) *httptest.Server {
	t.Helper()
	l := &pipeListener{addr: pipeAddr(host), conns: make(chan net.Conn), done: make(chan struct{})}
	n.mu.Lock()
	n.hosts[host] = l
	n.mu.Unlock()
	s := &httptest.Server{Listener: l, Config: &http.Server{Handler: h}}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

// transport returns an http.Transport that dials n, closing its idle
// connections when the test ends (before the servers close).
func (n *pipeNet) transport(t *testing.T) *http.Transport {
	tr := &http.Transport{DialContext: n.dial, MaxIdleConnsPerHost: 200}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

func (n *pipeNet) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	n.mu.Lock()
	l := n.hosts[addr]
	n.mu.Unlock()
	if l == nil {
		return nil, errors.New("pipenet: no host " + addr)
	}
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		n.dials.Add(1)
		return client, nil
	case <-l.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type pipeListener struct {
	addr  pipeAddr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return l.addr }

type pipeAddr string

func (a pipeAddr) Network() string { return "pipe" }
func (a pipeAddr) String() string  { return string(a) }
