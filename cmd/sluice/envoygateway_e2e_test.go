package main

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
	"github.com/sluicehq/sluice/internal/testsupport/testpki"
)

// envoyGatewayDeployment is Envoy Gateway's own envoy-ratelimit
// Deployment (testdata/envoygateway/README.md says from where).
func envoyGatewayDeployment(t *testing.T) *appsv1.Deployment {
	t.Helper()
	data, err := os.ReadFile("testdata/envoygateway/default.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict(data, &d); err != nil {
		t.Fatal(err)
	}
	return &d
}

// egRateLimitConfig is a RateLimitConfig as Envoy Gateway's translator
// emits it for a listener (internal/xds/translator/testdata/out/
// ratelimit-config there): a domain per listener, a descriptor per route
// holding one per rule, the rule's limit at the leaf; here a rule of n a
// hour per x-user-id, a rule in shadow mode, an unlimited one, and the
// extras envoy-rl reads (name, replaces, quota_mode, metadata).
func egRateLimitConfig(n uint32) *rlconf.RateLimitConfig {
	leaf := func(rule string, d *rlconf.RateLimitDescriptor) *rlconf.RateLimitDescriptor {
		return &rlconf.RateLimitDescriptor{Key: rule, Value: rule, Descriptors: []*rlconf.RateLimitDescriptor{d}}
	}
	meta, _ := structpb.NewStruct(map[string]any{"rule": "rule-0"})
	return &rlconf.RateLimitConfig{
		Name:   "first-listener",
		Domain: "first-listener",
		Descriptors: []*rlconf.RateLimitDescriptor{{
			Key: "first-route", Value: "first-route",
			Descriptors: []*rlconf.RateLimitDescriptor{
				leaf("rule-0-match-0", &rlconf.RateLimitDescriptor{Key: "x-user-id",
					RateLimit: &rlconf.RateLimitPolicy{Unit: rlconf.RateLimitUnit_HOUR, RequestsPerUnit: n, Name: "per-user", Replaces: []*rlconf.RateLimitReplace{}},
					Metadata:  meta}),
				leaf("rule-1-match-0", &rlconf.RateLimitDescriptor{Key: "x-user-id", ShadowMode: true,
					RateLimit: &rlconf.RateLimitPolicy{Unit: rlconf.RateLimitUnit_HOUR, RequestsPerUnit: 1}}),
				leaf("rule-2-match-0", &rlconf.RateLimitDescriptor{Key: "x-user-id",
					RateLimit: &rlconf.RateLimitPolicy{Unlimited: true}}),
				leaf("rule-3-match-0", &rlconf.RateLimitDescriptor{Key: "x-user-id", QuotaMode: true,
					RateLimit: &rlconf.RateLimitPolicy{Unit: rlconf.RateLimitUnit_HOUR, RequestsPerUnit: 1}}),
			},
		}},
	}
}

// egDesc is the descriptor Envoy sends for rule of first-route and user.
func egDesc(rule, user string) *ratelimitv3.RateLimitDescriptor {
	return desc("first-route", "first-route", rule, rule, "x-user-id", user)
}

// TestEnvoyGatewayDropIn runs the binary exactly as Envoy Gateway's
// generated Deployment runs envoyproxy/ratelimit: as /bin/ratelimit with
// no arguments and that Deployment's environment, copied unchanged but
// for what names the world outside this machine (the files under /certs,
// here certificates made for the test from one CA as Envoy Gateway's are;
// the xDS server's and Redis's addresses; the Prometheus port) and the
// listeners' ports, on free loopback ports. With a go-control-plane xDS
// server over mutual TLS pushing a RateLimitConfig as Envoy Gateway's
// translator emits it: healthy (its probes' /healthcheck) before any
// config; the config put in force; ShouldRateLimit answered per the
// config over mutual TLS with Envoy's client certificate (and refused
// without one: Envoy Gateway's GRPC_SERVER_TLS_CA_CERT); a per-descriptor
// hits_addend and limit override, shadow mode, unlimited and quota mode
// honoured; an updated config put in force; /metrics on PROMETHEUS_ADDR,
// where Envoy Gateway's pod annotations have Prometheus scrape.
func TestEnvoyGatewayDropIn(t *testing.T) {
	eg := startAsEnvoyGateway(t)
	p := eg.p
	eg.connectAsEnvoy(t)
	eg.x.Set(t, "envoy-ratelimit", "1", egRateLimitConfig(3))
	poll(t, "the first config in force", func() bool {
		resp, err := p.rl("first-listener", peek(egDesc("rule-0-match-0", "probe")))
		return err == nil && len(resp.Statuses) == 1 && resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() == 3
	})
	if got := codesOf(p.must("first-listener", egDesc("rule-0-match-0", "a"), egDesc("rule-0-match-0", "a"))); got != "OK:OK,OK" {
		t.Errorf("two of 3 an hour: %s", got)
	}
	// hits_addend per descriptor: 2 more, past the 3.
	two := egDesc("rule-0-match-0", "a")
	two.HitsAddend = wrapperspb.UInt64(2)
	if got := codesOf(p.must("first-listener", two)); got != "OVER_LIMIT:OVER_LIMIT" {
		t.Errorf("hits_addend 2 after 2 of 3: %s", got)
	}
	// The descriptor's limit override (Envoy Gateway's cost and per-route
	// overrides): 10 an hour for this request.
	over := egDesc("rule-0-match-0", "b")
	over.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 10, Unit: typev3.RateLimitUnit_HOUR}
	over.HitsAddend = wrapperspb.UInt64(9)
	if resp := p.must("first-listener", over); codesOf(resp) != "OK:OK" || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 10 {
		t.Errorf("a limit override of 10, 9 hits: %s, limit %v", codesOf(resp), resp.Statuses[0].CurrentLimit)
	}
	// Shadow mode: over its limit, answered OK; unlimited: always OK;
	// quota mode: a quota alone over its limit denies.
	for i, want := range []string{"OK:OK", "OK:OK"} {
		if got := codesOf(p.must("first-listener", egDesc("rule-1-match-0", "s"))); got != want {
			t.Errorf("shadow mode, request %d: %s, want %s", i+1, got, want)
		}
	}
	for range 5 {
		if got := codesOf(p.must("first-listener", egDesc("rule-2-match-0", "u"))); got != "OK:OK" {
			t.Errorf("unlimited: %s", got)
		}
	}
	p.must("first-listener", egDesc("rule-3-match-0", "q"))
	if got := codesOf(p.must("first-listener", egDesc("rule-3-match-0", "q"))); got != "OVER_LIMIT:OVER_LIMIT" {
		t.Errorf("quota mode, alone and over: %s", got)
	}

	// Without Envoy's client certificate, no answer.
	bare, err := grpc.NewClient(eg.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: eg.pool, ServerName: "envoy-rate-limit", MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	if _, err := rlsv3.NewRateLimitServiceClient(bare).ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "first-listener", Descriptors: []*ratelimitv3.RateLimitDescriptor{egDesc("rule-2-match-0", "u")}}); err == nil {
		t.Errorf("answered a client without a certificate")
	}

	// An updated config: 100 an hour.
	eg.x.Set(t, "envoy-ratelimit", "2", egRateLimitConfig(100))
	poll(t, "the updated config in force", func() bool {
		resp, err := p.rl("first-listener", peek(egDesc("rule-0-match-0", "probe")))
		return err == nil && len(resp.Statuses) == 1 && resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() == 100
	})
	if code, _, _ := p.http("GET", "/healthcheck", ""); code != 200 {
		t.Errorf("/healthcheck %d with the config in force", code)
	}

	checkEnvoyGatewayMetrics(t, eg.metricsAddr)
}

// egRun is the binary running as Envoy Gateway runs envoy-rl, and what
// the test needs of its world.
type egRun struct {
	p                               *proc
	x                               *xdsServer
	pool                            *x509.CertPool // the CA of every certificate
	envoyCert, envoyKey             []byte         // Envoy's client certificate
	httpAddr, grpcAddr, metricsAddr string
}

// startAsEnvoyGateway starts the binary as /bin/ratelimit with no
// arguments and Envoy Gateway's environment (see TestEnvoyGatewayDropIn),
// and waits for its probes' /healthcheck.
func startAsEnvoyGateway(t *testing.T) *egRun {
	bin := sluiceBinary(t)
	d := envoyGatewayDeployment(t)
	c := d.Spec.Template.Spec.Containers[0]
	if len(c.Command) != 1 || c.Command[0] != "/bin/ratelimit" || len(c.Args) != 0 {
		t.Fatalf("Envoy Gateway runs %q %q; this test runs /bin/ratelimit with no arguments", c.Command, c.Args)
	}
	dir := t.TempDir()
	ratelimit := binAsRatelimit(t, bin, dir)

	certs, eg := egCertificates(t, dir)
	x := startXDS(t, grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{eg.xdsPair}, ClientCAs: eg.pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
	})))
	r := redistest.Standalone(t)

	mapping, err := filepath.Abs("testdata/envoygateway/statsd_conf.yaml")
	if err != nil {
		t.Fatal(err)
	}
	httpAddr, grpcAddr, metricsAddr := "127.0.0.1:"+freePort(t), "127.0.0.1:"+freePort(t), "127.0.0.1:"+freePort(t)
	env := []string{"PATH=" + os.Getenv("PATH"), "GORACE=halt_on_error=1 atexit_sleep_ms=50",
		"HOST=127.0.0.1", "PORT=" + portOf(httpAddr), "GRPC_HOST=127.0.0.1", "GRPC_PORT=" + portOf(grpcAddr), "DEBUG_PORT=" + freePort(t)}
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			t.Fatalf("%s: a value from elsewhere, which this test does not resolve", e.Name)
		}
		v := e.Value
		switch e.Name {
		case "CONFIG_GRPC_XDS_SERVER_URL":
			v = x.Addr
		case "REDIS_URL":
			v = r.Addr()
		case "PROMETHEUS_ADDR":
			v = metricsAddr
		case "PROMETHEUS_MAPPER_YAML":
			// The ConfigMap Envoy Gateway mounts there: its statsd_conf.yaml.
			v = mapping
		}
		if rest, ok := strings.CutPrefix(v, "/certs/"); ok {
			v = filepath.Join(certs, rest)
		}
		env = append(env, e.Name+"="+v)
	}
	cmd := exec.Command(ratelimit)
	cmd.Env = env
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, ready: make(chan struct{}), done: make(chan struct{}), grpcAddr: grpcAddr, httpAddr: httpAddr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go p.read(stderr)
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
		if t.Failed() || strings.Contains(p.log(), "DATA RACE") {
			t.Errorf("/bin/ratelimit log:\n%s", p.log())
		}
	})

	// Its probes: /healthcheck on 8080, healthy with no config yet.
	poll(t, "/healthcheck before any config", func() bool {
		resp, err := http.Get("http://" + httpAddr + "/healthcheck")
		if err != nil {
			return false // not listening yet
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})

	return &egRun{p: p, x: x, pool: eg.pool, envoyCert: eg.envoyCert, envoyKey: eg.envoyKey, httpAddr: httpAddr, grpcAddr: grpcAddr, metricsAddr: metricsAddr}
}

// binAsRatelimit links bin as dir/bin/ratelimit, the image's
// /bin/ratelimit, and returns the link's path.
func binAsRatelimit(t *testing.T, bin, dir string) string {
	t.Helper()
	ratelimit := filepath.Join(dir, "bin", "ratelimit")
	if err := os.MkdirAll(filepath.Dir(ratelimit), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(bin, ratelimit); err != nil {
		t.Fatal(err)
	}
	return ratelimit
}

// egCerts are the certificates of Envoy Gateway's world, from one CA.
type egCerts struct {
	pool                *x509.CertPool
	envoyCert, envoyKey []byte
	xdsPair             tls.Certificate
}

// egCertificates writes the rate limit service's files as Envoy Gateway
// mounts them on /certs (tls.crt, tls.key, ca.crt) into dir/certs, and
// makes Envoy's and the xDS server's certificates.
func egCertificates(t *testing.T, dir string) (string, egCerts) {
	t.Helper()
	// One CA, as Envoy Gateway's certgen: the rate limit service's
	// certificate serves gRPC and is its xDS client certificate; Envoy
	// and the xDS server have their own.
	ca := newTestCA(t, "envoy-gateway")
	leaf := testpki.Leaf{Serial: 1, Name: "envoy-rate-limit", DNSNames: []string{"envoy-rate-limit", "envoy-rate-limit.envoy-gateway-system"},
		IPs: []net.IP{net.ParseIP("127.0.0.1")}, Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	rlCert, rlKey, _, err := ca.Issue(leaf)
	if err != nil {
		t.Fatal(err)
	}
	certs := filepath.Join(dir, "certs")
	if err := os.MkdirAll(certs, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"tls.crt": rlCert, "tls.key": rlKey, "ca.crt": ca.PEM} {
		writeRules(t, filepath.Join(certs, name), string(b))
	}
	var eg egCerts
	eg.envoyCert, eg.envoyKey = issue(t, ca, 2, false, "envoy")
	xdsCert, xdsKey := issue(t, ca, 3, true, "envoy-gateway")
	eg.pool = x509.NewCertPool()
	eg.pool.AddCert(ca.Cert)
	eg.xdsPair, err = tls.X509KeyPair(xdsCert, xdsKey)
	if err != nil {
		t.Fatal(err)
	}
	return certs, eg
}

// connectAsEnvoy connects to the gRPC listener with Envoy's certificate.
func (eg *egRun) connectAsEnvoy(t *testing.T) {
	t.Helper()
	envoyCert, envoyKey, pool, grpcAddr, p := eg.envoyCert, eg.envoyKey, eg.pool, eg.grpcAddr, eg.p
	envoyPair, err := tls.X509KeyPair(envoyCert, envoyKey)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{envoyPair}, RootCAs: pool, ServerName: "envoy-rate-limit", MinVersion: tls.VersionTLS12,
	})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	p.conn = conn

}

// checkEnvoyGatewayMetrics scrapes the metrics listener as Prometheus
// does.
func checkEnvoyGatewayMetrics(t *testing.T, metricsAddr string) {
	t.Helper()
	// Where Envoy Gateway's annotations have Prometheus scrape: sluice's
	// metrics, and envoy-rl's stats named by Envoy Gateway's mapping, as
	// its dashboards read them.
	// Prometheus asks for OpenMetrics first.
	req, _ := http.NewRequest("GET", "http://"+metricsAddr+"/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	code, body := resp.StatusCode, string(b)
	if code != 200 || !strings.Contains(body, `sluice_rule_over_limit_total{`) || !strings.Contains(body, `domain="first-listener"`) {
		t.Errorf("/metrics on PROMETHEUS_ADDR: %d\n%s", code, grepLines(body, "sluice_rule"))
	}
	for _, want := range []string{
		// 2 + 2 hits of rule 0's user a (2 over), 9 of b, 1 of the probe
		// before the update: first-route's key and value.
		`ratelimit_service_rate_limit_total_hits{domain="first-listener",key1="first-route_first-route",key2="rule-0-match-0_rule-0-match-0"} 13`,
		`ratelimit_service_rate_limit_over_limit{domain="first-listener",key1="first-route_first-route",key2="rule-0-match-0_rule-0-match-0"} 2`,
		`ratelimit_service_rate_limit_shadow_mode{domain="first-listener",key1="first-route_first-route",key2="rule-1-match-0_rule-1-match-0"} 1`,
		`ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}`,
		`ratelimit_service_response_time_seconds_bucket{grpc_method="ShouldRateLimit",le="0.005"}`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics on PROMETHEUS_ADDR has no %s:\n%s", want, grepLines(body, "ratelimit_"))
		}
	}
}

func portOf(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return port
}
