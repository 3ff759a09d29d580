package main

// DogStatsD output, as envoyproxy/ratelimit's USE_DOG_STATSD: the same
// stats, sent through DataDog's own client, with EXTRA_TAGS as DogStatsD
// tags rather than in the name, and envoy-rl's "mogrifiers", which rewrite
// a stat's name into a shorter one with tags (USE_DOG_STATSD_MOGRIFIERS
// and DOG_STATSD_MOGRIFIER_<NAME>_PATTERN, _NAME and _TAGS).

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/DataDog/datadog-go/v5/statsd"
	gostats "github.com/lyft/gostats"
)

// mogrifier rewrites the names its pattern matches: $0, $1, ... in its
// name and tag values are the match and its groups.
type mogrifier struct {
	pattern *regexp.Regexp
	name    string
	tags    [][2]string // key, value pattern, sorted by key
}

var mogrifierVar = regexp.MustCompile(`\$\d+`)

// expand replaces $i in s by match i (left as it is when there is none).
func expand(s string, match []string) string {
	return mogrifierVar.ReplaceAllStringFunc(s, func(v string) string {
		if i, err := strconv.Atoi(v[1:]); err == nil && i < len(match) {
			return match[i]
		}
		return v
	})
}

// parseMogrifiers reads the mogrifiers named in names (k,k) from their
// DOG_STATSD_MOGRIFIER_<NAME>_ variables, in order: the first that
// matches a stat rewrites it.
func parseMogrifiers(names string, env lookupEnv) ([]mogrifier, error) {
	var ms []mogrifier
	for _, n := range strings.Split(names, ",") {
		if n == "" {
			continue
		}
		prefix := "DOG_STATSD_MOGRIFIER_" + n + "_"
		pat, _ := env(prefix + "PATTERN")
		if pat == "" {
			return nil, fmt.Errorf("mogrifier %s: no %sPATTERN", n, prefix)
		}
		re, err := regexp.Compile(pat)
		if err != nil {
			return nil, fmt.Errorf("mogrifier %s: %sPATTERN: %v", n, prefix, err)
		}
		name, _ := env(prefix + "NAME")
		if name == "" {
			return nil, fmt.Errorf("mogrifier %s: no %sNAME", n, prefix)
		}
		m := mogrifier{pattern: re, name: name}
		if tags, _ := env(prefix + "TAGS"); tags != "" {
			kv, err := keyValues(tags, ":")
			if err != nil {
				return nil, fmt.Errorf("mogrifier %s: %sTAGS: %v", n, prefix, err)
			}
			for k, v := range kv {
				if v == "" {
					return nil, fmt.Errorf("mogrifier %s: %sTAGS: tag %s has no value", n, prefix, k)
				}
				m.tags = append(m.tags, [2]string{k, v})
			}
			slices.SortFunc(m.tags, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
		}
		ms = append(ms, m)
	}
	return ms, nil
}

// dogSink is a gostats sink to a DogStatsD agent.
type dogSink struct {
	client     *statsd.Client
	mogrifiers []mogrifier
}

func newDogSink(addr string, ms []mogrifier) (*dogSink, error) {
	c, err := statsd.New(addr, statsd.WithoutClientSideAggregation())
	if err != nil {
		return nil, fmt.Errorf("dogstatsd %s: %w", addr, err)
	}
	return &dogSink{client: c, mogrifiers: ms}, nil
}

// split turns gostats' name, with its tags serialized as .__key=value,
// into DogStatsD's name and key:value tags, then applies the first
// mogrifier that matches the name.
func (d *dogSink) split(full string) (string, []string) {
	name, rest, _ := strings.Cut(full, ".__")
	var tags []string
	if rest != "" {
		for _, kv := range strings.Split(rest, ".__") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				tags = append(tags, k+":"+v)
			}
		}
	}
	for _, m := range d.mogrifiers {
		match := m.pattern.FindStringSubmatch(name)
		if match == nil {
			continue
		}
		name = expand(m.name, match)
		for _, kv := range m.tags {
			tags = append(tags, kv[0]+":"+expand(kv[1], match))
		}
		break
	}
	return name, tags
}

func (d *dogSink) FlushCounter(name string, value uint64) {
	n, tags := d.split(name)
	d.client.Count(n, int64(value), tags, 1)
}

func (d *dogSink) FlushGauge(name string, value uint64) {
	n, tags := d.split(name)
	d.client.Gauge(n, float64(value), tags, 1)
}

func (d *dogSink) FlushTimer(name string, ms float64) {
	n, tags := d.split(name)
	d.client.Timing(n, time.Duration(ms*float64(time.Millisecond)), tags, 1)
}

// Flush sends what the client buffered: gostats calls it after each
// flush of the store.
func (d *dogSink) Flush() { d.client.Flush() }

var _ gostats.FlushableSink = (*dogSink)(nil)
