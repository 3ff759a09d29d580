package server_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/edges/server"
	"github.com/sluicehq/sluice/memstore"
)

// TestEnvoyHeaders translates envoyproxy/ratelimit's
// TestServiceWithCustomRatelimitHeaders and
// TestServiceWithDefaultRatelimitHeaders (test/service/ratelimit_test.go
// at f2fb157): a descriptor over its limit of 10 a minute and one that
// matches nothing; the headers tell the limit, 0 left and the seconds to
// the end of the minute (58, two seconds into it).
func TestEnvoyHeaders(t *testing.T) {
	const rules = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 10}\n  - key: q\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"
	for _, c := range []struct {
		name  string
		names server.EnvoyHeaderNames
	}{
		{"custom", server.EnvoyHeaderNames{Limit: "A-Ratelimit-Limit", Remaining: "A-Ratelimit-Remaining", Reset: "A-Ratelimit-Reset"}},
		{"default", server.DefaultEnvoyHeaderNames},
	} {
		t.Run(c.name, func(t *testing.T) {
			names := c.names
			e := newEnv(t, rules, server.Config{EnvoyHeaders: &names})
			e.clock.Advance(2 * time.Second)
			over := req("d", d("k=a"))
			over.HitsAddend = 10
			e.call(over)
			resp := e.call(req("d", d("k=a"), d("nothing=x")))
			if codes(resp) != "OVER_LIMIT: OVER_LIMIT OK" {
				t.Fatalf("codes %s", codes(resp))
			}
			got := map[string]string{}
			for _, h := range resp.GetResponseHeadersToAdd() {
				got[h.GetKey()] = h.GetValue()
			}
			want := map[string]string{names.Limit: "10", names.Remaining: "0", names.Reset: "58"}
			if len(got) != 3 || got[names.Limit] != "10" || got[names.Remaining] != "0" || got[names.Reset] != "58" {
				t.Errorf("headers %v, want %v", got, want)
			}
			// The least remaining among the limited descriptors when none
			// is over; a quota over its limit does not count as over.
			resp = e.call(req("d", d("k=b"), d("q=b")))
			got = map[string]string{}
			for _, h := range resp.GetResponseHeadersToAdd() {
				got[h.GetKey()] = h.GetValue()
			}
			if got[names.Limit] != "5" || got[names.Remaining] != "4" {
				t.Errorf("two allowed: headers %v, want the quota's 5 with 4 left", got)
			}
		})
	}
	store := memstore.New(memstore.Config{})
	defer store.Close()
	if _, err := server.New(server.Config{Decide: decide.Config{Limiter: sluice.NewLimiter(store)}, EnvoyHeaders: &server.EnvoyHeaderNames{Limit: "bad name", Remaining: "r", Reset: "x"}}); err == nil {
		t.Error("a header name with a space was accepted")
	}
}
