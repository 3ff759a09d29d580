package main

import (
	"context"
	"net"
	"strings"
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

// xdsServer is a real go-control-plane xDS management server on loopback,
// serving RateLimitConfig snapshots to node "sluice-test", and keeping the
// NACKs it receives.
type xdsServer struct {
	addr  string
	cache cachev3.SnapshotCache

	mu    sync.Mutex
	nacks []string
}

func startXDS(t *testing.T) *xdsServer {
	t.Helper()
	x := &xdsServer{cache: cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)}
	cb := serverv3.CallbackFuncs{StreamRequestFunc: func(_ int64, req *discovery.DiscoveryRequest) error {
		if d := req.GetErrorDetail(); d != nil {
			x.mu.Lock()
			x.nacks = append(x.nacks, d.GetMessage())
			x.mu.Unlock()
		}
		return nil
	}}
	srv := serverv3.NewServer(context.Background(), x.cache, cb)
	g := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(g, srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	x.addr = lis.Addr().String()
	return x
}

// set serves version of the config of one domain with one limit per key.
func (x *xdsServer) set(t *testing.T, version string, limits map[string]uint32, unit rlconf.RateLimitUnit) {
	t.Helper()
	conf := &rlconf.RateLimitConfig{Name: "xds-rules", Domain: "xds"}
	for key, n := range limits {
		conf.Descriptors = append(conf.Descriptors, &rlconf.RateLimitDescriptor{
			Key: key, RateLimit: &rlconf.RateLimitPolicy{Unit: unit, RequestsPerUnit: n},
		})
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: {conf}})
	if err != nil {
		t.Fatal(err)
	}
	if err := x.cache.SetSnapshot(context.Background(), "sluice-test", snap); err != nil {
		t.Fatal(err)
	}
}

func (x *xdsServer) nacked() []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]string(nil), x.nacks...)
}

// TestServeE2EXDS: with envoy-rl's CONFIG_TYPE=GRPC_XDS_SOTW, the rules
// come from a real go-control-plane xDS server: not ready until the first
// rules arrive; a new snapshot is put in force; an invalid one is refused
// with a NACK naming the problem, and the rules in force stay.
func TestServeE2EXDS(t *testing.T) {
	x := startXDS(t)
	p := startSluice(t, []string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + x.addr, "CONFIG_GRPC_XDS_NODE_ID=sluice-test"})
	if code, _, _ := p.http("GET", "/readyz", ""); code != 503 {
		t.Errorf("/readyz before the first rules: %d, want 503", code)
	}
	x.set(t, "1", map[string]uint32{"user": 1}, rlconf.RateLimitUnit_DAY)
	poll(t, "the first xDS rules", func() bool {
		code, _, _ := p.http("GET", "/readyz", "")
		return code == 200
	})
	for i, want := range []string{"OK:OK", "OVER_LIMIT:OVER_LIMIT"} {
		if got := codesOf(p.must("xds", desc("user", "a"))); got != want {
			t.Errorf("request %d: %s, want %s", i+1, got, want)
		}
	}
	x.set(t, "2", map[string]uint32{"user": 1, "ip": 1}, rlconf.RateLimitUnit_DAY)
	poll(t, "the second snapshot", func() bool {
		r, err := p.rl("xds", peek(desc("ip", "1")))
		return err == nil && r.GetStatuses()[0].GetCurrentLimit() != nil
	})
	// An invalid snapshot: a unit envoy-rl refuses too.
	x.set(t, "3", map[string]uint32{"user": 7}, rlconf.RateLimitUnit_UNKNOWN)
	poll(t, "a NACK", func() bool { return len(x.nacked()) > 0 })
	if n := x.nacked()[0]; !containsAll(n, "xds:xds-rules", "invalid rate limit unit") {
		t.Errorf("NACK %q", n)
	}
	if got := codesOf(p.must("xds", desc("user", "a"))); got != "OVER_LIMIT:OVER_LIMIT" {
		t.Errorf("after the refused snapshot: %s, want the rules in force", got)
	}
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}
