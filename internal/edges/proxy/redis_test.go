package proxy_test

import (
	"net/http"
	"testing"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
	"github.com/sluicehq/sluice/localcache"
	"github.com/sluicehq/sluice/redisstore"
)

// The proxy limits alike on the Redis store, with the node-local cache of
// denied keys in front as sluice proxy --store redis runs it. Without
// redis-server this skips, except under CI=true, where it fails.
func TestRedisStore(t *testing.T) {
	srv := redistest.Standalone(t)
	rs, err := redisstore.New(redisstore.Config{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	up := newUpstream(t, nil)
	f := startWith(t, perIP, up, localcache.New(rs, localcache.Config{}), nil)
	for i, want := range []int{200, 200, 200, 429, 429} {
		if resp, _ := f.get("/r"); resp.StatusCode != want {
			t.Errorf("request %d: %d, want %d", i, resp.StatusCode, want)
		}
	}
	if n := up.hits.Load(); n != 3 {
		t.Errorf("upstream saw %d requests, want 3", n)
	}
	// The limit lives in Redis: another proxy on the same Redis shares it.
	g := startWith(t, perIP, up, rs, nil)
	if resp, _ := g.get("/r"); resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("second proxy: %d, want 429", resp.StatusCode)
	}
}
