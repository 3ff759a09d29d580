package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
	"github.com/sluicehq/sluice/internal/testsupport/testpki"
)

// newTestCA is testpki.NewCA for a test.
func newTestCA(t *testing.T, name string) *testpki.CA {
	t.Helper()
	ca, err := testpki.NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// issue returns a certificate and key (PEM) signed by ca with serial, for
// a server (127.0.0.1) or a client (the DNS name dns).
func issue(t *testing.T, ca *testpki.CA, serial int64, server bool, dns string) (certPEM, keyPEM []byte) {
	t.Helper()
	leaf := testpki.Leaf{Serial: serial, Name: dns, DNSNames: []string{dns}, Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		leaf.Usages = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		leaf.IPs = []net.IP{net.ParseIP("127.0.0.1")}
	}
	c, k, _, err := ca.Issue(leaf)
	if err != nil {
		t.Fatal(err)
	}
	return c, k
}

// TestServeE2ETLS: the gRPC listener with TLS and mutual TLS, set by
// envoyproxy/ratelimit's variables, tested with real TLS clients: a client
// that trusts the server's CA and shows a certificate for the required
// name (in any case, with or without a trailing dot) is answered; a
// client without a certificate, with one of another CA, with one for
// another name or for a wildcard that covers the name (*.mesh), or
// without TLS at all, is refused. A rotated server certificate is served
// to new connections.
func TestServeE2ETLS(t *testing.T) {
	beside(t)
	dir := t.TempDir()
	serverCA, clientCA, otherCA := newTestCA(t, "server CA"), newTestCA(t, "client CA"), newTestCA(t, "other CA")
	cert, key := issue(t, serverCA, 10, true, "sluice")
	certFile, keyFile, clientCAFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt")
	writeRules(t, certFile, string(cert))
	writeRules(t, keyFile, string(key))
	writeRules(t, clientCAFile, string(clientCA.PEM))
	rules := filepath.Join(dir, "rules.yaml")
	writeRules(t, rules, dayRule("tls", "k", 100))

	p := launch(t, []string{
		"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=" + certFile, "GRPC_SERVER_TLS_KEY=" + keyFile,
		"GRPC_CLIENT_TLS_CACERT=" + clientCAFile, "GRPC_CLIENT_TLS_SAN=envoy.mesh",
	}, "--config", rules)
	p.waitReady()

	roots := x509.NewCertPool()
	roots.AddCert(serverCA.Cert)
	call := func(creds credentials.TransportCredentials) error {
		t.Helper()
		conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tls", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", "v")}})
		if err == nil && codesOf(r) != "OK:OK" {
			t.Errorf("answer %s", codesOf(r))
		}
		return err
	}
	client := func(ca *testpki.CA, dns string) credentials.TransportCredentials {
		c, k := issue(t, ca, 20, false, dns)
		pair, err := tls.X509KeyPair(c, k)
		if err != nil {
			t.Fatal(err)
		}
		return credentials.NewTLS(&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}})
	}
	for _, name := range []string{"envoy.mesh", "Envoy.MESH."} {
		if err := call(client(clientCA, name)); err != nil {
			t.Errorf("a client with a certificate for %s: %v", name, err)
		}
	}
	for what, creds := range map[string]credentials.TransportCredentials{
		"no client certificate":     credentials.NewTLS(&tls.Config{RootCAs: roots}),
		"a certificate of other CA": client(otherCA, "envoy.mesh"),
		"a certificate for another": client(clientCA, "stranger.mesh"),
		"a wildcard certificate":    client(clientCA, "*.mesh"),
		"plain text":                insecure.NewCredentials(),
	} {
		if err := call(creds); err == nil {
			t.Errorf("%s: answered, want refused", what)
		}
	}

	// Rotation: a new certificate in the same files is served to the
	// connections that follow.
	served := func() int64 {
		c, k := issue(t, clientCA, 30, false, "envoy.mesh")
		pair, _ := tls.X509KeyPair(c, k)
		conn, err := tls.Dial("tcp", p.grpcAddr, &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}, NextProtos: []string{"h2"}})
		if err != nil {
			t.Fatalf("TLS dial: %v", err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
	}
	if got := served(); got != 10 {
		t.Fatalf("serial %d served, want 10", got)
	}
	cert, key = issue(t, serverCA, 11, true, "sluice")
	writeRules(t, keyFile, string(key))
	writeRules(t, certFile, string(cert))
	poll(t, "the rotated certificate", func() bool { return served() == 11 })
}

// TestServeE2ERedisClientCert: with envoy-rl's REDIS_TLS,
// REDIS_TLS_CACERT and REDIS_TLS_CLIENT_CERT/_KEY, sluice shows its
// certificate to a real redis-server that asks clients for one
// (tls-auth-clients yes), and decides there: a limit of 1 a day admits
// one request and denies the next. Without the certificate the server
// refuses the connection: the node says Redis is not reachable and is
// not ready.
func TestServeE2ERedisClientCert(t *testing.T) {
	beside(t)
	srv := redistest.Standalone(t, redistest.WithTLS(), redistest.WithConfig("tls-auth-clients", "yes"))
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, dayRule("mtls", "k", 1))
	env := []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + srv.Addr(), "REDIS_TLS=true", "REDIS_TLS_CACERT=" + srv.CAFile,
		"CACHE_KEY_PREFIX=" + t.Name() + ":"}
	p := startSluice(t, append(env, "REDIS_TLS_CLIENT_CERT="+srv.CertFile, "REDIS_TLS_CLIENT_KEY="+srv.KeyFile), "--config", rules, "--local-cache-size", "0")
	for i, want := range []string{"OK:OK", "OVER_LIMIT:OVER_LIMIT"} {
		if got := codesOf(p.must("mtls", desc("k", "v"))); got != want {
			t.Errorf("request %d with the client certificate: %s, want %s", i+1, got, want)
		}
	}
	if keys, _ := srv.Cmd("KEYS", t.Name()+":*").([]any); len(keys) == 0 {
		t.Errorf("no counter in Redis under %s:*: the decisions were not made there", t.Name())
	}
	bare := launch(t, env, "--config", rules, "--local-cache-size", "0")
	bare.waitReady() // listening (the process serves, not ready)
	bare.waitLog("Redis is not reachable")
	poll(t, "not ready without a client certificate", func() bool {
		code, _, _ := bare.http("GET", "/readyz", "")
		return code == 503
	})
}

// mtlsCall makes a ShouldRateLimit call to addr over TLS, trusting
// serverCA, with a client certificate of clientCA for envoy.mesh (none
// when clientCA is nil), and returns its error.
func mtlsCall(t *testing.T, addr string, serverCA, clientCA *testpki.CA) error {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AddCert(serverCA.Cert)
	cfg := &tls.Config{RootCAs: roots}
	if clientCA != nil {
		c, k := issue(t, clientCA, 20, false, "envoy.mesh")
		pair, err := tls.X509KeyPair(c, k)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tls", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", "v")}})
	return err
}

// tlsFiles writes a server certificate and key of serverCA (serial) and
// clientCA's PEM into dir, and returns their paths.
func tlsFiles(t *testing.T, dir string, serverCA, clientCA *testpki.CA, serial int64) (certFile, keyFile, caFile string) {
	t.Helper()
	cert, key := issue(t, serverCA, serial, true, "sluice")
	certFile, keyFile, caFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt")
	writeRules(t, certFile, string(cert))
	writeRules(t, keyFile, string(key))
	writeRules(t, caFile, string(clientCA.PEM))
	return certFile, keyFile, caFile
}

// TestServeE2EEmptyCAVariable: an empty variable of the client CA counts
// as unset, so the next one in precedence still requires client
// certificates: GRPC_CLIENT_TLS_CACERT= beside Envoy Gateway's
// GRPC_SERVER_TLS_CA_CERT, and SLUICE_GRPC_CLIENT_CA= beside
// GRPC_CLIENT_TLS_CACERT. Real handshakes: a client without a certificate
// is refused, one with a certificate of the CA answered.
func TestServeE2EEmptyCAVariable(t *testing.T) {
	beside(t)
	dir := t.TempDir()
	serverCA, clientCA := newTestCA(t, "server CA"), newTestCA(t, "client CA")
	certFile, keyFile, caFile := tlsFiles(t, dir, serverCA, clientCA, 10)
	rules := filepath.Join(dir, "rules.yaml")
	writeRules(t, rules, dayRule("tls", "k", 100))
	base := []string{"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=" + certFile, "GRPC_SERVER_TLS_KEY=" + keyFile}
	for name, env := range map[string][]string{
		"GRPC_CLIENT_TLS_CACERT empty": {"GRPC_CLIENT_TLS_CACERT=", "GRPC_SERVER_TLS_CA_CERT=" + caFile},
		"SLUICE_GRPC_CLIENT_CA empty":  {"SLUICE_GRPC_CLIENT_CA=", "GRPC_CLIENT_TLS_CACERT=" + caFile},
	} {
		t.Run(name, func(t *testing.T) {
			p := launch(t, append(slices.Clone(base), env...), "--config", rules)
			p.waitReady()
			p.waitLog("gRPC listener speaks TLS", `"mutual":true`)
			if err := mtlsCall(t, p.grpcAddr, serverCA, nil); err == nil {
				t.Error("a client without a certificate was answered: mutual TLS is off")
			}
			if err := mtlsCall(t, p.grpcAddr, serverCA, clientCA); err != nil {
				t.Errorf("a client with a certificate of the CA: %v", err)
			}
		})
	}
}

// TestServeE2EClientCAReload: the CA of client certificates is reloaded as
// the server certificate is, when its file changes (a kubelet-style swap
// of the ..data symlink): without a restart the old CA's clients are
// refused and the new CA's answered. A file swapped in that is not a CA,
// or a key that does not match, is kept out: the files in force stay, a
// WARN says so, and sluice_grpc_tls_loads_total counts the failure.
func TestServeE2EClientCAReload(t *testing.T) {
	beside(t)
	dir := t.TempDir()
	serverCA, oldCA, newCA := newTestCA(t, "server CA"), newTestCA(t, "old client CA"), newTestCA(t, "new client CA")
	// A ConfigMap-style mount: tls.crt -> ..data/tls.crt, ..data -> ..v1.
	v1 := filepath.Join(dir, "..v1")
	if err := os.Mkdir(v1, 0o755); err != nil {
		t.Fatal(err)
	}
	tlsFiles(t, v1, serverCA, oldCA, 10)
	if err := os.Symlink("..v1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tls.crt", "tls.key", "ca.crt"} {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	swap := func(version string) {
		t.Helper()
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(version, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	rules := filepath.Join(dir, "rules.yaml")
	writeRules(t, rules, dayRule("tls", "k", 100))
	p := launch(t, nil, "--config", rules, "--grpc-tls-cert", filepath.Join(dir, "tls.crt"), "--grpc-tls-key", filepath.Join(dir, "tls.key"),
		"--grpc-client-ca", filepath.Join(dir, "ca.crt"))
	p.waitReady()
	if err := mtlsCall(t, p.grpcAddr, serverCA, oldCA); err != nil {
		t.Fatalf("a client of the CA in force: %v", err)
	}
	if err := mtlsCall(t, p.grpcAddr, serverCA, newCA); err == nil {
		t.Fatal("a client of another CA was answered")
	}

	v2 := filepath.Join(dir, "..v2")
	if err := os.Mkdir(v2, 0o755); err != nil {
		t.Fatal(err)
	}
	tlsFiles(t, v2, serverCA, newCA, 11)
	swap("..v2")
	poll(t, "the new CA's client answered", func() bool { return mtlsCall(t, p.grpcAddr, serverCA, newCA) == nil })
	if err := mtlsCall(t, p.grpcAddr, serverCA, oldCA); err == nil {
		t.Error("after the swap, a client of the old CA was answered")
	}
	p.waitLog("gRPC TLS file reloaded", `"file":"client_ca"`)

	// Garbage swapped in: kept out, said, counted.
	v3 := filepath.Join(dir, "..v3")
	if err := os.Mkdir(v3, 0o755); err != nil {
		t.Fatal(err)
	}
	tlsFiles(t, v3, serverCA, newCA, 12)
	writeRules(t, filepath.Join(v3, "ca.crt"), "not a certificate\n")
	_, otherKey := issue(t, serverCA, 13, true, "sluice")
	writeRules(t, filepath.Join(v3, "tls.key"), string(otherKey))
	swap("..v3")
	poll(t, "both failures logged", func() bool {
		if err := mtlsCall(t, p.grpcAddr, serverCA, newCA); err != nil {
			t.Fatalf("after a bad swap, the client of the CA in force: %v", err)
		}
		log := p.log()
		return strings.Contains(log, `"file":"client_ca"`) && strings.Contains(log, `"file":"certificate"`) && strings.Count(log, "gRPC TLS file not reloaded") >= 2
	})
	if err := mtlsCall(t, p.grpcAddr, serverCA, oldCA); err == nil {
		t.Error("after a bad swap, a client of the old CA was answered")
	}
	for _, file := range []string{"certificate", "client_ca"} {
		if got := p.metricSum("sluice_grpc_tls_loads_total", `file="`+file+`"`, `result="failure"`); got < 1 {
			t.Errorf("sluice_grpc_tls_loads_total{file=%q,result=\"failure\"} = %v, want at least 1", file, got)
		}
	}
	if got := p.metricSum("sluice_grpc_tls_loads_total", `file="client_ca"`, `result="success"`); got != 1 {
		t.Errorf("client_ca successes %v, want 1", got)
	}
}
