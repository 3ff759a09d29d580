package main

import (
	"bufio"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// statsdListener collects what a statsd server receives: counters summed
// by name over every flush, and the number of samples of each timer.
type statsdListener struct {
	mu     sync.Mutex
	counts map[string]uint64
	timers map[string]uint64
}

func (l *statsdListener) line(s string) {
	name, rest, ok := strings.Cut(s, ":")
	if !ok {
		return
	}
	if v, ok := strings.CutSuffix(rest, "|ms"); ok {
		if _, err := strconv.ParseFloat(v, 64); err == nil {
			l.mu.Lock()
			l.timers[name]++
			l.mu.Unlock()
		}
		return
	}
	v, err := strconv.ParseUint(strings.TrimSuffix(rest, "|c"), 10, 64)
	if err != nil || !strings.HasSuffix(rest, "|c") {
		return
	}
	l.mu.Lock()
	l.counts[name] += v
	l.mu.Unlock()
}

func (l *statsdListener) timed(name string) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.timers[name]
}

func (l *statsdListener) get(name string) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.counts[name]
}

// udpStatsd and tcpStatsd start real statsd listeners on loopback.
func udpStatsd(t *testing.T) (*statsdListener, string) {
	l := &statsdListener{counts: map[string]uint64{}, timers: map[string]uint64{}}
	return l, udpLines(t, l.line)
}

// udpLines starts a UDP listener on loopback that gives each line of each
// datagram to line, and returns its address.
func udpLines(t *testing.T, line func(string)) string {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 65536)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			for _, s := range strings.Split(string(buf[:n]), "\n") {
				line(s)
			}
		}
	}()
	return pc.LocalAddr().String()
}

func tcpStatsd(t *testing.T) (*statsdListener, string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	l := &statsdListener{counts: map[string]uint64{}, timers: map[string]uint64{}}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					l.line(sc.Text())
				}
			}()
		}
	}()
	return l, ln.Addr().String()
}

// TestServeE2EStatsd: envoy-rl's stats, with its names and EXTRA_TAGS, to
// a real statsd listener over UDP and over TCP (envoy-rl's own protocol),
// set by envoy-rl's variables: three hits on a limit of 2 are 3 total, 2
// within, 1 over and 1 near the limit (Envoy's arithmetic at 0.8); a
// request of two descriptors to a domain the rules lack counts 2
// domain_not_found; and envoy-rl's gRPC server reporter counts each call
// and times it (ratelimit_server.<method>).
func TestServeE2EStatsd(t *testing.T) {
	beside(t)
	for _, proto := range []string{"udp", "tcp"} {
		t.Run(proto, func(t *testing.T) {
			l, addr := udpStatsd(t)
			if proto == "tcp" {
				l, addr = tcpStatsd(t)
			}
			host, port, _ := net.SplitHostPort(addr)
			rules := filepath.Join(t.TempDir(), "rules.yaml")
			writeRules(t, rules, dayRule("stats", "k", 2))
			p := startSluice(t, []string{"USE_STATSD=true", "STATSD_HOST=" + host, "STATSD_PORT=" + port,
				"STATS_FLUSH_INTERVAL=100ms", "EXTRA_TAGS=env:test,team:edge"},
				"--config", rules, "--statsd-protocol", proto)
			for range 3 {
				p.must("stats", desc("k", "v"))
			}
			p.must("no:such", desc("k", "v"), desc("k", "w"))
			const prefix = "ratelimit.service.rate_limit.stats.k."
			const tags = ".__env=test.__team=edge"
			want := map[string]uint64{
				prefix + "total_hits" + tags: 3, prefix + "within_limit" + tags: 2, prefix + "over_limit" + tags: 1, prefix + "near_limit" + tags: 1,
				"ratelimit.service.config_load_success" + tags:                 1,
				"ratelimit.service.rate_limit.no_such.domain_not_found" + tags: 2,
				"ratelimit_server.ShouldRateLimit.total_requests" + tags:       4,
			}
			const timer = "ratelimit_server.ShouldRateLimit.response_time" + tags
			poll(t, "the stats at the statsd listener", func() bool {
				for stat, n := range want {
					if l.get(stat) != n {
						return false
					}
				}
				return l.timed(timer) == 4
			})
		})
	}
}

// dogLine is one DogStatsD datagram line: name:value|type|#tag,tag.
type dogLine struct {
	name, value, typ string
	tags             []string // sorted
}

// parseDog reads a DogStatsD line; ok is false for anything else.
func parseDog(s string) (dogLine, bool) {
	name, rest, ok := strings.Cut(s, ":")
	if !ok {
		return dogLine{}, false
	}
	parts := strings.Split(rest, "|")
	if len(parts) < 2 {
		return dogLine{}, false
	}
	l := dogLine{name: name, value: parts[0], typ: parts[1]}
	for _, p := range parts[2:] {
		if t, ok := strings.CutPrefix(p, "#"); ok {
			l.tags = strings.Split(t, ",")
			slices.Sort(l.tags)
		}
	}
	return l, true
}

// TestServeE2EDogStatsd: with envoy-rl's USE_DOG_STATSD, the same stats go
// to a real UDP listener in DogStatsD's format, EXTRA_TAGS as tags, and
// envoy-rl's mogrifiers (its README's example) rewrite the per-rule names
// into one name per stat with the domain and descriptor as tags. A
// mogrifier without its pattern, or both statsd switches on, stop the
// start with a message that says so.
func TestServeE2EDogStatsd(t *testing.T) {
	beside(t)
	var mu sync.Mutex
	var lines []dogLine
	addr := udpLines(t, func(s string) {
		if l, ok := parseDog(s); ok {
			mu.Lock()
			lines = append(lines, l)
			mu.Unlock()
		}
	})
	// sum adds up the values of a counter with exactly these tags.
	sum := func(name string, tags ...string) int {
		slices.Sort(tags)
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, l := range lines {
			if l.name == name && l.typ == "c" && slices.Equal(l.tags, tags) {
				v, _ := strconv.Atoi(l.value)
				n += v
			}
		}
		return n
	}
	host, port, _ := net.SplitHostPort(addr)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, dayRule("stats", "k", 2))
	env := []string{"USE_DOG_STATSD=true", "STATSD_HOST=" + host, "STATSD_PORT=" + port,
		"STATS_FLUSH_INTERVAL=100ms", "EXTRA_TAGS=env:test", "USE_DOG_STATSD_MOGRIFIERS=HITS",
		`DOG_STATSD_MOGRIFIER_HITS_PATTERN=^ratelimit\.service\.rate_limit\.([^.]+)\.(.*)\.([^.]+)$`,
		"DOG_STATSD_MOGRIFIER_HITS_NAME=ratelimit.service.rate_limit.$3",
		"DOG_STATSD_MOGRIFIER_HITS_TAGS=domain:$1,descriptor:$2"}
	p := startSluice(t, env, "--config", rules)
	for range 3 {
		p.must("stats", desc("k", "v"))
	}
	want := map[string]int{"total_hits": 3, "within_limit": 2, "over_limit": 1, "near_limit": 1}
	poll(t, "the DogStatsD stats", func() bool {
		for stat, n := range want {
			if sum("ratelimit.service.rate_limit."+stat, "env:test", "domain:stats", "descriptor:k") != n {
				return false
			}
		}
		// Not mogrified: tagged only with EXTRA_TAGS.
		return sum("ratelimit.service.config_load_success", "env:test") == 1
	})

	for name, c := range map[string]struct {
		env  []string
		want string
	}{
		"mogrifier without a pattern": {[]string{"USE_DOG_STATSD=true", "USE_DOG_STATSD_MOGRIFIERS=X", "DOG_STATSD_MOGRIFIER_X_NAME=n"}, "mogrifier X: no DOG_STATSD_MOGRIFIER_X_PATTERN"},
		"both sinks":                  {[]string{"USE_DOG_STATSD=true", "USE_STATSD=true"}, "USE_STATSD and USE_DOG_STATSD are both true"},
	} {
		bad := launch(t, c.env, "--config", rules)
		if code := bad.wait(); code == 0 || !strings.Contains(bad.log(), c.want) {
			t.Errorf("%s: exit %d, want a refusal saying %q:\n%s", name, code, c.want, bad.log())
		}
	}
}
