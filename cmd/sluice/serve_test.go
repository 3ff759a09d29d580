package main

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/decision/ratelimitheaders"
	"github.com/sluicehq/sluice/internal/edges/server"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

func envMap(m map[string]string) lookupEnv {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestServeSettingsDefaults(t *testing.T) {
	s, err := parseServe([]string{"--config", "r.yaml"}, envMap(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := serveSettings{
		config: "r.yaml", grpcAddr: ":8081", httpAddr: ":8080", debugAddr: "127.0.0.1:6070",
		snapshotInterval: 5 * time.Second, responseHeaders: "off", headers: ratelimitheaders.HeadersNone,
		envoyHeaderNames: server.DefaultEnvoyHeaderNames,
		statsd:           statsdSettings{protocol: "tcp", format: "statsd", interval: 10 * time.Second},
		xds:              xdsSettings{minBackoff: 500 * time.Millisecond, maxBackoff: 30 * time.Second},
		tracing:          tracingSettings{protocol: "http", sampling: 1, service: "RateLimit"},
		nearLimitRatio:   0.8, logLevel: slog.LevelInfo, logFormat: "text",
		shutdownTimeout: 10 * time.Second, bodyTimeout: time.Minute, grpcMaxConnAge: 24 * time.Hour, grpcMaxConnAgeGrace: time.Hour,
		rlqsTTL: 5 * time.Second, rlqsGrace: 2 * time.Second, rlqsWindows: "token_bucket", rlqsMaxBytes: 64 << 20, topKeys: true,
		storeSettings: storeSettings{
			store:         "memory",
			redis:         redisSettings{prefix: "sluice:", timeout: 500 * time.Millisecond, maxInFlight: 256, maxQueue: 4096, hashTag: "entry", cacheSize: 100000},
			failurePolicy: rules.FailLocal, localNodes: 0,
			regions: regionSettings{interval: 200 * time.Millisecond},
		},
	}
	s.sources, s.envoyIgnored = nil, nil
	if !reflect.DeepEqual(*s, want) {
		t.Errorf("defaults\n got %+v\nwant %+v", *s, want)
	}
}

func TestServeSettingsPrecedence(t *testing.T) {
	env := map[string]string{
		"SLUICE_CONFIG":      "from-env.yaml",
		"SLUICE_GRPC_ADDR":   "127.0.0.1:9001",
		"GRPC_PORT":          "9999", // SLUICE_GRPC_ADDR wins
		"PORT":               "9002", // Envoy's, nothing else sets --http-addr
		"DEBUG_HOST":         "127.0.0.1",
		"SHADOW_MODE":        "true",
		"LOG_LEVEL":          "WARN",
		"LOG_FORMAT":         "json",
		"NEAR_LIMIT_RATIO":   "0.5",
		"SLUICE_MAX_BYTES":   "64MiB",
		"SLUICE_DRAIN_DELAY": "3s",
		"MEMCACHE_HOST_PORT": "m:11211",
	}
	s, err := parseServe([]string{"--config", "from-flag.yaml", "--drain-delay", "1s"}, envMap(env), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name     string
		got, exp any
	}{
		{"config", s.config, "from-flag.yaml"},
		{"drain-delay", s.drainDelay, time.Second},
		{"grpc-addr", s.grpcAddr, "127.0.0.1:9001"},
		{"http-addr", s.httpAddr, ":9002"},
		{"debug-addr", s.debugAddr, "127.0.0.1:6070"},
		{"shadow-mode", s.shadowMode, true},
		{"log-level", s.logLevel, slog.LevelWarn},
		{"log-format", s.logFormat, "json"},
		{"near-limit-ratio", s.nearLimitRatio, 0.5},
		{"max-bytes", s.maxBytes, byteSize(64 << 20)},
	}
	for _, c := range checks {
		if c.got != c.exp {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.exp)
		}
	}
	if len(s.envoyIgnored) != 1 || !strings.HasPrefix(s.envoyIgnored[0], "MEMCACHE_HOST_PORT") {
		t.Errorf("ignored Envoy variables %v", s.envoyIgnored)
	}
}

func TestServeSettingsEnvoyRuntime(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit"}, "/data/ratelimit/config"},
		{map[string]string{"RUNTIME_SUBDIRECTORY": "rl", "RUNTIME_APPDIRECTORY": "rules"}, "/srv/runtime_data/current/rl/rules"},
		{map[string]string{"RUNTIME_ROOT": "/data", "SLUICE_CONFIG": "/etc/sluice"}, "/etc/sluice"},
	} {
		s, err := parseServe(nil, envMap(c.env), &bytes.Buffer{})
		if err != nil {
			t.Fatalf("%v: %v", c.env, err)
		}
		if s.config != c.want {
			t.Errorf("%v: config %q, want %q", c.env, s.config, c.want)
		}
	}
	for _, c := range []struct{ level, want string }{{"trace", "DEBUG"}, {"warning", "WARN"}, {"fatal", "ERROR"}, {"Info", "INFO"}} {
		s, err := parseServe([]string{"--config", "x"}, envMap(map[string]string{"LOG_LEVEL": c.level}), &bytes.Buffer{})
		if err != nil || s.logLevel.String() != c.want {
			t.Errorf("LOG_LEVEL=%s: %v %v, want %s", c.level, s, err, c.want)
		}
	}
}

// TestServeSettingsEnvoyRedis maps envoyproxy/ratelimit's Redis variables.
func TestServeSettingsEnvoyRedis(t *testing.T) {
	for _, c := range []struct {
		env                       map[string]string
		url, master, user, passwd string
		tls                       bool
	}{
		{map[string]string{"BACKEND_TYPE": "redis", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379"}, "redis:6379", "", "", "", false},
		{map[string]string{"REDIS_SOCKET_TYPE": "TCP", "REDIS_URL": "redis:6379"}, "redis:6379", "", "", "", false},
		{map[string]string{"REDIS_URL": "/var/run/nutcracker/ratelimit.sock"}, "unix:///var/run/nutcracker/ratelimit.sock", "", "", "", false},
		{map[string]string{"BACKEND_TYPE": "redis", "REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "SENTINEL", "REDIS_URL": "mymaster,s1:26379,s2:26379", "REDIS_AUTH": "pw"},
			"s1:26379,s2:26379", "mymaster", "", "pw", false},
		{map[string]string{"BACKEND_TYPE": "redis", "REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "cluster", "REDIS_URL": "a:7000,b:7001", "REDIS_AUTH": "u:pw", "REDIS_TLS": "true"},
			"a:7000,b:7001", "", "u", "pw", true},
		{map[string]string{"BACKEND_TYPE": "redis", "REDIS_SOCKET_TYPE": "unix", "REDIS_URL": "/run/redis.sock"}, "unix:///run/redis.sock", "", "", "", false},
	} {
		s, err := parseServe([]string{"--config", "x"}, envMap(c.env), &bytes.Buffer{})
		if err != nil {
			t.Fatalf("%v: %v", c.env, err)
		}
		r := s.redis
		if s.store != "redis" || r.url != c.url || r.sentinelMaster != c.master || r.username != c.user || r.password != c.passwd || r.tls != c.tls {
			t.Errorf("%v: store %q, %+v", c.env, s.store, r)
		}
	}
	// REDIS_SENTINEL_AUTH authenticates to the Sentinels, REDIS_AUTH to
	// the master, each a password or user:password.
	for _, c := range []struct{ auth, user, pass string }{{"spw", "", "spw"}, {"sentinel:spw", "sentinel", "spw"}} {
		env := map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "sentinel", "REDIS_URL": "mymaster,s1:26379", "REDIS_AUTH": "mpw", "REDIS_SENTINEL_AUTH": c.auth}
		s, err := parseServe([]string{"--config", "x"}, envMap(env), &bytes.Buffer{})
		if err != nil {
			t.Fatalf("%v: %v", env, err)
		}
		if r := s.redis; r.password != "mpw" || r.sentinelUser != c.user || r.sentinelPass != c.pass || len(s.envoyIgnored) > 0 {
			t.Errorf("REDIS_SENTINEL_AUTH=%s: sentinel user %q password %q, master password %q, ignored %v", c.auth, r.sentinelUser, r.sentinelPass, r.password, s.envoyIgnored)
		}
	}
	if _, err := parseServe([]string{"--config", "x", "--store", "redis", "--redis-url", "r:6379", "--redis-sentinel-password", "p"}, envMap(nil), &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "need --redis-sentinel-master") {
		t.Errorf("--redis-sentinel-password without a Sentinel: %v", err)
	}
	if _, err := parseServe([]string{"--config", "x", "--store", "redis", "--redis-url", "redis://s1:26379?master_set=mymaster", "--redis-sentinel-password", "p"}, envMap(nil), &bytes.Buffer{}); err != nil {
		t.Errorf("--redis-sentinel-password with master_set= in the URL: %v", err)
	}
}

func TestServeSettingsErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--store", "memcache"}, nil, `unknown store "memcache" (supported: memory, redis)`},
		{[]string{"--store", "remote"}, nil, `unknown store "remote" (supported: memory, redis)`},
		{[]string{"--store", "redis"}, nil, "--store redis needs --redis-url"},
		{[]string{"--redis-url", "redis://x:1"}, nil, "--redis-url needs --store redis"},
		{[]string{"--store", "redis", "--redis-url", "x:1", "--state-file", "f"}, nil, "--state-file applies to --store memory only"},
		{[]string{"--store", "redis", "--redis-url", "x:1", "--max-bytes", "1MiB"}, nil, "--max-bytes applies to --store memory only"},
		{[]string{"--store", "redis", "--redis-url", "x:1", "--redis-hash-tag", "slot"}, nil, "--redis-hash-tag"},
		{[]string{"--store", "redis", "--redis-url", "x:1", "--redis-timeout", "0s"}, nil, "--redis-timeout must be positive"},
		{[]string{"--store", "redis", "--redis-url", "x:1", "--local-cache-size", "-1"}, nil, "--local-cache-size"},
		{[]string{"--local-nodes", "-1"}, nil, "--local-nodes must not be negative"},
		{[]string{"--redis-max-in-flight", "0", "--store", "redis", "--redis-url", "redis://x:1"}, nil, "--redis-max-in-flight must be at least 1"},
		{[]string{"--redis-max-queue", "-1", "--store", "redis", "--redis-url", "redis://x:1"}, nil, "--redis-max-queue must not be negative"},
		{[]string{"--response-headers", "fancy"}, nil, "--response-headers"},
		{[]string{"--log-format", "xml"}, nil, "unknown log format"},
		{[]string{"--near-limit-ratio", "1.5"}, nil, "near-limit-ratio"},
		{[]string{"--drain-delay", "-1s"}, nil, "drain-delay must not be negative"},
		{[]string{"--rlqs-max-bytes", "0"}, nil, "--rlqs-max-bytes must be positive"},
		{nil, map[string]string{"SLUICE_RLQS_MAX_BYTES": "lots"}, "not a size in bytes"},
		{nil, map[string]string{"SLUICE_SHUTDOWN_TIMEOUT": "soon"}, `SLUICE_SHUTDOWN_TIMEOUT="soon"`},
		{nil, map[string]string{"GRPC_PORT": "x y"}, `--grpc-addr ":x y"`},
		{[]string{"--http-addr", "localhost"}, nil, `--http-addr "localhost"`},
		{nil, map[string]string{"SLUICE_MAX_BYTES": "12 parsecs"}, "not a size in bytes"},
		{[]string{"--max-bytes", "1"}, nil, "--max-bytes 1 is below 262144 (256KiB)"},
		{[]string{"--max-bytes", "100"}, nil, "--max-bytes 100 is below"},
		{nil, map[string]string{"SLUICE_MAX_BYTES": "1KiB"}, "--max-bytes 1024 is below"},
		{[]string{"--max-bytes", "262143"}, nil, "--max-bytes 262143 is below"},
	} {
		_, err := parseServe(append([]string{"--config", "r.yaml"}, c.args...), envMap(c.env), &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v %v: error %v, want %q", c.args, c.env, err, c.want)
		}
	}
	var bad bytes.Buffer
	if _, err := parseServe([]string{"--config", "r.yaml", "--failure-policy", "maybe"}, envMap(nil), &bad); err == nil || !strings.Contains(bad.String(), `invalid value "maybe" for flag -failure-policy`) {
		t.Errorf("--failure-policy maybe: %v\n%s", err, bad.String())
	}
	var out bytes.Buffer
	if _, err := parseServe(nil, envMap(nil), &out); !errors.Is(err, errUsage) || !strings.Contains(out.String(), "--config (or SLUICE_CONFIG) is required") {
		t.Errorf("no config: %v\n%s", err, out.String())
	}
}

// TestServeHelp: sluice serve --help shows what a newcomer needs first,
// grouped, and --help-all every flag with its variables and default.
func TestServeHelp(t *testing.T) {
	code, short, _ := runCmd(t, "", "serve", "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{
		"\nRules:\n", "\nListeners:\n", "\nStore:\n", "\nRedis:\n", "\nEnvoy compatibility:\n", "\nObservability:\n", "\nAdmin:\n",
		"--config path", "--grpc-addr", "(default :8081)", "--grpc-tls-cert", "--store", "--redis-url", "--envoy-headers",
		"--statsd", "--log-level", "--admin-addr", "--admin-token-file", "SLUICE_", "sluice serve --help-all", "docs/reference/serve.md",
	} {
		if !strings.Contains(short, want) {
			t.Errorf("--help lacks %q", want)
		}
	}
	code, errOut, _ := runCmd(t, "", "serve", "--help-all")
	if code != 0 {
		t.Fatalf("--help-all: exit %d", code)
	}
	errOut = strings.Join(strings.Fields(errOut), " ") // as if unwrapped
	for _, want := range []string{
		"--config", "SLUICE_CONFIG", "RUNTIME_ROOT", "--grpc-addr", `(default ":8081")`, "GRPC_PORT",
		"--http-addr", `(default ":8080")`, "--debug-addr", `(default "127.0.0.1:6070")`, "--store", "--state-file",
		"--snapshot-interval", "--max-bytes", "--response-headers", "--shadow-mode", "SHADOW_MODE",
		"--log-level", "LOG_LEVEL", "--log-format", "--shutdown-timeout", "--drain-delay", ".corrupt",
		"--redis-url", "REDIS_URL", "--redis-sentinel-master", "--redis-timeout", "--redis-hash-tag",
		"--local-cache-size", "--failure-policy", "--local-nodes", "--redis-max-in-flight", "--redis-max-queue",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("--help-all lacks %q", want)
		}
	}
}

func TestByteSize(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "1234": 1234, "512MiB": 512 << 20, "2GB": 2e9, "1Gi": 1 << 30, "10 KB": 10000, "7B": 7,
	} {
		var b byteSize
		if err := b.Set(in); err != nil || int64(b) != want {
			t.Errorf("%q: %d, %v; want %d", in, b, err, want)
		}
	}
	for _, in := range []string{"", "-1", "1.5GB", "GB", "9000000TiB", "12 parsecs"} {
		var b byteSize
		if err := b.Set(in); err == nil {
			t.Errorf("%q: no error", in)
		}
	}
}

func TestRestoreState(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	dir := t.TempDir()
	path := filepath.Join(dir, "state")

	// Missing: a first start.
	st := memstore.New(memstore.Config{})
	defer st.Close()
	if err := restoreState(st, path, log); err != nil {
		t.Fatalf("missing: %v", err)
	}
	// Corrupt: moved aside, empty start.
	if err := os.WriteFile(path, []byte("SLUICEMS garbage that is long enough for a header"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := restoreState(st, path, log); err != nil {
		t.Fatalf("corrupt: %v", err)
	}
	if _, err := os.Stat(path + ".corrupt"); err != nil {
		t.Errorf("corrupt file not moved aside: %v", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("corrupt file still in place: %v", err)
	}
	// A directory where the file should be, or no directory: errors.
	if err := restoreState(st, dir, log); err == nil {
		t.Error("directory: no error")
	}
	if err := restoreState(st, filepath.Join(dir, "missing", "state"), log); err == nil {
		t.Error("missing directory: no error")
	}
	// A good one.
	if err := st.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	if err := restoreState(st, path, log); err != nil {
		t.Errorf("good: %v", err)
	}
}

// The header modes of --response-headers are the server's.
func TestServeHeaderModes(t *testing.T) {
	for _, v := range []string{"off", "ietf", "x-ratelimit", "retry-after", "all", "ietf,retry-after"} {
		s, err := parseServe([]string{"--config", "r", "--response-headers", v}, envMap(nil), &bytes.Buffer{})
		if err != nil {
			t.Errorf("%s: %v", v, err)
			continue
		}
		if want, _ := ratelimitheaders.ParseHeaderMode(v); s.headers != want {
			t.Errorf("%s: mode %v, want %v", v, s.headers, want)
		}
	}
}

// TestDebugAddrLoopbackUnlessNamed: the debug listener (and the admin
// API's) listens on 127.0.0.1 unless its address names a host.
func TestDebugAddrLoopbackUnlessNamed(t *testing.T) {
	for _, c := range []struct {
		args        []string
		env         map[string]string
		debug, admn string
	}{
		{nil, nil, "127.0.0.1:6070", ""},
		{[]string{"--debug-addr", ":7070"}, nil, "127.0.0.1:7070", ""},
		{[]string{"--debug-addr", "0.0.0.0:7070"}, nil, "0.0.0.0:7070", ""},
		{[]string{"--debug-addr", "[::]:7070"}, nil, "[::]:7070", ""},
		{[]string{"--debug-addr", ""}, nil, "", ""},
		{nil, map[string]string{"DEBUG_PORT": "7071"}, "127.0.0.1:7071", ""},
		{nil, map[string]string{"DEBUG_HOST": "0.0.0.0"}, "0.0.0.0:6070", ""},
		{nil, map[string]string{"DEBUG_HOST": "0.0.0.0", "DEBUG_PORT": "7072"}, "0.0.0.0:7072", ""},
		{nil, map[string]string{"SLUICE_DEBUG_ADDR": ":7073"}, "127.0.0.1:7073", ""},
		{[]string{"--admin-addr", ":9091", "--admin-token-file", "t", "--overrides-file", "o"}, nil, "127.0.0.1:6070", "127.0.0.1:9091"},
		{[]string{"--admin-addr", "10.0.0.1:9091", "--admin-token-file", "t", "--overrides-file", "o"}, nil, "127.0.0.1:6070", "10.0.0.1:9091"},
	} {
		s, err := parseServe(append([]string{"--config", "r.yaml"}, c.args...), envMap(c.env), &bytes.Buffer{})
		if err != nil {
			t.Errorf("%q %v: %v", c.args, c.env, err)
			continue
		}
		if s.debugAddr != c.debug || s.adminAddr != c.admn {
			t.Errorf("%q %v: debug %q admin %q, want %q %q", c.args, c.env, s.debugAddr, s.adminAddr, c.debug, c.admn)
		}
	}
}

// TestSettingsHideSecrets: a setting refused for a secret it holds, or
// for a URL whose password is not percent-encoded, is named in the error
// without the secret, and so is the default a variable gives to --help.
func TestSettingsHideSecrets(t *testing.T) {
	const secret = "S3cr3tPW"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--config-xds", "u:" + secret + "@xds:18000"}, `--config-xds "xxxxx@xds:18000": an @ in it`},
		{[]string{"serve", "--config-xds", "xds:18000", "--xds-headers", "authorization: Bearer " + secret}, "--xds-headers: a pair is not key=value (not shown"},
		{[]string{"proxy", "--config", "r.yaml", "--upstream", "http://u:" + secret + " x@api"}, `--upstream "http://xxxxx@api": invalid userinfo`},
		{[]string{"proxy", "--config", "r.yaml", "--upstream", "http://u:" + secret + "/x@api"}, `--upstream "http://xxxxx@api": invalid port after host`},
		{[]string{"proxy", "--config", "r.yaml", "--upstream", "http://" + secret + "/x@api"}, `--upstream "http://xxxxx@api": credentials in the URL are not sent`},
		{[]string{"proxy", "--config", "r.yaml", "--upstream", "http://api", "--store", "remote", "--rls-addr", secret + "@rls:8081"}, `--rls-addr "xxxxx@rls:8081": an @ in it`},
		{[]string{"explain", "--server", `http://u:"` + secret + `"@h:1`, "--token-file", "t", "--domain", "d", "k=v"}, `--server "http://xxxxx@h:1": invalid userinfo`},
		{[]string{"explain", "--server", "http://" + secret + "/x@h:1", "--token-file", "t", "--domain", "d", "k=v"}, `--server "http://xxxxx@h:1": credentials in the URL are not used`},
	} {
		code, out, errOut := runCmd(t, "", c.args...)
		if code == 0 || !strings.Contains(errOut, c.want) || strings.Contains(out+errOut, secret) {
			t.Errorf("%q: exit %d, %s%s\nwant an error with %q, without the secret", c.args, code, out, errOut, c.want)
		}
	}
	t.Setenv("SLUICE_ADMIN_URL", "http://admin:"+secret+"@127.0.0.1:9091")
	for _, args := range [][]string{{"explain", "--help"}, {"explain", "--help-all"}, {"override", "set", "--help-all"}} {
		code, out, errOut := runCmd(t, "", args...)
		if code != 0 || !strings.Contains(out, "http://xxxxx@127.0.0.1:9091") || strings.Contains(out+errOut, secret) {
			t.Errorf("%q with SLUICE_ADMIN_URL: exit %d, %s%s\nwant its default masked", args, code, out, errOut)
		}
	}
}
