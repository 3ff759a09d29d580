package main

import (
	"crypto/tls"
	"crypto/x509"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluicehq/sluice/internal/testsupport/xdstest"
)

// xdsServer is a real go-control-plane xDS management server on loopback,
// serving RateLimitConfig snapshots to node "sluice-test".
type xdsServer struct{ *xdstest.Server }

func startXDS(t *testing.T, opts ...grpc.ServerOption) *xdsServer {
	t.Helper()
	return &xdsServer{xdstest.Start(t, opts...)}
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
	x.Set(t, "sluice-test", version, conf)
}

func (x *xdsServer) nacked() []*discovery.DiscoveryRequest {
	nacks, _ := x.NACKs()
	return nacks
}

// TestServeE2EXDS: with envoy-rl's CONFIG_TYPE=GRPC_XDS_SOTW, the rules
// come from a real go-control-plane xDS server: not ready until the first
// rules arrive, and its log says so (not ready yet, then ready); a new snapshot is put in force; an invalid one is refused
// with a NACK naming the problem and the version in force, and the rules
// in force stay. The server's snapshot cache sends the refused snapshot
// again in answer to every NACK: sluice logs it once (one ERROR line) and
// NACKs it again once a second, not thousands of times.
func TestServeE2EXDS(t *testing.T) {
	beside(t)
	x := startXDS(t)
	p := startSluice(t, []string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + x.Addr, "CONFIG_GRPC_XDS_NODE_ID=sluice-test"})
	if code, _, _ := p.http("GET", "/readyz", ""); code != 503 {
		t.Errorf("/readyz before the first rules: %d, want 503", code)
	}
	// The log says what /readyz says: not ready, then ready.
	p.waitLog("not ready yet: waiting for the first rules from the xDS server")
	if strings.Contains(p.log(), `"msg":"ready"`) {
		t.Errorf("logged ready before the first rules:\n%s", p.log())
	}
	x.set(t, "1", map[string]uint32{"user": 1}, rlconf.RateLimitUnit_DAY)
	poll(t, "the first xDS rules", func() bool {
		code, _, _ := p.http("GET", "/readyz", "")
		return code == 200
	})
	p.waitLog(`"msg":"ready"`, `"domains":["xds"]`)
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
	start := time.Now()
	if n := x.nacked()[0]; !containsAll(n.GetErrorDetail().GetMessage(), "xds:xds-rules", "invalid rate limit unit") || n.GetVersionInfo() != "2" {
		t.Errorf("NACK of version %q: %q, want the version in force, 2, and the problem", n.GetVersionInfo(), n.GetErrorDetail().GetMessage())
	}
	time.Sleep(2500 * time.Millisecond)
	nacks, elapsed := len(x.nacked()), time.Since(start)
	if most := int(elapsed/time.Second) + 2; nacks < 2 || nacks > most {
		t.Errorf("%d NACKs in %v, want at least 2 and at most %d: one a second", nacks, elapsed.Round(time.Millisecond), most)
	}
	if errors := strings.Count(p.log(), `"level":"ERROR"`); errors != 1 || strings.Count(p.log(), "xDS rules refused") != 1 {
		t.Errorf("%d ERROR lines after %d NACKs, want one, the refusal:\n%s", errors, nacks, p.log())
	}
	if got := codesOf(p.must("xds", desc("user", "a"))); got != "OVER_LIMIT:OVER_LIMIT" {
		t.Errorf("after the refused snapshot: %s, want the rules in force", got)
	}
}

// TestServeE2EXDSMutualTLS: with envoy-rl's CONFIG_GRPC_XDS_SERVER_USE_TLS
// and its files, the rules come from a real go-control-plane xDS server
// that speaks TLS only and requires a client certificate of its CA: a
// sluice that trusts the server's CA and shows such a certificate gets the
// rules; one that shows none is refused by the server, and one that does
// not trust the server's CA refuses it; neither becomes ready, and each
// says why.
func TestServeE2EXDSMutualTLS(t *testing.T) {
	beside(t)
	dir := t.TempDir()
	serverCA, clientCA := newTestCA(t, "xds server CA"), newTestCA(t, "xds client CA")
	files := map[string][]byte{"server-ca.crt": serverCA.PEM, "client-ca.crt": clientCA.PEM}
	files["client.crt"], files["client.key"] = issue(t, clientCA, 20, false, "sluice.mesh")
	srvCert, srvKey := issue(t, serverCA, 21, true, "xds.mesh")
	for name, b := range files {
		writeRules(t, filepath.Join(dir, name), string(b))
	}
	pair, err := tls.X509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	clients := x509.NewCertPool()
	clients.AddCert(clientCA.Cert)
	x := startXDS(t, grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{pair}, ClientCAs: clients, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
	})))
	x.set(t, "1", map[string]uint32{"user": 1}, rlconf.RateLimitUnit_DAY)
	env := func(extra ...string) []string {
		return append([]string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + x.Addr, "CONFIG_GRPC_XDS_NODE_ID=sluice-test",
			"CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=100ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL=200ms"}, extra...)
	}
	good := startSluice(t, env("CONFIG_GRPC_XDS_SERVER_TLS_CACERT="+filepath.Join(dir, "server-ca.crt"),
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT="+filepath.Join(dir, "client.crt"), "CONFIG_GRPC_XDS_CLIENT_TLS_KEY="+filepath.Join(dir, "client.key")))
	poll(t, "the rules over mutual TLS", func() bool {
		code, _, _ := good.http("GET", "/readyz", "")
		return code == 200
	})
	if got := codesOf(good.must("xds", desc("user", "a"))); got != "OK:OK" {
		t.Errorf("over mutual TLS: %s, want OK:OK", got)
	}
	for _, c := range []struct {
		name, why string
		extra     []string
	}{
		{"no client certificate", "certificate required", []string{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT=" + filepath.Join(dir, "server-ca.crt")}},
		{"untrusted server", "certificate signed by unknown authority", []string{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT=" + filepath.Join(dir, "client-ca.crt"),
			"CONFIG_GRPC_XDS_CLIENT_TLS_CERT=" + filepath.Join(dir, "client.crt"), "CONFIG_GRPC_XDS_CLIENT_TLS_KEY=" + filepath.Join(dir, "client.key")}},
	} {
		p := launch(t, env(c.extra...))
		p.waitLog("xDS stream to the management server failed", c.why)
		// A second failure: it tries again, and still gets nothing.
		poll(t, c.name+": a second failed stream", func() bool {
			return strings.Count(p.log(), "xDS stream to the management server failed") >= 2
		})
		if code, _, _ := p.http("GET", "/readyz", ""); code != 503 {
			t.Errorf("%s: /readyz %d, want 503", c.name, code)
		}
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
