package rlsclient_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/edges/rlsclient"
)

// The middleware deciding on the remote sends the headers of the remote's
// decisions: the remaining count down to 0, then 429 with Retry-After.
func TestHTTPLimitHeaders(t *testing.T) {
	r := startRemote(t, testRules) // remote_address: 3 a minute
	c := newClient(t, rlsclient.Config{Target: r.addr, Timeout: 5 * time.Second})
	mw, err := httplimit.New(httplimit.Config{Decider: viaRemote(t, c, nil, decide.Failover{}), Domain: "api"})
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

// Over a remote sliding window the headers say when the next request is
// admitted, as they do on local rules: 5 a minute, all spent 51 s into a
// minute, the sixth fits 12 s into the next one (the 5 then weigh 4), 21 s
// later, not at the end of the minute, 9 s later.
func TestHTTPLimitRemoteSlidingWindow(t *testing.T) {
	r := startRemote(t, "domain: api\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window}\n")
	r.clock.Set(epoch.Add(51 * time.Second))
	c := newClient(t, rlsclient.Config{Target: r.addr, Timeout: 5 * time.Second})
	mw, err := httplimit.New(httplimit.Config{Decider: viaRemote(t, c, nil, decide.Failover{}), Domain: "api"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	t.Cleanup(srv.Close)
	get := func() string {
		resp, err := srv.Client().Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		h := resp.Header
		return fmt.Sprintf("%d %s reset=%s retry=%s", resp.StatusCode, h.Get("Ratelimit"), h.Get("X-Ratelimit-Reset"), h.Get("Retry-After"))
	}
	var got []string
	for range 6 {
		got = append(got, get())
	}
	r.clock.Advance(20 * time.Second)
	got = append(got, get())
	r.clock.Advance(time.Second)
	got = append(got, get())
	want := []string{
		`200 "api.remote_address";r=4;t=69 reset=69 retry=`,
		`200 "api.remote_address";r=3;t=39 reset=39 retry=`,
		`200 "api.remote_address";r=2;t=29 reset=29 retry=`,
		`200 "api.remote_address";r=1;t=24 reset=24 retry=`,
		`200 "api.remote_address";r=0;t=21 reset=21 retry=`,
		`429 "api.remote_address";r=0;t=21 reset=21 retry=21`,
		`429 "api.remote_address";r=0;t=1 reset=1 retry=1`,
		`200 "api.remote_address";r=0;t=60 reset=60 retry=`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
