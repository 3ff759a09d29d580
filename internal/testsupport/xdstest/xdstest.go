// Package xdstest runs, in tests, go-control-plane's own xDS management
// server (its server and snapshot cache) on a real loopback listener,
// serving RateLimitConfig snapshots, and keeps the requests it gets and
// the version of every response it sends. It imports go-control-plane and
// gRPC, and nothing of sluice.
package xdstest

import (
	"context"
	"net"
	"sync"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
)

// Server is a running management server.
type Server struct {
	Addr  string
	Cache cachev3.SnapshotCache // go-control-plane's, as it comes (ADS)

	mu        sync.Mutex
	requests  []*discovery.DiscoveryRequest
	responses map[string]string // nonce -> version
}

// Start starts a server with opts (its credentials, say), stopped when
// the test ends.
func Start(t testing.TB, opts ...grpc.ServerOption) *Server {
	t.Helper()
	s := &Server{Cache: cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil), responses: map[string]string{}}
	cb := serverv3.CallbackFuncs{
		StreamRequestFunc: func(_ int64, req *discovery.DiscoveryRequest) error {
			s.mu.Lock()
			s.requests = append(s.requests, req)
			s.mu.Unlock()
			return nil
		},
		StreamResponseFunc: func(_ context.Context, _ int64, _ *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
			s.mu.Lock()
			s.responses[resp.GetNonce()] = resp.GetVersionInfo()
			s.mu.Unlock()
		},
	}
	g := grpc.NewServer(opts...)
	discovery.RegisterAggregatedDiscoveryServiceServer(g, serverv3.NewServer(context.Background(), s.Cache, cb))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(ln)
	t.Cleanup(g.Stop)
	s.Addr = ln.Addr().String()
	return s
}

// Set serves version of confs to node.
func (s *Server) Set(t testing.TB, node, version string, confs ...*rlconf.RateLimitConfig) {
	t.Helper()
	res := make([]types.Resource, len(confs))
	for i, c := range confs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Cache.SetSnapshot(context.Background(), node, snap); err != nil {
		t.Fatal(err)
	}
}

// NACKs returns the NACKs received so far, and for each the version of
// the response it answered.
func (s *Server) NACKs() (nacks []*discovery.DiscoveryRequest, answered []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.requests {
		if r.GetErrorDetail() != nil {
			nacks = append(nacks, r)
			answered = append(answered, s.responses[r.GetResponseNonce()])
		}
	}
	return nacks, answered
}
