package main

// The environment of envoyproxy/ratelimit: the variables sluice serve and
// sluice proxy read after their own flags and SLUICE_ variables, so that an
// Envoy deployment moves over without touching its environment, and those
// it names in one warning at start because nothing here honours them
// (docs/operations.md has the table).

import (
	"net"
	"path/filepath"
	"strings"
)

// envoyVar maps variables of envoyproxy/ratelimit onto a flag's value.
type envoyVar struct {
	names []string
	value func(env lookupEnv) (string, bool)
}

// envoyVars are the envoyproxy/ratelimit variables that map cleanly onto a
// flag, consulted after the flag and its SLUICE_ variable.
var envoyVars = map[string]envoyVar{
	"config": {
		names: []string{"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY"},
		value: func(env lookupEnv) (string, bool) {
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
	"grpc-addr":   hostPort("GRPC_HOST", "GRPC_PORT", "8081"),
	"http-addr":   hostPort("HOST", "PORT", "8080"),
	"debug-addr":  hostPort("DEBUG_HOST", "DEBUG_PORT", "6070"),
	"shadow-mode": plain("SHADOW_MODE"),
	// envoy-rl's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true keeps a
	// request that one descriptor denies from counting the others: what
	// all-or-nothing does (the denying descriptor's own count stays too).
	"all-or-nothing":   plain("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"),
	"near-limit-ratio": plain("NEAR_LIMIT_RATIO"),
	"log-format":       plain("LOG_FORMAT"),
	"log-level": {
		names: []string{"LOG_LEVEL"},
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

func plain(name string) envoyVar {
	return envoyVar{names: []string{name}, value: func(env lookupEnv) (string, bool) { return env(name) }}
}

// hostPort joins Envoy's HOST and PORT pairs into an address; an unset
// host listens on every interface, as Envoy's 0.0.0.0 does.
func hostPort(hostVar, portVar, defPort string) envoyVar {
	return envoyVar{
		names: []string{hostVar, portVar},
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
	{"REDIS_PIPELINE_LIMIT", "nothing: the Redis client pipelines automatically"},
	{"REDIS_TLS_CLIENT_CERT", "a TLS-terminating sidecar (client certificates are not supported)"},
	{"REDIS_TLS_CLIENT_KEY", "a TLS-terminating sidecar (client certificates are not supported)"},
	{"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "--redis-tls-ca with the server's CA"},
	{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "nothing: readiness shows the store's state"},
	{"REDIS_PERSECOND_URL", "one Redis for every limit"},
	{"REDIS_PIPELINE_WINDOW", "nothing: the Redis client pipelines automatically"},
	{"REDIS_PERSECOND", "one Redis for every limit"},
	{"MEMCACHE_HOST_PORT", "--store"},
	{"LIMIT_RESPONSE_HEADERS_ENABLED", "--response-headers"},
	{"USE_PROMETHEUS", "/metrics on --http-addr"},
	{"MERGE_DOMAIN_CONFIG", "one file per domain"},
	{"GRPC_UDS", "--grpc-addr (TCP only)"},
	{"GRPC_SERVER_USE_TLS", "a TLS-terminating sidecar"},
	{"CONFIG_TYPE", "--config (files only)"},
	{"LOCAL_CACHE_SIZE_IN_BYTES", "nothing: the embedded store is local"},
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
	"redis-password": {
		names: []string{"REDIS_AUTH"},
		value: func(env lookupEnv) (string, bool) {
			v, ok := env("REDIS_AUTH")
			if _, pw, found := strings.Cut(v, ":"); found {
				return pw, ok
			}
			return v, ok
		},
	},
	"redis-username": {
		names: []string{"REDIS_AUTH"},
		value: func(env lookupEnv) (string, bool) {
			v, _ := env("REDIS_AUTH")
			user, _, found := strings.Cut(v, ":")
			return user, found
		},
	},
	"redis-tls":    plain("REDIS_TLS"),
	"redis-tls-ca": plain("REDIS_TLS_CACERT"),
	"redis-prefix": plain("CACHE_KEY_PREFIX"),
}

func init() {
	for name, v := range envoyRedis {
		envoyVars[name] = v
	}
}
