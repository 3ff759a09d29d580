package loopback_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice/internal/testsupport/loopback"
)

// The server sees the client's chosen address as the peer.
func TestClient(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.RemoteAddr)
	}))
	defer srv.Close()
	resp, err := loopback.Client(t, "127.0.0.5").Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if host, _, _ := net.SplitHostPort(string(b)); host != "127.0.0.5" {
		t.Errorf("the server saw %s, want 127.0.0.5", b)
	}
}
