package httplimit_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/memstore"
)

// NewLimit with a KeyFunc: one counter per key the function returns; an
// empty key is not limited; an error or a garbage key is a 400 that
// consumes nothing.
func TestNewLimitKeyFunc(t *testing.T) {
	store := memstore.New(memstore.Config{})
	t.Cleanup(func() { store.Close() })
	key := httplimit.KeyFunc(func(r *http.Request) (string, error) {
		u := r.URL.Query().Get("user")
		if u == "error" {
			return "", errors.New("no session")
		}
		return u, nil
	})
	mw, err := httplimit.NewLimit(sluice.NewLimiter(store), &sluice.Limit{Name: "user", Rate: 2, Period: time.Hour}, key)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	t.Cleanup(srv.Close)
	get := func(user string) (int, string) {
		t.Helper()
		resp, err := srv.Client().Get(srv.URL + "/?user=" + user)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		buf := make([]byte, 512)
		n, _ := resp.Body.Read(buf)
		b.Write(buf[:n])
		return resp.StatusCode, b.String()
	}
	for i, tc := range []struct {
		user string
		want int
	}{
		{"a", 200}, {"a", 200}, {"a", 429}, // a's two an hour
		{"b", 200}, {"b", 200}, {"b", 429}, // b's own two
		{"", 200}, {"", 200}, {"", 200}, // no key: not limited
		{"error", 400}, {"%01", 400}, // the function failed; a control character
		{"a", 429},
	} {
		if code, body := get(tc.user); code != tc.want {
			t.Errorf("request %d (user %q): %d %s, want %d", i, tc.user, code, body, tc.want)
		}
	}
	if code, body := get("error"); !strings.Contains(body, "no session") {
		t.Errorf("the function's error is not in the problem: %d %s", code, body)
	}
}

func TestNewLimitConfigErrors(t *testing.T) {
	lim := sluice.NewLimiter(memstore.New(memstore.Config{}))
	ok := &sluice.Limit{Rate: 1, Period: time.Second}
	for _, tc := range []struct {
		name  string
		lim   *sluice.Limiter
		limit *sluice.Limit
		key   httplimit.Source
	}{
		{"no limiter", nil, ok, httplimit.RemoteAddress()},
		{"no limit", lim, nil, httplimit.RemoteAddress()},
		{"invalid limit", lim, &sluice.Limit{Rate: -1, Period: time.Second}, httplimit.RemoteAddress()},
		{"no source", lim, ok, httplimit.Source{}},
		{"nil KeyFunc", lim, ok, httplimit.KeyFunc(nil)},
		{"a concurrency limit", lim, &sluice.Limit{Algorithm: sluice.Concurrency, Rate: 1, Period: time.Second}, httplimit.RemoteAddress()},
	} {
		if _, err := httplimit.NewLimit(tc.lim, tc.limit, tc.key); !errors.Is(err, httplimit.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", tc.name, err)
		}
	}
}
