package httpretry_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/httpretry"
)

// stub answers every request with a fresh 200 without I/O, so that what
// is measured over it is the transport's own overhead.
type stub struct{ header http.Header }

func (s stub) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Header: s.header, Body: http.NoBody, Request: req}, nil
}

func overheadCases() []struct {
	name string
	rt   http.RoundTripper
} {
	quota := stub{header: http.Header{"Ratelimit": {`"default";r=50;t=30`}, "Ratelimit-Policy": {`"default";q=100;w=60`}}}
	return []struct {
		name string
		rt   http.RoundTripper
	}{
		{"stub", stub{}},
		{"httpretry", httpretry.New(httpretry.Config{Base: stub{}})},
		{"httpretry+RateLimit", httpretry.New(httpretry.Config{Base: quota})},
		{"httpretry+pace+budget", httpretry.New(httpretry.Config{Base: stub{}, Pace: httpretry.Pace{Rate: 1 << 40}, Budget: &httpretry.Budget{}})},
	}
}

// BenchmarkOverhead is the cost of the transport on the no-retry path,
// over a base that does no I/O.
func BenchmarkOverhead(b *testing.B) {
	req, _ := http.NewRequest("GET", "http://api.test/v1/things", nil)
	for _, c := range overheadCases() {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				resp, err := c.rt.RoundTrip(req)
				if err != nil || resp.StatusCode != 200 {
					b.Fatal(resp, err)
				}
			}
		})
	}
}

// TestOverheadAllocs checks that the no-retry path allocates nothing of
// its own, with or without RateLimit fields to read.
func TestOverheadAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	req, _ := http.NewRequest("GET", "http://api.test/v1/things", nil)
	allocs := make(map[string]float64)
	for _, c := range overheadCases() {
		allocs[c.name] = testing.AllocsPerRun(1000, func() {
			if _, err := c.rt.RoundTrip(req); err != nil {
				t.Fatal(err)
			}
		})
	}
	for name, n := range allocs {
		if n != allocs["stub"] {
			t.Errorf("%s: %v allocations per request, the stub alone %v", name, n, allocs["stub"])
		}
	}
}

// BenchmarkLoopback is a GET answered 200 by a server on loopback, through
// a plain http.Transport and through httpretry over the same transport.
func BenchmarkLoopback(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	for _, c := range []struct {
		name string
		wrap func(http.RoundTripper) http.RoundTripper
	}{
		{"plain", func(rt http.RoundTripper) http.RoundTripper { return rt }},
		{"httpretry", func(rt http.RoundTripper) http.RoundTripper { return httpretry.New(httpretry.Config{Base: rt}) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			tr := &http.Transport{MaxIdleConnsPerHost: 64}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: c.wrap(tr)}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := client.Get(srv.URL)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 || !strings.HasPrefix(resp.Status, "200") {
						b.Errorf("status %s", resp.Status)
					}
				}
			})
		})
	}
}
