package main

// The environment of envoyproxy/ratelimit: the variables sluice serve and
// sluice proxy read after their own flags and SLUICE_ variables, so that an
// Envoy deployment moves over without touching its environment, and those
// it names in one warning at start because nothing here honours them
// (docs/migrating.md and docs/reference/serve.md have the table).

import (
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/internal/base/redact"
)

// envoyVar maps variables of envoyproxy/ratelimit onto a flag's value.
type envoyVar struct {
	names []string
	value func(env lookupEnv) (string, bool)
	note  string // how the value is made from names, unless it is one's value
	// check, when set, refuses the variables' values when value is used.
	check func(env lookupEnv) error
}

// envoyVars are the envoyproxy/ratelimit variables that map cleanly onto a
// flag, consulted after the flag and its SLUICE_ variable.
var envoyVars = map[string]envoyVar{
	"config": {
		names: []string{"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY"},
		note:  "the path RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, when one is set; RUNTIME_ROOT defaults to /srv/runtime_data/current and RUNTIME_APPDIRECTORY to config; none with CONFIG_TYPE=GRPC_XDS_SOTW",
		value: func(env lookupEnv) (string, bool) {
			if t, _ := env("CONFIG_TYPE"); strings.EqualFold(t, "GRPC_XDS_SOTW") {
				// envoy-rl reads no runtime files when its rules come
				// from xDS, whatever RUNTIME_* say.
				return "", false
			}
			root, r := env("RUNTIME_ROOT")
			sub, s := env("RUNTIME_SUBDIRECTORY")
			app, a := env("RUNTIME_APPDIRECTORY")
			if !r && !s && !a {
				return "", false
			}
			if !r {
				root = "/srv/runtime_data/current"
			}
			if !a {
				app = "config"
			}
			return filepath.Join(root, sub, app), true
		},
	},
	"grpc-addr": {
		// envoy-rl listens on GRPC_UDS, a Unix socket, when it is set.
		names: []string{"GRPC_UDS", "GRPC_HOST", "GRPC_PORT"},
		note:  "unix:GRPC_UDS when GRPC_UDS is set, else GRPC_HOST:GRPC_PORT as for the other listeners (GRPC_PORT defaults to 8081)",
		value: func(env lookupEnv) (string, bool) {
			if uds, ok := env("GRPC_UDS"); ok && uds != "" {
				return "unix:" + uds, true
			}
			return hostPort("GRPC_HOST", "GRPC_PORT", "8081").value(env)
		},
	},
	"http-addr": hostPort("HOST", "PORT", "8080"),
	// Without DEBUG_HOST, the debug listener listens on 127.0.0.1, as
	// --debug-addr :PORT does, where envoy-rl listens on every interface.
	"debug-addr": hostPort("DEBUG_HOST", "DEBUG_PORT", "6070"),
	// envoy-rl serves Prometheus metrics on PROMETHEUS_ADDR (:9090 by
	// default) with USE_PROMETHEUS=true: Envoy Gateway scrapes :19001.
	"metrics-addr": {
		names: []string{"USE_PROMETHEUS", "PROMETHEUS_ADDR"},
		note:  "PROMETHEUS_ADDR (:9090 by default), when USE_PROMETHEUS is true",
		value: func(env lookupEnv) (string, bool) {
			if !envTrue(env, "USE_PROMETHEUS") {
				return "", false
			}
			if v, ok := env("PROMETHEUS_ADDR"); ok {
				return v, true
			}
			return ":9090", true
		},
	},
	"metrics-mapping": whenTrue("USE_PROMETHEUS", "PROMETHEUS_MAPPER_YAML"),
	"shadow-mode":     plain("SHADOW_MODE"),
	// envoy-rl's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true keeps a
	// request that one descriptor denies from counting the others: what
	// all-or-nothing does (the denying descriptor's own count stays too).
	"all-or-nothing": plain("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"),
	// envoy-rl's REDIS_TIMEOUT (10s by default) bounds a Redis call;
	// sluice's deadline is for a Redis found silent (docs/redis.md).
	"redis-timeout":             plain("REDIS_TIMEOUT"),
	"quota-mode":                plain("QUOTA_MODE"),
	"response-dynamic-metadata": plain("RESPONSE_DYNAMIC_METADATA"),
	"envoy-headers":             plain("LIMIT_RESPONSE_HEADERS_ENABLED"),
	"envoy-limit-header":        plain("LIMIT_LIMIT_HEADER"),
	"envoy-remaining-header":    plain("LIMIT_REMAINING_HEADER"),
	"envoy-reset-header":        plain("LIMIT_RESET_HEADER"),
	// envoy-rl reads its gRPC TLS files only with GRPC_SERVER_USE_TLS=true.
	"grpc-tls-cert": withTLS("GRPC_SERVER_TLS_CERT"),
	"grpc-tls-key":  withTLS("GRPC_SERVER_TLS_KEY"),
	// Envoy Gateway names the CA of the Envoys' client certificates
	// GRPC_SERVER_TLS_CA_CERT, which envoy-rl does not read (it then asks
	// for no client certificate): sluice reads it, after envoy-rl's own
	// GRPC_CLIENT_TLS_CACERT, and so requires the Envoys' certificates.
	"grpc-client-ca": {
		names: []string{"GRPC_SERVER_USE_TLS", "GRPC_CLIENT_TLS_CACERT", "GRPC_SERVER_TLS_CA_CERT"},
		note:  "GRPC_CLIENT_TLS_CACERT, else GRPC_SERVER_TLS_CA_CERT (Envoy Gateway's name), when GRPC_SERVER_USE_TLS is true",
		value: func(env lookupEnv) (string, bool) {
			if !envTrue(env, "GRPC_SERVER_USE_TLS") {
				return "", false
			}
			// An empty variable is an unset one: never a way to turn
			// mutual TLS off (applyEnv, emptyIsUnset).
			if v, _ := env("GRPC_CLIENT_TLS_CACERT"); v != "" {
				return v, true
			}
			return env("GRPC_SERVER_TLS_CA_CERT")
		},
	},
	"grpc-client-san":      withTLS("GRPC_CLIENT_TLS_SAN"),
	"merge-domains":        plain("MERGE_DOMAIN_CONFIG"),
	"start-without-config": plain("FORCE_START_WITHOUT_INITIAL_CONFIG"),
	"ready-needs-domain":   plain("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED"),
	// envoy-rl sends statsd with USE_STATSD=true, or DogStatsD with
	// USE_DOG_STATSD=true, to STATSD_HOST (default localhost) and
	// STATSD_PORT (8125).
	"statsd": {
		names: []string{"USE_STATSD", "USE_DOG_STATSD", "STATSD_HOST", "STATSD_PORT"},
		note:  "STATSD_HOST:STATSD_PORT (localhost and 8125 by default), when USE_STATSD or USE_DOG_STATSD is true",
		value: func(env lookupEnv) (string, bool) {
			if !envTrue(env, "USE_STATSD") && !envTrue(env, "USE_DOG_STATSD") {
				return "", false
			}
			host, ok := env("STATSD_HOST")
			if !ok {
				host = "localhost"
			}
			port, ok := env("STATSD_PORT")
			if !ok {
				port = "8125"
			}
			return net.JoinHostPort(host, port), true
		},
	},
	"statsd-format": {
		names: []string{"USE_DOG_STATSD"},
		note:  "dogstatsd when USE_DOG_STATSD is true; an error when USE_STATSD is true too, as in envoyproxy/ratelimit",
		value: func(env lookupEnv) (string, bool) {
			switch {
			case !envTrue(env, "USE_DOG_STATSD"):
				return "", false
			case envTrue(env, "USE_STATSD"):
				return bothStatsd, true
			}
			return "dogstatsd", true
		},
	},
	"dogstatsd-mogrifiers":        plain("USE_DOG_STATSD_MOGRIFIERS"),
	"statsd-flush-interval":       plain("STATS_FLUSH_INTERVAL"),
	"statsd-tags":                 plain("EXTRA_TAGS"),
	"tracing":                     plain("TRACING_ENABLED"),
	"tracing-protocol":            plain("TRACING_EXPORTER_PROTOCOL"),
	"tracing-sampling-rate":       plain("TRACING_SAMPLING_RATE"),
	"tracing-service-name":        plain("TRACING_SERVICE_NAME"),
	"tracing-service-namespace":   plain("TRACING_SERVICE_NAMESPACE"),
	"tracing-service-instance-id": plain("TRACING_SERVICE_INSTANCE_ID"),
	// envoy-rl takes its rules from xDS with CONFIG_TYPE=GRPC_XDS_SOTW.
	"config-xds": {
		names: []string{"CONFIG_TYPE", "CONFIG_GRPC_XDS_SERVER_URL"},
		note:  "CONFIG_GRPC_XDS_SERVER_URL, when CONFIG_TYPE=GRPC_XDS_SOTW",
		value: func(env lookupEnv) (string, bool) {
			if t, _ := env("CONFIG_TYPE"); !strings.EqualFold(t, "GRPC_XDS_SOTW") {
				return "", false
			}
			return env("CONFIG_GRPC_XDS_SERVER_URL")
		},
	},
	"xds-node-id":       plain("CONFIG_GRPC_XDS_NODE_ID"),
	"xds-node-metadata": plain("CONFIG_GRPC_XDS_NODE_METADATA"),
	"xds-headers":       plain("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"),
	"xds-tls":           plain("CONFIG_GRPC_XDS_SERVER_USE_TLS"),
	// envoy-rl reads its xDS TLS files only with
	// CONFIG_GRPC_XDS_SERVER_USE_TLS=true.
	"xds-tls-ca":          whenTrue("CONFIG_GRPC_XDS_SERVER_USE_TLS", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT"),
	"xds-tls-cert":        whenTrue("CONFIG_GRPC_XDS_SERVER_USE_TLS", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT"),
	"xds-tls-key":         whenTrue("CONFIG_GRPC_XDS_SERVER_USE_TLS", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY"),
	"xds-tls-server-name": whenTrue("CONFIG_GRPC_XDS_SERVER_USE_TLS", "CONFIG_GRPC_XDS_SERVER_TLS_SAN"),
	"xds-backoff-min":     plain("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL"),
	"xds-backoff-max":     plain("XDS_CLIENT_BACKOFF_MAX_INTERVAL"),
	"xds-max-msg-size":    plain("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"),
	"near-limit-ratio":    plain("NEAR_LIMIT_RATIO"),
	"log-format":          plain("LOG_FORMAT"),
	"log-level": {
		names: []string{"LOG_LEVEL"},
		note:  "LOG_LEVEL, with logrus's trace read as debug, warning as warn, fatal and panic as error",
		value: func(env lookupEnv) (string, bool) {
			v, ok := env("LOG_LEVEL")
			// logrus levels: trace, debug, info, warn(ing), error, fatal, panic.
			switch strings.ToLower(v) {
			case "trace":
				v = "debug"
			case "warning":
				v = "warn"
			case "fatal", "panic":
				v = "error"
			}
			return v, ok
		},
	},
	"grpc-max-connection-age":       plain("GRPC_MAX_CONNECTION_AGE"),
	"grpc-max-connection-age-grace": plain("GRPC_MAX_CONNECTION_AGE_GRACE"),
}

// envTrue reports whether the boolean variable name is set true, as
// envoy-rl's envconfig reads booleans (strconv.ParseBool). A value it
// refuses is an error of checkEnvoyValues, before any is read.
func envTrue(env lookupEnv, name string) bool {
	v, _ := env(name)
	on, err := strconv.ParseBool(v)
	return err == nil && on
}

// envoyBools are the boolean variables envTrue reads: switches that gate
// other variables rather than set a flag of their own (those a flag's
// parser reads strictly already).
var envoyBools = []string{"CONFIG_GRPC_XDS_SERVER_USE_TLS", "GRPC_SERVER_USE_TLS", "USE_DOG_STATSD", "USE_PROMETHEUS", "USE_STATSD"}

// envoyChoices are the variables that take one of a few values, in any
// case, as envoy-rl reads them (it refuses to start on another). Its
// REDIS_SOCKET_TYPE is a network of Go's net.Dial: tcp4 and tcp6 are tcp
// here.
var envoyChoices = []struct {
	name   string
	values []string
}{
	{"CONFIG_TYPE", []string{"FILE", "GRPC_XDS_SOTW"}},
	{"REDIS_TYPE", []string{"single", "sentinel", "cluster"}},
	{"REDIS_SOCKET_TYPE", []string{"tcp", "unix", "tcp4", "tcp6"}},
}

// checkEnvoyValues refuses, among the variables of vars, a value of a
// switch that strconv.ParseBool refuses ("yes", "on", " true", ""), as
// envoy-rl's envconfig does at start (read leniently,
// GRPC_SERVER_USE_TLS=yes would serve plain text and ignore the
// certificates), and a value of envoyChoices not among its values (an
// unknown REDIS_TYPE would be read as single, an unknown CONFIG_TYPE as
// FILE).
func checkEnvoyValues(env lookupEnv, vars map[string]envoyVar) error {
	read := map[string]bool{}
	for _, v := range vars {
		for _, n := range v.names {
			read[n] = true
		}
	}
	for _, name := range envoyBools {
		v, ok := env(name)
		if !ok || !read[name] {
			continue
		}
		if _, err := strconv.ParseBool(v); err != nil {
			return fmt.Errorf("%s=%q: parse error (want true or false)", name, v)
		}
	}
	for _, c := range envoyChoices {
		v, ok := env(c.name)
		if !ok || !read[c.name] {
			continue
		}
		if !slices.ContainsFunc(c.values, func(w string) bool { return strings.EqualFold(v, w) }) {
			return fmt.Errorf("%s=%q: not one of %s", c.name, v, strings.Join(c.values, ", "))
		}
	}
	return nil
}

// checkEnvoyTLS refuses GRPC_SERVER_USE_TLS=true without the certificate
// and key the gRPC listener would need (from any of their sources, t):
// envoy-rl does not start so, and serving plain text would leave Envoy's
// TLS, and the clients' certificates, unchecked.
func checkEnvoyTLS(env lookupEnv, t *tlsSettings) []string {
	if !envTrue(env, "GRPC_SERVER_USE_TLS") {
		return nil
	}
	var vars, flags []string
	if t.cert == "" {
		vars, flags = append(vars, "GRPC_SERVER_TLS_CERT"), append(flags, "--grpc-tls-cert")
	}
	if t.key == "" {
		vars, flags = append(vars, "GRPC_SERVER_TLS_KEY"), append(flags, "--grpc-tls-key")
	}
	if len(vars) == 0 {
		return nil
	}
	return []string{fmt.Sprintf("GRPC_SERVER_USE_TLS=true needs %s (or %s): without them the gRPC listener would serve plain text; set them, or GRPC_SERVER_USE_TLS=false",
		strings.Join(vars, " and "), strings.Join(flags, " and "))}
}

// checkUnixURL refuses REDIS_URL as a Unix socket (REDIS_SOCKET_TYPE unix,
// or unset: envoy-rl's default) when it is not a path: host:port there
// needs REDIS_SOCKET_TYPE=tcp. The URL is shown with its userinfo masked.
func checkUnixURL(env lookupEnv) error {
	u, _ := env("REDIS_URL")
	st, set := env("REDIS_SOCKET_TYPE")
	if set && !strings.EqualFold(st, "unix") {
		return nil
	}
	if typ, _ := env("REDIS_TYPE"); strings.EqualFold(typ, "sentinel") {
		if _, addrs, ok := strings.Cut(u, ","); ok {
			u = addrs
		}
	}
	if strings.HasPrefix(u, "/") {
		return nil
	}
	socket := "REDIS_SOCKET_TYPE unset (unix, envoyproxy/ratelimit's default)"
	if set {
		socket = fmt.Sprintf("REDIS_SOCKET_TYPE=%q", st)
	}
	v, _ := env("REDIS_URL")
	return fmt.Errorf("REDIS_URL=%q with %s: a Unix socket's absolute path is wanted; for host:port, set REDIS_SOCKET_TYPE=tcp", redact.Value(v), socket)
}

// withTLS maps name when GRPC_SERVER_USE_TLS is true, as envoy-rl reads it.
func withTLS(name string) envoyVar { return whenTrue("GRPC_SERVER_USE_TLS", name) }

// whenTrue maps name when the boolean variable on is true.
func whenTrue(on, name string) envoyVar {
	return envoyVar{
		names: []string{on, name},
		note:  name + ", when " + on + " is true",
		value: func(env lookupEnv) (string, bool) {
			if !envTrue(env, on) {
				return "", false
			}
			return env(name)
		},
	}
}

// authPart maps name, a password or user:password as envoy-rl reads
// REDIS_AUTH, onto the password flag, or with user onto the user flag
// (when there is a colon).
func authPart(name string, user bool) envoyVar {
	if user {
		return envoyVar{
			names: []string{name},
			note:  "the part of " + name + " before the colon, when it is user:password",
			value: func(env lookupEnv) (string, bool) {
				v, _ := env(name)
				u, _, found := strings.Cut(v, ":")
				return u, found
			},
		}
	}
	return envoyVar{
		names: []string{name},
		note:  name + ", or its part after the colon when it is user:password",
		value: func(env lookupEnv) (string, bool) {
			v, ok := env(name)
			if _, pw, found := strings.Cut(v, ":"); found {
				return pw, ok
			}
			return v, ok
		},
	}
}

func plain(name string) envoyVar {
	return envoyVar{names: []string{name}, value: func(env lookupEnv) (string, bool) { return env(name) }}
}

// hostPort joins Envoy's HOST and PORT pairs into an address; an unset
// host listens on every interface, as Envoy's 0.0.0.0 does.
func hostPort(hostVar, portVar, defPort string) envoyVar {
	return envoyVar{
		names: []string{hostVar, portVar},
		note:  hostVar + ":" + portVar + ", when either is set; " + portVar + " defaults to " + defPort + ", and an unset " + hostVar + " gives :" + portVar,
		value: func(env lookupEnv) (string, bool) {
			host, h := env(hostVar)
			port, p := env(portVar)
			if !h && !p {
				return "", false
			}
			if !p {
				port = defPort
			}
			return net.JoinHostPort(host, port), true
		},
	}
}

// envoyUnmapped are envoyproxy/ratelimit variables with no equivalent: a
// startup warning names those that are set, with what to do instead.
var envoyUnmapped = []struct{ name, hint string }{
	{"REDIS_POOL_SIZE", "nothing: the Redis client pipelines on a few connections"},
	{"REDIS_POOL_ON_EMPTY_BEHAVIOR", "nothing: the Redis client pipelines on a few connections"},
	{"REDIS_PIPELINE_LIMIT", "nothing: the Redis client pipelines automatically"},
	{"REDIS_PIPELINE_WINDOW", "nothing: the Redis client pipelines automatically"},
	{"REDIS_CLUSTER_PIPELINE_PARALLELISM", "nothing: the Redis client pipelines automatically"},
	{"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "--redis-tls-ca with the server's CA"},
	{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "nothing: readiness shows the store's state"},
	{"REDIS_STARTUP_INITIAL_INTERVAL", "nothing: sluice starts without Redis and is ready once it answers"},
	{"REDIS_STARTUP_MAX_INTERVAL", "nothing: sluice starts without Redis and is ready once it answers"},
	{"REDIS_STARTUP_MAX_ELAPSED_TIME", "nothing: sluice starts without Redis and is ready once it answers"},
	{"REDIS_PERSECOND", "one Redis for every limit"},
	{"REDIS_PERSECOND_URL", "one Redis for every limit"},
	{"REDIS_PERSECOND_TYPE", "one Redis for every limit"},
	{"REDIS_PERSECOND_SOCKET_TYPE", "one Redis for every limit"},
	{"REDIS_PERSECOND_AUTH", "one Redis for every limit"},
	{"REDIS_PERSECOND_SENTINEL_AUTH", "one Redis for every limit"},
	{"REDIS_PERSECOND_TLS", "one Redis for every limit"},
	{"REDIS_PERSECOND_POOL_SIZE", "one Redis for every limit"},
	{"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "one Redis for every limit"},
	{"REDIS_PERSECOND_PIPELINE_LIMIT", "one Redis for every limit"},
	{"REDIS_PERSECOND_PIPELINE_WINDOW", "one Redis for every limit"},
	{"REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "one Redis for every limit"},
	{"REDIS_PERSECOND_TIMEOUT", "one Redis for every limit"},
	{"MEMCACHE_HOST_PORT", "--store"},
	{"MEMCACHE_SRV", "--store"},
	{"MEMCACHE_SRV_REFRESH", "--store"},
	{"MEMCACHE_MAX_IDLE_CONNS", "--store"},
	{"MEMCACHE_TLS", "--store"},
	{"MEMCACHE_TLS_CACERT", "--store"},
	{"MEMCACHE_TLS_CLIENT_CERT", "--store"},
	{"MEMCACHE_TLS_CLIENT_KEY", "--store"},
	{"MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", "--store"},
	{"PROMETHEUS_PATH", "/metrics on --metrics-addr"},
	{"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "/metrics on --metrics-addr (durations in seconds)"},
	{"DISABLE_STATS", "nothing: /metrics costs nothing unscraped"},
	{"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "--xds-backoff-min and --xds-backoff-max (one backoff for connecting and for streams)"},
	{"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "nothing: the xDS backoff (--xds-backoff-min, --xds-backoff-max) doubles, waiting a random time between half and all of each step"},
	{"XDS_CLIENT_BACKOFF_JITTER", "nothing: the xDS backoff (--xds-backoff-min, --xds-backoff-max) doubles, waiting a random time between half and all of each step"},
	{"LOCAL_CACHE_SIZE_IN_BYTES", "--local-cache-size (entries, not bytes)"},
	{"RUNTIME_WATCH_ROOT", "nothing: the rules directory is watched"},
	{"RUNTIME_IGNOREDOTFILES", "nothing: files whose names start with . are never read"},
	{"EXPIRATION_JITTER_MAX_SECONDS", "nothing: keys expire when idle, each at its own time"},
}

// envoyRedis maps envoyproxy/ratelimit's Redis variables onto the flags:
// REDIS_TYPE (single, sentinel, cluster), REDIS_URL (host:port; for
// sentinel "master,host:port,..."; for cluster "host:port,..."),
// REDIS_SOCKET_TYPE (tcp, unix), REDIS_AUTH (password or user:password)
// and REDIS_TLS.
var envoyRedis = map[string]envoyVar{
	"store": {
		// Envoy's BACKEND_TYPE defaults to redis: a deployment that sets
		// only REDIS_URL runs on Redis there, and here.
		names: []string{"BACKEND_TYPE", "REDIS_URL"},
		note:  "BACKEND_TYPE in lower case; redis when only REDIS_URL is set (BACKEND_TYPE's default there)",
		value: func(env lookupEnv) (string, bool) {
			v, ok := env("BACKEND_TYPE")
			if !ok {
				if _, url := env("REDIS_URL"); url {
					return "redis", true
				}
				return "", false
			}
			return strings.ToLower(v), true
		},
	},
	"redis-url": {
		names: []string{"REDIS_URL", "REDIS_TYPE", "REDIS_SOCKET_TYPE"},
		note:  "REDIS_URL, without the master's name before the first comma with REDIS_TYPE=sentinel, and prefixed with unix:// unless REDIS_SOCKET_TYPE is tcp (its default there is unix)",
		check: checkUnixURL,
		value: func(env lookupEnv) (string, bool) {
			u, ok := env("REDIS_URL")
			if !ok {
				return "", false
			}
			typ, _ := env("REDIS_TYPE")
			if strings.EqualFold(typ, "sentinel") {
				if _, addrs, ok := strings.Cut(u, ","); ok {
					u = addrs
				}
			}
			// Envoy's REDIS_SOCKET_TYPE defaults to unix.
			if st, set := env("REDIS_SOCKET_TYPE"); !set || strings.EqualFold(st, "unix") {
				u = "unix://" + u
			}
			return u, true
		},
	},
	"redis-sentinel-master": {
		names: []string{"REDIS_TYPE", "REDIS_URL"},
		note:  "the master's name, before the first comma of REDIS_URL, with REDIS_TYPE=sentinel",
		value: func(env lookupEnv) (string, bool) {
			typ, _ := env("REDIS_TYPE")
			u, ok := env("REDIS_URL")
			if !ok || !strings.EqualFold(typ, "sentinel") {
				return "", false
			}
			master, _, _ := strings.Cut(u, ",")
			return master, true
		},
	},
	"redis-password": authPart("REDIS_AUTH", false),
	"redis-username": authPart("REDIS_AUTH", true),
	// envoy-rl's REDIS_SENTINEL_AUTH authenticates to the Sentinels,
	// REDIS_AUTH to the master.
	"redis-sentinel-password": authPart("REDIS_SENTINEL_AUTH", false),
	"redis-sentinel-username": authPart("REDIS_SENTINEL_AUTH", true),
	"redis-tls":               plain("REDIS_TLS"),
	"redis-tls-ca":            plain("REDIS_TLS_CACERT"),
	"redis-tls-cert":          plain("REDIS_TLS_CLIENT_CERT"),
	"redis-tls-key":           plain("REDIS_TLS_CLIENT_KEY"),
	"redis-prefix":            plain("CACHE_KEY_PREFIX"),
}

func init() {
	for name, v := range envoyRedis {
		envoyVars[name] = v
	}
}
