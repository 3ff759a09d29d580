package rlsclient_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/rlsclient"
)

// The middleware deciding on the remote sends the headers of the remote's
// decisions: the remaining count down to 0, then 429 with Retry-After.
func TestHTTPLimitHeaders(t *testing.T) {
	r := startRemote(t, testRules) // remote_address: 3 a minute
	c := newClient(t, rlsclient.Config{Target: r.addr, Timeout: 5 * time.Second})
	mw, err := httplimit.New(httplimit.Config{Decider: c, Domain: "api"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "hello")
	})))
	t.Cleanup(srv.Close)
	for i, want := range []struct {
		status           int
		remaining, retry string
	}{
		{200, "2", ""},
		{200, "1", ""},
		{200, "0", ""},
		{429, "0", "60"},
		{429, "0", "60"},
	} {
		resp, err := srv.Client().Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		h := resp.Header
		if resp.StatusCode != want.status || h.Get("X-Ratelimit-Remaining") != want.remaining || h.Get("Retry-After") != want.retry ||
			h.Get("X-Ratelimit-Limit") != "3" || h.Get("X-Ratelimit-Reset") != "60" || h.Get("Ratelimit-Policy") != `"api.remote_address";q=3;w=60` {
			t.Errorf("request %d: %d %v, want %+v", i, resp.StatusCode, h, want)
		}
	}
}
