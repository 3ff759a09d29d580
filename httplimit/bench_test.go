package httplimit_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/decision/ratelimitheaders"
	"github.com/sluicehq/sluice/rules"
)

func BenchmarkResolve(b *testing.B) {
	trusted := mustProxies(b, "10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, fd00::/8, fe80::1")
	all := []string{"X-Forwarded-For", "Forwarded", "X-Real-IP"}
	cases := []struct {
		name    string
		headers []string
		peer    string
		lines   []string
	}{
		{name: "untrusted peer", peer: "203.0.113.5:4000", lines: []string{"X-Forwarded-For: 192.0.2.66"}},
		{name: "untrusted IPv6 peer", peer: "[2001:db8:1:2::5]:4000"},
		{name: "XFF one hop", peer: "10.0.0.1:4000", lines: []string{"X-Forwarded-For: 198.51.100.1"}},
		{name: "XFF three hops", peer: "10.0.0.1:4000",
			lines: []string{"X-Forwarded-For: 192.0.2.66, 198.51.100.1, 172.16.0.2, 10.0.0.3"}},
		{name: "XFF zoned IPv6", peer: "[fe80::1%eth0]:4000", lines: []string{"X-Forwarded-For: fe80::2%eth0"}},
		{name: "XFF IPv6", peer: "[fd00::1]:4000", lines: []string{"X-Forwarded-For: [2001:db8:1:2::77]:443"}},
		{name: "Forwarded", headers: all[1:], peer: "10.0.0.1:4000",
			lines: []string{`Forwarded: for=192.0.2.66, for="[2001:db8:cafe::17]:4711";proto=https, for=10.0.0.2`}},
		{name: "X-Real-IP", headers: all[2:], peer: "10.0.0.1:4000", lines: []string{"X-Real-IP: 198.51.100.1"}},
		{name: "XFF 1MB", peer: "10.0.0.1:4000",
			lines: []string{"X-Forwarded-For: " + strings.Repeat("192.0.2.66, ", 1<<20/12) + "198.51.100.1, 10.0.0.2"}},
		{name: "XFF 1MB garbage", peer: "10.0.0.1:4000", lines: []string{"X-Forwarded-For: " + strings.Repeat("x", 1<<20)}},
	}
	for _, bc := range cases {
		c := &httplimit.ClientIP{TrustedProxies: trusted, Headers: bc.headers}
		r := request(bc.peer, bc.lines...)
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Resolve(r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("XFF three hops parallel", func(b *testing.B) {
		c := &httplimit.ClientIP{TrustedProxies: trusted}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			r := request("10.0.0.1:4000", "X-Forwarded-For: 192.0.2.66, 198.51.100.1, 172.16.0.2, 10.0.0.3")
			for pb.Next() {
				if _, err := c.Resolve(r); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

var keySink string

// BenchmarkKey measures the descriptor value's string (the middleware
// appends it to a reused buffer instead).
func BenchmarkKey(b *testing.B) {
	c := &httplimit.ClientIP{}
	for _, peer := range []string{"203.0.113.5:4000", "[2001:db8:1:2::5]:4000"} {
		p, err := c.Resolve(&http.Request{RemoteAddr: peer})
		if err != nil {
			b.Fatal(err)
		}
		b.Run("Key "+httplimit.Key(p), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				keySink = httplimit.Key(p)
			}
		})
	}
}

// discardWriter is a ResponseWriter that keeps only its header map, which
// each request clears, as net/http gives every response a new one.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(int)             {}

// benchRules never deny: the limits of BenchmarkMiddleware and
// TestMiddlewareAllocs.
const benchRules = `
domain: bench
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 1000000000}
`

// BenchmarkMiddleware is the middleware's overhead per request around a
// handler that does nothing: client address, descriptors, the decision on
// a memstore (keys within their limit) and the response headers. The
// requests are made once; each goroutine cycles through keys of its own.
func BenchmarkMiddleware(b *testing.B) {
	yaml := benchRules
	nothing := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	for _, bc := range []struct {
		name    string
		keys    int
		headers ratelimitheaders.HeaderMode
		descs   []httplimit.Descriptor
	}{
		{"keys=1/headers=none", 1, ratelimitheaders.HeadersNone, nil},
		{"keys=10k/headers=none", 10_000, ratelimitheaders.HeadersNone, nil},
		{"keys=10k/headers=all", 10_000, ratelimitheaders.HeadersAll, nil},
		{"keys=10k/ip+apikey/headers=all", 10_000, ratelimitheaders.HeadersAll, []httplimit.Descriptor{
			{{Source: httplimit.RemoteAddress()}}, {{Source: httplimit.APIKey("X-Api-Key")}}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			mw, err := httplimit.New(httplimit.Config{
				Decider:     decider(b, yaml),
				Domain:      "bench",
				Headers:     bc.headers,
				Descriptors: bc.descs,
			})
			if err != nil {
				b.Fatal(err)
			}
			h := mw(nothing)
			reqs := make([]*http.Request, bc.keys)
			for i := range reqs {
				reqs[i] = request(fmt.Sprintf("10.%d.%d.%d:4000", i>>16&255, i>>8&255, i&255), fmt.Sprintf("X-Api-Key: key-%d", i))
				h.ServeHTTP(&discardWriter{h: http.Header{}}, reqs[i]) // every key in the store
			}
			var next atomic.Uint64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				w := &discardWriter{h: http.Header{}}
				i := next.Add(1) * 7919
				for pb.Next() {
					clear(w.h)
					h.ServeHTTP(w, reqs[i%uint64(len(reqs))])
					i++
				}
			})
		})
	}
}

// BenchmarkDecideOnly is the decision alone that BenchmarkMiddleware's
// keys=10k/headers=none makes per request: the baseline its overhead is
// measured against.
func BenchmarkDecideOnly(b *testing.B) {
	dec := decider(b, `
domain: bench
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000000}
`)
	reqs := make([][]rules.Descriptor, 10_000)
	for i := range reqs {
		reqs[i] = []rules.Descriptor{{
			Entries: []rules.Entry{{Key: "remote_address", Value: fmt.Sprintf("10.0.%d.%d", i>>8&255, i&255)}},
			Cost:    1,
		}}
	}
	var next atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		// The Request and Outcome are reused, as the middleware and the
		// server reuse theirs.
		var o decide.Outcome
		r := decide.Request{Domain: "bench"}
		i := next.Add(1) * 7919
		for pb.Next() {
			r.Descriptors = reqs[i%uint64(len(reqs))]
			if err := dec.Decide(context.Background(), &r, &o); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}

// The middleware's allocations per request on a memstore, with every
// header family: the counter keys (rules) and the header values, one each.
func TestMiddlewareAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	for _, descs := range [][]httplimit.Descriptor{
		nil,
		{{{Source: httplimit.RemoteAddress()}}, {{Source: httplimit.APIKey("X-Api-Key")}}},
	} {
		mw, err := httplimit.New(httplimit.Config{
			Decider:     decider(t, benchRules),
			Domain:      "bench",
			Descriptors: descs,
		})
		if err != nil {
			t.Fatal(err)
		}
		h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		r := request("10.1.2.3:4000", "X-Api-Key: key-1")
		w := &discardWriter{h: http.Header{}}
		if n := testing.AllocsPerRun(200, func() {
			clear(w.h)
			h.ServeHTTP(w, r)
		}); n > 2 {
			t.Errorf("%d descriptors: %v allocations per request, want at most 2", max(len(descs), 1), n)
		}
		if got := w.h.Get("X-Ratelimit-Limit"); got != "1000000000" {
			t.Errorf("headers not set: %v", w.h)
		}
	}
}
