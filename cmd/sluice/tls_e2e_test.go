package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"path/filepath"
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
// name is answered; a client without a certificate, with one of another
// CA, with one for another name, or without TLS at all, is refused. A
// rotated server certificate is served to new connections.
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
	if err := call(client(clientCA, "envoy.mesh")); err != nil {
		t.Fatalf("a client with a certificate for envoy.mesh: %v", err)
	}
	for what, creds := range map[string]credentials.TransportCredentials{
		"no client certificate":     credentials.NewTLS(&tls.Config{RootCAs: roots}),
		"a certificate of other CA": client(otherCA, "envoy.mesh"),
		"a certificate for another": client(clientCA, "stranger.mesh"),
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
