package proxy_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/edges/httpconf"
	"github.com/sluicehq/sluice/internal/edges/proxy"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
)

// benchBody is what the upstream of BenchmarkProxy answers: a small JSON
// body of known length.
var benchBody = []byte(`{"id":42,"name":"widget","price":"9.99","tags":["a","b"]}` + "\n")

// benchRules limit every client address far above what a run sends, so that
// nothing is denied and every request is decided and proxied. 127.0.0.1 is
// a trusted proxy: the keys case names its clients in X-Forwarded-For.
const benchRules = `
domain: api
http:
  client_ip:
    trusted_proxies: [127.0.0.1]
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000000}
`

// BenchmarkProxy is the throughput of a Proxy against a plain
// httputil.ReverseProxy in front of the same upstream, all on loopback
// listeners in this process, with 16 requests in flight per GOMAXPROCS
// over keep-alive connections:
//
//   - plain/...: ReverseProxy with only SetURL, and the Transport and
//     FlushInterval that Proxy uses by default, so that only the limiter
//     and the proxy's own wrapping differ;
//   - sluice/1-client: a Proxy with a memstore and metrics, every request
//     from the one client 127.0.0.1, one key;
//   - sluice/10k-clients: 10,000 client addresses, given by
//     X-Forwarded-For from the trusted peer 127.0.0.1, so 10,000 keys;
//     plain/10k-clients gets the same requests;
//   - sluice-no-timeouts/1-client: sluice/1-client without the write
//     idle and upstream timeouts (the others have sluice proxy's
//     defaults), for their cost.
//
// Each reports req/s besides ns/op; the client's and the upstream's work
// is in both, so the ratio of the req/s understates the proxy's own cost.
// bench/proxy.sh measures the built binaries from outside.
func BenchmarkProxy(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h["Content-Type"] = []string{"application/json"}
		h["Content-Length"] = []string{strconv.Itoa(len(benchBody))}
		w.Write(benchBody)
	}))
	defer up.Close()
	upURL, err := url.Parse(up.URL)
	if err != nil {
		b.Fatal(err)
	}

	// The Transport and FlushInterval that proxy.Config documents as its
	// defaults: a clone of http.DefaultTransport keeping 100 idle
	// connections to the upstream, a flush after every write.
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 100
	plain := &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(upURL) },
		Transport:     t,
		FlushInterval: -1,
	}

	section, err := httpconf.Parse("bench.yaml", []byte(benchRules))
	if err != nil {
		b.Fatal(err)
	}
	store := memstore.New(memstore.Config{})
	defer store.Close()
	m, err := proxy.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	cfg := proxy.Config{
		Upstream: upURL,
		Decider:  mustDecider(sluice.NewLimiter(store), rulestest.Config(b, benchRules)),
		Domain:   "api",
		HTTP:     section,
		Metrics:  m, // as sluice proxy runs it
	}
	untimed, err := proxy.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	cfg.WriteIdleTimeout, cfg.UpstreamTimeout = time.Minute, 10*time.Minute
	if cfg.Metrics, err = proxy.NewMetrics(prometheus.NewRegistry()); err != nil {
		b.Fatal(err)
	}
	limited, err := proxy.New(cfg)
	if err != nil {
		b.Fatal(err)
	}

	for _, bc := range []struct {
		name    string
		h       http.Handler
		clients int // distinct X-Forwarded-For values; 0 sends none
	}{
		{"plain/1-client", plain, 0},
		{"sluice/1-client", limited, 0},
		{"sluice-no-timeouts/1-client", untimed, 0},
		{"plain/10k-clients", plain, 10_000},
		{"sluice/10k-clients", limited, 10_000},
	} {
		b.Run(bc.name, func(b *testing.B) {
			benchFront(b, bc.h, bc.clients)
		})
	}
}

// benchFront serves h on a loopback listener and sends it GET requests
// from 16 goroutines per GOMAXPROCS, each with a request of its own,
// reused, and clients X-Forwarded-For values taken in turn.
func benchFront(b *testing.B, h http.Handler, clients int) {
	front := httptest.NewServer(h)
	defer front.Close()
	const parallelism = 16
	c := &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{}).DialContext,
		MaxIdleConnsPerHost: parallelism * 64, // one a goroutine, whatever GOMAXPROCS
		DisableCompression:  true,
	}}
	defer c.CloseIdleConnections()
	xff := make([][]string, clients)
	base := netip.MustParseAddr("198.18.0.0") // RFC 2544 benchmarking range
	for i := range xff {
		a := base.As4()
		a[2], a[3] = byte(i>>8), byte(i)
		xff[i] = []string{netip.AddrFrom4(a).String()}
	}
	var seq atomic.Int64
	b.SetParallelism(parallelism)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req, err := http.NewRequest(http.MethodGet, front.URL+"/items/42", nil)
		if err != nil {
			b.Error(err)
			return
		}
		i := int(seq.Add(1)) * 7919 // goroutines start apart in the keys
		for pb.Next() {
			if clients > 0 {
				req.Header["X-Forwarded-For"] = xff[i%clients]
				i++
			}
			resp, err := c.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			n, err := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK || n != int64(len(benchBody)) {
				b.Errorf("status %d, %d bytes, %v", resp.StatusCode, n, err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}
