package main

// envoyproxy/ratelimit's stats to statsd, for the dashboards built on its
// names: --statsd (USE_STATSD with STATSD_HOST and STATSD_PORT),
// --statsd-protocol, --statsd-flush-interval (STATS_FLUSH_INTERVAL) and
// --statsd-tags (EXTRA_TAGS), through lyft/gostats, the library envoy-rl
// sends them with.

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	gostats "github.com/lyft/gostats"
)

// statsdSettings are the statsd flags of sluice serve.
type statsdSettings struct {
	addr       string // host:port; empty: no statsd
	protocol   string
	format     string // statsd or dogstatsd
	mogrifiers string // names of DogStatsD mogrifiers, k,k
	interval   time.Duration
	tags       string // k:v,k:v
	mapping    string // statsd_exporter mapping file: the stats on --metrics-addr too

	mogs []mogrifier // parsed by check
}

func (s *statsdSettings) flags(fs *flag.FlagSet) {
	fs.StringVar(&s.addr, "statsd", "", "`host:port` of a statsd server to send envoyproxy/ratelimit's stats to, with its names (ratelimit.service.rate_limit.<stats key>.total_hits, ...); empty sends none")
	fs.StringVar(&s.protocol, "statsd-protocol", "tcp", "`protocol` of --statsd: tcp (as envoy-rl) or udp; DogStatsD is always udp")
	fs.StringVar(&s.format, "statsd-format", "statsd", "`format` of --statsd: statsd, or dogstatsd (tags as DogStatsD tags, envoy-rl's USE_DOG_STATSD)")
	fs.StringVar(&s.mogrifiers, "dogstatsd-mogrifiers", "", "`names` (k,k) of the mogrifiers that rewrite DogStatsD names into tags, each defined by DOG_STATSD_MOGRIFIER_<NAME>_PATTERN, _NAME and _TAGS as in envoy-rl")
	fs.DurationVar(&s.interval, "statsd-flush-interval", 10*time.Second, "how often the stats are sent to --statsd")
	fs.StringVar(&s.tags, "statsd-tags", "", "`tags` added to every stat, as k:v,k:v (envoy-rl's EXTRA_TAGS)")
	fs.StringVar(&s.mapping, "metrics-mapping", "", "statsd_exporter mapping `file` (envoy-rl's PROMETHEUS_MAPPER_YAML): envoyproxy/ratelimit's stats, named by it, are served on --metrics-addr beside sluice's metrics. At most 256 KiB and 500 mappings; a mapping that names a metric sluice_*, go_*, process_* or promhttp_*, or a label starting with __, is refused, and so are two that name one metric as two types or with no label that tells their series apart. One metric with other label names in two mappings is served as statsd_exporter serves it, a series of each")
}

// check reports what is wrong with the flags, reading the mogrifiers'
// definitions from env.
func (s *statsdSettings) check(env lookupEnv) []string {
	var probs []string
	if s.addr != "" {
		if _, port, err := net.SplitHostPort(s.addr); err != nil {
			probs = append(probs, fmt.Sprintf("--statsd %q: %v", s.addr, err))
		} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			probs = append(probs, fmt.Sprintf("--statsd %q: port %q is not a number", s.addr, port))
		}
	}
	if s.protocol != "tcp" && s.protocol != "udp" {
		probs = append(probs, fmt.Sprintf("--statsd-protocol %q: want tcp or udp", s.protocol))
	}
	switch s.format {
	case "statsd":
		if s.mogrifiers != "" {
			probs = append(probs, "--dogstatsd-mogrifiers needs --statsd-format dogstatsd")
		}
	case "dogstatsd":
		ms, err := parseMogrifiers(s.mogrifiers, env)
		if err != nil {
			probs = append(probs, "--dogstatsd-mogrifiers: "+err.Error())
		}
		s.mogs = ms
	case bothStatsd:
		probs = append(probs, "USE_STATSD and USE_DOG_STATSD are both true: set one (envoy-rl refuses both too)")
	default:
		probs = append(probs, fmt.Sprintf("--statsd-format %q: want statsd or dogstatsd", s.format))
	}
	if s.interval <= 0 {
		probs = append(probs, "--statsd-flush-interval must be positive")
	}
	if _, err := parseTags(s.tags); err != nil {
		probs = append(probs, "--statsd-tags: "+err.Error())
	}
	return probs
}

// parseTags reads k:v,k:v as envoy-rl reads EXTRA_TAGS.
func parseTags(s string) (map[string]string, error) { return keyValues(s, ":") }

// keyValues reads a list of key<sep>value separated by commas.
func keyValues(s, sep string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, sep)
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not key%svalue", kv, sep)
		}
		m[k] = v
	}
	return m, nil
}

// bothStatsd is the --statsd-format envoy-rl's variables give when both
// of its statsd switches are on, which check refuses.
const bothStatsd = "USE_STATSD and USE_DOG_STATSD"

// start returns the stats store that sends to --statsd every interval
// until ctx ends (then once more), and to the Prometheus collector of
// --metrics-mapping (nil without), and the tags; no store without either.
func (s *statsdSettings) start(ctx context.Context, log *slog.Logger) (gostats.Store, map[string]string, *promSink, error) {
	var all sinks
	if s.addr != "" {
		if s.format == "dogstatsd" {
			d, err := newDogSink(s.addr, s.mogs)
			if err != nil {
				return nil, nil, nil, err
			}
			all = append(all, d)
		} else {
			host, portStr, _ := net.SplitHostPort(s.addr)
			port, _ := strconv.Atoi(portStr)
			all = append(all, gostats.NewNetSink(gostats.WithStatsdHost(host), gostats.WithStatsdPort(port),
				gostats.WithStatsdProtocol(s.protocol), gostats.WithLogger(statsdLogger{log})))
		}
		log.Info("sending envoyproxy/ratelimit's stats to statsd", "addr", s.addr, "format", s.format, "protocol", s.protocol, "interval", s.interval, "tags", s.tags)
	}
	var prom *promSink
	if s.mapping != "" {
		var err error
		if prom, err = newPromSink(s.mapping, log); err != nil {
			return nil, nil, nil, err
		}
		all = append(all, prom)
		log.Info("serving envoyproxy/ratelimit's stats as Prometheus metrics on --metrics-addr", "mapping", s.mapping)
	}
	if len(all) == 0 {
		return nil, nil, nil, nil
	}
	var sink gostats.Sink = all
	if len(all) == 1 {
		sink = all[0]
	}
	store := gostats.NewStore(sink, false)
	if prom != nil {
		prom.store = store
	}
	go store.StartContext(ctx, time.NewTicker(s.interval))
	tags, _ := parseTags(s.tags)
	return store, tags, prom, nil
}

// statsdLogger is gostats' logger on slog.
type statsdLogger struct{ log *slog.Logger }

func (l statsdLogger) Errorf(msg string, args ...any) {
	l.log.Error("statsd: " + fmt.Sprintf(msg, args...))
}

func (l statsdLogger) Warnf(msg string, args ...any) {
	l.log.Warn("statsd: " + fmt.Sprintf(msg, args...))
}
