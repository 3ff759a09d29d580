package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"
)

// envoyRLVariables are every environment variable of envoyproxy/ratelimit
// at f2fb157 (2026-07-05), as its src/settings/settings.go declares them
// (envconfig tags).
const envoyRLVariables = `
	BACKEND_TYPE CACHE_KEY_PREFIX
	CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS
	CONFIG_GRPC_XDS_CLIENT_TLS_CERT CONFIG_GRPC_XDS_CLIENT_TLS_KEY
	CONFIG_GRPC_XDS_NODE_ID CONFIG_GRPC_XDS_NODE_METADATA
	CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL
	CONFIG_GRPC_XDS_SERVER_TLS_CACERT CONFIG_GRPC_XDS_SERVER_TLS_SAN
	CONFIG_GRPC_XDS_SERVER_URL CONFIG_GRPC_XDS_SERVER_USE_TLS CONFIG_TYPE
	DEBUG_HOST DEBUG_PORT DISABLE_STATS EXPIRATION_JITTER_MAX_SECONDS
	EXTRA_TAGS FORCE_START_WITHOUT_INITIAL_CONFIG GRPC_CLIENT_TLS_CACERT
	GRPC_CLIENT_TLS_SAN GRPC_HOST GRPC_MAX_CONNECTION_AGE
	GRPC_MAX_CONNECTION_AGE_GRACE GRPC_PORT GRPC_SERVER_TLS_CERT
	GRPC_SERVER_TLS_KEY GRPC_SERVER_USE_TLS GRPC_UDS
	HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED HOST LIMIT_LIMIT_HEADER
	LIMIT_REMAINING_HEADER LIMIT_RESET_HEADER
	LIMIT_RESPONSE_HEADERS_ENABLED LOCAL_CACHE_SIZE_IN_BYTES LOG_FORMAT
	LOG_LEVEL MEMCACHE_HOST_PORT MEMCACHE_MAX_IDLE_CONNS MEMCACHE_SRV
	MEMCACHE_SRV_REFRESH MEMCACHE_TLS MEMCACHE_TLS_CACERT
	MEMCACHE_TLS_CLIENT_CERT MEMCACHE_TLS_CLIENT_KEY
	MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION MERGE_DOMAIN_CONFIG
	NEAR_LIMIT_RATIO PORT PROMETHEUS_ADDR PROMETHEUS_MAPPER_YAML
	PROMETHEUS_PATH PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS QUOTA_MODE
	REDIS_AUTH REDIS_CLUSTER_PIPELINE_PARALLELISM
	REDIS_HEALTH_CHECK_ACTIVE_CONNECTION REDIS_PERSECOND
	REDIS_PERSECOND_AUTH REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM
	REDIS_PERSECOND_PIPELINE_LIMIT REDIS_PERSECOND_PIPELINE_WINDOW
	REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR REDIS_PERSECOND_POOL_SIZE
	REDIS_PERSECOND_SENTINEL_AUTH REDIS_PERSECOND_SOCKET_TYPE
	REDIS_PERSECOND_TIMEOUT REDIS_PERSECOND_TLS REDIS_PERSECOND_TYPE
	REDIS_PERSECOND_URL REDIS_PIPELINE_LIMIT REDIS_PIPELINE_WINDOW
	REDIS_POOL_ON_EMPTY_BEHAVIOR REDIS_POOL_SIZE REDIS_SENTINEL_AUTH
	REDIS_SOCKET_TYPE REDIS_STARTUP_INITIAL_INTERVAL
	REDIS_STARTUP_MAX_ELAPSED_TIME REDIS_STARTUP_MAX_INTERVAL
	REDIS_TIMEOUT REDIS_TLS REDIS_TLS_CACERT REDIS_TLS_CLIENT_CERT
	REDIS_TLS_CLIENT_KEY REDIS_TLS_SKIP_HOSTNAME_VERIFICATION REDIS_TYPE
	REDIS_URL RESPONSE_DYNAMIC_METADATA RUNTIME_APPDIRECTORY
	RUNTIME_IGNOREDOTFILES RUNTIME_ROOT RUNTIME_SUBDIRECTORY
	RUNTIME_WATCH_ROOT SHADOW_MODE STATSD_HOST STATSD_PORT
	STATS_FLUSH_INTERVAL STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT
	TRACING_ENABLED TRACING_EXPORTER_PROTOCOL TRACING_SAMPLING_RATE
	TRACING_SERVICE_INSTANCE_ID TRACING_SERVICE_NAME
	TRACING_SERVICE_NAMESPACE USE_DOG_STATSD USE_DOG_STATSD_MOGRIFIERS
	USE_PROMETHEUS USE_STATSD XDS_CLIENT_BACKOFF_INITIAL_INTERVAL
	XDS_CLIENT_BACKOFF_JITTER XDS_CLIENT_BACKOFF_MAX_INTERVAL
	XDS_CLIENT_BACKOFF_RANDOM_FACTOR XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES
`

// TestEnvoyVariablesAccountedFor: every envoy-rl variable is honoured
// (mapped onto a flag) or named, with what to use instead, in the one
// warning at start; none is ignored without a word.
func TestEnvoyVariablesAccountedFor(t *testing.T) {
	known := map[string]bool{}
	for _, v := range envoyVars {
		for _, n := range v.names {
			known[n] = true
		}
	}
	for _, u := range envoyUnmapped {
		if known[u.name] {
			t.Errorf("%s is both honoured and named as having no effect", u.name)
		}
		known[u.name] = true
	}
	names := strings.Fields(envoyRLVariables)
	if len(names) < 100 {
		t.Fatalf("%d variables in the table: not the whole list", len(names))
	}
	for _, n := range names {
		if !known[n] {
			t.Errorf("envoy-rl variable %s is neither honoured nor named in the startup warning", n)
		}
	}
	// Every one that has no effect is named when set.
	env := map[string]string{"XDS_CLIENT_BACKOFF_JITTER": "false", "DISABLE_STATS": "true", "REDIS_TIMEOUT": "3s",
		"CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_SERVER_TLS_SAN": "xds.mesh", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "1m"}
	s, err := parseServe([]string{"--config", "r.yaml"}, envMap(env), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(s.envoyIgnored, "; ")
	if len(s.envoyIgnored) != 2 || !strings.Contains(got, "XDS_CLIENT_BACKOFF_JITTER (use nothing: the xDS backoff") || !strings.Contains(got, "DISABLE_STATS") {
		t.Errorf("named as having no effect: %q", got)
	}
	if s.redis.timeout != 3*time.Second {
		t.Errorf("REDIS_TIMEOUT=3s: --redis-timeout %v", s.redis.timeout)
	}
	if !s.xds.tls || s.xds.serverName != "xds.mesh" || s.xds.maxBackoff != time.Minute {
		t.Errorf("xDS TLS and backoff variables: tls %v, server name %q, max backoff %v", s.xds.tls, s.xds.serverName, s.xds.maxBackoff)
	}
}

// TestEnvoyBooleans: the switches of envoy-rl's variables read booleans as
// its envconfig does (strconv.ParseBool: t, TRUE, 1, ...).
func TestEnvoyBooleans(t *testing.T) {
	for _, on := range []string{"t", "TRUE", "1", "true"} {
		s, err := parseServe([]string{"--config", "r.yaml"}, envMap(map[string]string{"USE_STATSD": on, "STATSD_PORT": "9"}), &bytes.Buffer{})
		if err != nil || s.statsd.addr != "localhost:9" {
			t.Errorf("USE_STATSD=%s: --statsd %q, %v", on, s.statsd.addr, err)
		}
	}
	s, err := parseServe([]string{"--config", "r.yaml"}, envMap(map[string]string{"USE_STATSD": "false"}), &bytes.Buffer{})
	if err != nil || s.statsd.addr != "" {
		t.Errorf("USE_STATSD=false: --statsd %q, %v", s.statsd.addr, err)
	}
	// Anything else is an error naming the variable, as envoy-rl's
	// envconfig refuses to start: never a silent false (plain text with
	// GRPC_SERVER_USE_TLS=yes). Every boolean variable, switch or flag.
	var bools []string
	for _, v := range envoyVars {
		for _, n := range v.names {
			if (strings.HasPrefix(n, "USE_") && n != "USE_DOG_STATSD_MOGRIFIERS") || strings.HasSuffix(n, "_USE_TLS") || n == "REDIS_TLS" || n == "SHADOW_MODE" || n == "MERGE_DOMAIN_CONFIG" ||
				n == "FORCE_START_WITHOUT_INITIAL_CONFIG" || n == "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED" || n == "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT" ||
				n == "QUOTA_MODE" || n == "RESPONSE_DYNAMIC_METADATA" || n == "LIMIT_RESPONSE_HEADERS_ENABLED" || n == "TRACING_ENABLED" {
				bools = append(bools, n)
			}
		}
	}
	slices.Sort(bools)
	bools = slices.Compact(bools)
	for _, name := range envoyBools {
		if !slices.Contains(bools, name) {
			t.Errorf("switch %s is not among the variables tested", name)
		}
	}
	if len(bools) < 15 {
		t.Fatalf("%d boolean variables found: %v", len(bools), bools)
	}
	for _, name := range bools {
		for _, bad := range []string{"yes", "on", " true", "true ", "ture", ""} {
			env := map[string]string{name: bad, "GRPC_SERVER_TLS_CERT": "c", "GRPC_SERVER_TLS_KEY": "k", "STATSD_PORT": "9"}
			_, err := parseServe([]string{"--config", "r.yaml"}, envMap(env), &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), name+"=") || !strings.Contains(err.Error(), "parse error") {
				t.Errorf("%s=%q: %v, want a parse error naming it", name, bad, err)
			}
		}
	}
	// sluice proxy reads envoy-rl's Redis variables, REDIS_TLS among them.
	if _, err := parseProxy([]string{"--config", "p.yaml", "--upstream", "http://127.0.0.1:1"}, envMap(map[string]string{"REDIS_TLS": "yes"}), &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "parse error") {
		t.Errorf("sluice proxy with REDIS_TLS=yes: %v, want a parse error", err)
	}
}

// TestEnvoyGatewayVariables: the variables Envoy Gateway sets that
// envoy-rl reads otherwise or not at all. GRPC_SERVER_TLS_CA_CERT (envoy-rl
// ignores it) is the CA of client certificates, after envoy-rl's own
// GRPC_CLIENT_TLS_CACERT, with GRPC_SERVER_USE_TLS=true only; USE_PROMETHEUS
// opens the metrics listener on PROMETHEUS_ADDR (:9090 by default, as
// envoy-rl).
func TestEnvoyGatewayVariables(t *testing.T) {
	tlsEnv := map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "c", "GRPC_SERVER_TLS_KEY": "k", "GRPC_SERVER_TLS_CA_CERT": "/certs/ca.crt"}
	for _, c := range []struct {
		env                 map[string]string
		clientCA, metricsAt string
	}{
		{tlsEnv, "/certs/ca.crt", ""},
		{map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "c", "GRPC_SERVER_TLS_KEY": "k", "GRPC_SERVER_TLS_CA_CERT": "/certs/ca.crt", "GRPC_CLIENT_TLS_CACERT": "/own.crt"}, "/own.crt", ""},
		{map[string]string{"GRPC_SERVER_TLS_CA_CERT": "/certs/ca.crt"}, "", ""},
		// An empty variable counts as unset: it never turns mutual TLS off.
		{map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "c", "GRPC_SERVER_TLS_KEY": "k", "GRPC_SERVER_TLS_CA_CERT": "/certs/ca.crt", "GRPC_CLIENT_TLS_CACERT": ""}, "/certs/ca.crt", ""},
		{map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "c", "GRPC_SERVER_TLS_KEY": "k", "GRPC_CLIENT_TLS_CACERT": "/own.crt", "SLUICE_GRPC_CLIENT_CA": ""}, "/own.crt", ""},
		{map[string]string{"SLUICE_GRPC_TLS_CERT": "", "SLUICE_GRPC_TLS_KEY": "", "SLUICE_GRPC_CLIENT_CA": "", "GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "c", "GRPC_SERVER_TLS_KEY": "k", "GRPC_CLIENT_TLS_CACERT": "/own.crt"}, "/own.crt", ""},
		{map[string]string{"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": ":19001"}, "", ":19001"},
		{map[string]string{"USE_PROMETHEUS": "true"}, "", ":9090"},
		{map[string]string{"USE_PROMETHEUS": "false", "PROMETHEUS_ADDR": ":19001"}, "", ""},
	} {
		s, err := parseServe([]string{"--config", "r.yaml"}, envMap(c.env), &bytes.Buffer{})
		if err != nil {
			t.Errorf("%v: %v", c.env, err)
			continue
		}
		if s.tls.clientCA != c.clientCA || s.metricsAddr != c.metricsAt {
			t.Errorf("%v: --grpc-client-ca %q, --metrics-addr %q; want %q, %q", c.env, s.tls.clientCA, s.metricsAddr, c.clientCA, c.metricsAt)
		}
	}
	s, err := parseServe([]string{"--config", "r.yaml"}, envMap(map[string]string{"USE_PROMETHEUS": "true", "PROMETHEUS_MAPPER_YAML": "/etc/statsd-exporter/conf.yaml"}), &bytes.Buffer{})
	if err != nil || s.statsd.mapping != "/etc/statsd-exporter/conf.yaml" {
		t.Errorf("PROMETHEUS_MAPPER_YAML: --metrics-mapping %q, %v", s.statsd.mapping, err)
	}
	if _, err := parseServe([]string{"--config", "r.yaml", "--metrics-mapping", "m.yaml"}, envMap(nil), &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "--metrics-mapping needs --metrics-addr") {
		t.Errorf("--metrics-mapping alone: %v", err)
	}
}

// TestCommandLine: started as ratelimit (the image's /bin/ratelimit, which
// Envoy Gateway runs with no arguments), the binary is sluice serve.
func TestCommandLine(t *testing.T) {
	for _, c := range []struct {
		argv0 string
		args  []string
		want  string
	}{
		{"/bin/ratelimit", nil, "serve"},
		{"ratelimit", []string{"--log-level", "debug"}, "serve --log-level debug"},
		{"/bin/sluice", []string{"version"}, "version"},
		{"/usr/local/bin/sluice", nil, ""},
		{"/bin/ratelimit-old", nil, ""},
	} {
		if got := strings.Join(commandLine(c.argv0, c.args), " "); got != c.want {
			t.Errorf("%s %v: %q, want %q", c.argv0, c.args, got, c.want)
		}
	}
}

// TestEnvoyGatewayVariants: the variables the variants of Envoy Gateway's
// Deployment add (its testdata/deployments at the commit of
// testdata/envoygateway/README.md: redis-tls-settings.yaml,
// enable-tracing.yaml), with their values there, are honoured: no error,
// none named as having no effect, each setting as envoy-rl reads it.
func TestEnvoyGatewayVariants(t *testing.T) {
	env := map[string]string{
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis.redis.svc:6379", "REDIS_TLS": "true",
		"REDIS_TLS_CLIENT_CERT": "/redis-certs/tls.crt", "REDIS_TLS_CLIENT_KEY": "/redis-certs/tls.key", "REDIS_AUTH": "redis_auth_password",
		"TRACING_ENABLED": "true", "TRACING_SERVICE_NAME": "envoy-ratelimit", "TRACING_SERVICE_NAMESPACE": "envoy-gateway-system",
		"TRACING_SERVICE_INSTANCE_ID": "envoy-ratelimit-abc", "TRACING_SAMPLING_RATE": "1.0",
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://trace-collector.envoy-gateway-system.svc.cluster.local:4318",
	}
	s, err := parseServe([]string{"--config", "r.yaml"}, envMap(env), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.envoyIgnored) > 0 {
		t.Errorf("named as having no effect: %q", s.envoyIgnored)
	}
	if s.store != "redis" || s.redis.url != "redis.redis.svc:6379" || !s.redis.tls || s.redis.tlsCert != "/redis-certs/tls.crt" || s.redis.password != "redis_auth_password" {
		t.Errorf("Redis: store %q, url %q, tls %v, cert %q, password set %v", s.store, s.redis.url, s.redis.tls, s.redis.tlsCert, s.redis.password != "")
	}
	if !s.tracing.enabled || s.tracing.service != "envoy-ratelimit" || s.tracing.namespace != "envoy-gateway-system" || s.tracing.sampling != 1 {
		t.Errorf("tracing: %+v", s.tracing)
	}
}

// TestEnvoyValuesRefused: values envoy-rl refuses at start are refused
// here too, each naming its variable and what it takes, where they were
// read another way before: GRPC_SERVER_USE_TLS=true without a
// certificate and key (plain text), an unknown REDIS_TYPE (single) or
// CONFIG_TYPE (FILE), a REDIS_URL that is not a socket's path with
// REDIS_SOCKET_TYPE unix or unset, REDIS_TIMEOUT without its unit. A
// password in REDIS_URL is not shown. The values envoy-rl takes still
// load, in any case.
func TestEnvoyValuesRefused(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want []string
	}{
		{map[string]string{"GRPC_SERVER_USE_TLS": "true"}, []string{"GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY", "plain text"}},
		{map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "c"}, []string{"needs GRPC_SERVER_TLS_KEY (or --grpc-tls-key)"}},
		{map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_CLIENT_TLS_CACERT": "ca"}, []string{"needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"}},
		{map[string]string{"REDIS_TYPE": "bogus", "REDIS_URL": "h:1", "REDIS_SOCKET_TYPE": "tcp"}, []string{`REDIS_TYPE="bogus": not one of single, sentinel, cluster`}},
		{map[string]string{"CONFIG_TYPE": "bogus"}, []string{`CONFIG_TYPE="bogus": not one of FILE, GRPC_XDS_SOTW`}},
		{map[string]string{"REDIS_SOCKET_TYPE": "udp", "REDIS_URL": "h:1"}, []string{`REDIS_SOCKET_TYPE="udp": not one of tcp, unix`}},
		{map[string]string{"REDIS_URL": "127.0.0.1:6390"}, []string{`REDIS_URL="127.0.0.1:6390" with REDIS_SOCKET_TYPE unset`, "REDIS_SOCKET_TYPE=tcp"}},
		{map[string]string{"REDIS_URL": "garbage", "REDIS_SOCKET_TYPE": "unix"}, []string{`REDIS_URL="garbage" with REDIS_SOCKET_TYPE="unix"`, "REDIS_SOCKET_TYPE=tcp"}},
		{map[string]string{"REDIS_URL": "redis://u:s3cretpassw0rd@h:1"}, []string{`REDIS_URL="redis://xxxxx@h:1"`}},
		{map[string]string{"REDIS_URL": "h:1", "REDIS_SOCKET_TYPE": "tcp", "REDIS_TIMEOUT": "5"}, []string{`REDIS_TIMEOUT="5"`, "want a duration with its unit: 5s"}},
	} {
		_, err := parseServe([]string{"--config", "r.yaml"}, envMap(c.env), &bytes.Buffer{})
		if err == nil {
			t.Errorf("%v: started", c.env)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: %v, want %q", c.env, err, w)
			}
		}
		if strings.Contains(err.Error(), "s3cretpassw0rd") {
			t.Errorf("%v: the password shown: %v", c.env, err)
		}
	}
	// sluice proxy reads the Redis ones.
	if _, err := parseProxy([]string{"--config", "p.yaml", "--upstream", "http://127.0.0.1:1"}, envMap(map[string]string{"REDIS_TYPE": "clustr", "REDIS_URL": "h:1"}), &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), `REDIS_TYPE="clustr"`) {
		t.Errorf("sluice proxy with REDIS_TYPE=clustr: %v", err)
	}
	for _, env := range []map[string]string{
		{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "c", "GRPC_SERVER_TLS_KEY": "k"},
		{"GRPC_SERVER_USE_TLS": "true", "SLUICE_GRPC_TLS_CERT": "c", "SLUICE_GRPC_TLS_KEY": "k"},
		{"GRPC_SERVER_USE_TLS": "false"},
		{"REDIS_TYPE": "SINGLE", "REDIS_URL": "/run/redis.sock"},
		{"REDIS_TYPE": "cluster", "REDIS_URL": "h:1,h:2", "REDIS_SOCKET_TYPE": "TCP"},
		{"REDIS_TYPE": "sentinel", "REDIS_URL": "mymaster,h:1", "REDIS_SOCKET_TYPE": "tcp4"},
		{"CONFIG_TYPE": "FILE", "REDIS_URL": "h:1", "REDIS_SOCKET_TYPE": "tcp", "REDIS_TIMEOUT": "5s"},
	} {
		if _, err := parseServe([]string{"--config", "r.yaml"}, envMap(env), &bytes.Buffer{}); err != nil {
			t.Errorf("%v: %v", env, err)
		}
	}
}
