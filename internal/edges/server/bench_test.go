package server_test

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/decision/ratelimitheaders"
	"github.com/sluicehq/sluice/internal/edges/hitters"
	"github.com/sluicehq/sluice/internal/edges/server"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
)

const benchRules = `
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 1}
`

// benchServer is a server as sluice serve makes it: each limit decided on
// its own (Envoy's way) unless all, all-or-nothing.
func benchServer(b *testing.B, headers ratelimitheaders.HeaderMode, all bool) *server.Server {
	return benchServerWith(b, headers, all, nil)
}

func benchServerWith(b *testing.B, headers ratelimitheaders.HeaderMode, all bool, top *hitters.Tracker) *server.Server {
	b.Helper()
	store := memstore.New(memstore.Config{})
	b.Cleanup(func() { store.Close() })
	srv, err := server.New(server.Config{
		Decide:  decide.Config{Limiter: sluice.NewLimiter(store), Rules: rulestest.Config(b, benchRules), CountEach: !all},
		Headers: headers,
		Hitters: top,
	})
	if err != nil {
		b.Fatal(err)
	}
	return srv
}

// requests returns n requests of distinct keys (or n of one over-limit
// key).
func benchRequests(n int, key string) []*rlsv3.RateLimitRequest {
	rs := make([]*rlsv3.RateLimitRequest, n)
	for i := range rs {
		rs[i] = req("bench", d(fmt.Sprintf("%s=%d", key, i)))
	}
	return rs
}

// BenchmarkShouldRateLimit is the service method in process: rules,
// memstore, metrics and (optionally) headers, without gRPC.
func BenchmarkShouldRateLimit(b *testing.B) {
	for _, bc := range []struct {
		name    string
		keys    int
		key     string
		headers ratelimitheaders.HeaderMode
		all     bool
		hitters bool
	}{
		{"keys=1", 1, "user", 0, false, false},
		{"keys=10k", 10_000, "user", 0, false, false},
		{"keys=1M", 1_000_000, "user", 0, false, false},
		{"hot-over-limit", 1, "hot", 0, false, false},
		{"keys=10k/headers=all", 10_000, "user", ratelimitheaders.HeadersAll, false, false},
		{"no-match", 1, "other", 0, false, false},
		{"keys=10k/all-or-nothing", 10_000, "user", 0, true, false},
		{"keys=10k/hitters", 10_000, "user", 0, false, true},
		{"keys=1M/hitters", 1_000_000, "user", 0, false, true},
		{"hot-over-limit/hitters", 1, "hot", 0, false, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var top *hitters.Tracker
			if bc.hitters {
				top = hitters.New(hitters.Config{})
				defer top.Close()
			}
			srv := benchServerWith(b, bc.headers, bc.all, top)
			ctx := context.Background()
			reqs := benchRequests(bc.keys, bc.key)
			for _, r := range reqs { // every key in the store
				if _, err := srv.ShouldRateLimit(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
			var next atomic.Uint64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := next.Add(1_000_003)
				for pb.Next() {
					i++
					if _, err := srv.ShouldRateLimit(ctx, reqs[i%uint64(len(reqs))]); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkHittersAdded is what top keys add to a decision of the whole
// server, measured so that a shared machine's drift cancels out: the
// keys=10k workload runs in segments of 40,000 requests, alternately on a
// server without a tracker and on one with (each segment long enough for
// several garbage collections), GOMAXPROCS goroutines sharing each
// segment. An iteration is one pair of segments; give it -benchtime 150x.
// It reports the medians per request: plain-ns, hitters-ns, and added-ns,
// the median of the pairs' differences, with their quartiles (added-q1,
// added-q3). Its ns/op is that of a pair, 80,000 requests.
func BenchmarkHittersAdded(b *testing.B) {
	top := hitters.New(hitters.Config{})
	defer top.Close()
	srvs := [2]*server.Server{benchServerWith(b, 0, false, nil), benchServerWith(b, 0, false, top)}
	ctx := context.Background()
	reqs := benchRequests(10_000, "user")
	for _, srv := range srvs {
		for _, r := range reqs {
			if _, err := srv.ShouldRateLimit(ctx, r); err != nil {
				b.Fatal(err)
			}
		}
	}
	const per = 40_000
	g := runtime.GOMAXPROCS(0)
	next := make([]int, g)
	for w := range next {
		next[w] = w * 1_000_003
	}
	segment := func(srv *server.Server) float64 {
		start := time.Now()
		var wg sync.WaitGroup
		for w := range g {
			wg.Go(func() {
				i := next[w]
				for range per / g {
					i++
					if _, err := srv.ShouldRateLimit(ctx, reqs[i%len(reqs)]); err != nil {
						b.Error(err)
						return
					}
				}
				next[w] = i
			})
		}
		wg.Wait()
		return float64(time.Since(start).Nanoseconds()) / per
	}
	var plain, with, added []float64
	b.ReportAllocs()
	for b.Loop() {
		var ns [2]float64
		first := len(added) % 2 // which goes first alternates too
		ns[first] = segment(srvs[first])
		ns[1-first] = segment(srvs[1-first])
		plain, with, added = append(plain, ns[0]), append(with, ns[1]), append(added, ns[1]-ns[0])
	}
	q := func(xs []float64, f float64) float64 {
		xs = slices.Clone(xs)
		slices.Sort(xs)
		return xs[int(f*float64(len(xs)-1))]
	}
	b.ReportMetric(q(plain, 0.5), "plain-ns")
	b.ReportMetric(q(with, 0.5), "hitters-ns")
	b.ReportMetric(q(added, 0.5), "added-ns")
	b.ReportMetric(q(added, 0.25), "added-q1")
	b.ReportMetric(q(added, 0.75), "added-q3")
}

// nullRLS answers OK to everything: the do-nothing server to compare with.
type nullRLS struct{}

func (nullRLS) ShouldRateLimit(_ context.Context, r *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	st := make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(r.Descriptors))
	for i := range st {
		st[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: st}, nil
}

// BenchmarkGRPC drives the service over loopback gRPC with one connection,
// side by side with a do-nothing server.
func BenchmarkGRPC(b *testing.B) {
	reqs := benchRequests(10_000, "user")
	for _, bc := range []struct {
		name     string
		register func(*grpc.Server)
	}{
		{"null", func(g *grpc.Server) { rlsv3.RegisterRateLimitServiceServer(g, nullRLS{}) }},
		{"sluice", func(g *grpc.Server) { benchServer(b, 0, false).RegisterGRPC(g) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			g := grpc.NewServer(server.GRPCServerOptions()...)
			bc.register(g)
			go g.Serve(lis)
			defer g.Stop()
			conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			c := rlsv3.NewRateLimitServiceClient(conn)
			ctx := context.Background()
			var next atomic.Uint64
			b.ReportAllocs()
			b.SetParallelism(16)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := next.Add(1_000_003)
				for pb.Next() {
					i++
					if _, err := c.ShouldRateLimit(ctx, reqs[i%uint64(len(reqs))]); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// The server adds no allocation to the decider's two (the response and the
// counter keys): metrics are pre-curried, outcomes pooled, headers off.
func TestShouldRateLimitAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	store := memstore.New(memstore.Config{SweepInterval: -1})
	defer store.Close()
	top := hitters.New(hitters.Config{})
	defer top.Close()
	for _, h := range []*hitters.Tracker{nil, top} {
		srv, err := server.New(server.Config{Decide: decide.Config{Limiter: sluice.NewLimiter(store), Rules: rulestest.Config(t, benchRules)}, Hitters: h})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		r := req("bench", d("user=a"))
		if n := testing.AllocsPerRun(100, func() {
			if _, err := srv.ShouldRateLimit(ctx, r); err != nil {
				t.Fatal(err)
			}
		}); n > 2 {
			t.Errorf("with hitters %v: %v allocations per request, want at most 2", h != nil, n)
		}
	}
}
