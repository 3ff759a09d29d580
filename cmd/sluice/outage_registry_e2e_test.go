package main

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

// TestServeRedisRestoredRegistry: a Redis that comes back for a moment
// with an old node registry, or none, does not hand out larger local
// shares. Three nodes on one Redis, a key of 600 an hour with half of it
// used. Redis is killed (SIGKILL), restarted 5 s later, and killed again
// as soon as each node has renewed its entry once; then the clients load a
// new key on the three nodes until they admit no more: together they
// admit at most the limit (the local policy's bound, N·max(1,
// floor(600/N)) = 600 for N = 3), and every node still counts three. Two
// restarts:
//
//   - aof: Redis writes every command to its append-only file before
//     answering (appendfsync always) and restarts from it, with a registry
//     whose every entry has expired: the first node to renew read one
//     node, the second two.
//   - empty: Redis keeps nothing and restarts empty, as after a flush.
func TestServeRedisRestoredRegistry(t *testing.T) {
	besideFromTheStart(t)
	sluiceBinary(t)
	t.Run("aof", func(t *testing.T) {
		restoredRegistry(t, true)
	})
	t.Run("empty", func(t *testing.T) {
		restoredRegistry(t, false)
	})
}

func restoredRegistry(t *testing.T, aof bool) {
	const (
		nodes = 3
		limit = 600
		used  = 300
		down  = 5 * time.Second // past the registry's three seconds
	)
	opts := []redistest.Option{
		// Every command in the slow log, with its arguments: the test
		// reads there which nodes renewed their entries.
		redistest.WithConfig("slowlog-log-slower-than", "0"),
		redistest.WithConfig("slowlog-max-len", "10000"),
	}
	if aof {
		opts = append(opts, redistest.WithConfig("appendonly", "yes"), redistest.WithConfig("appendfsync", "always"))
	}
	srv := redistest.Standalone(t, opts...)
	dir := t.TempDir()
	writeRules(t, filepath.Join(dir, "rules.yaml"), "domain: restore\nfailure_policy: local\ndescriptors:\n"+
		"  - key: k\n    rate_limit: {unit: hour, requests_per_unit: "+strconv.Itoa(limit)+"}\n")

	// One hour window for the whole test: not within two minutes of its
	// end.
	if left := time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)); left < 2*time.Minute {
		t.Logf("waiting %s for the next hour", left.Round(time.Second))
		time.Sleep(left + time.Second)
	}
	procs := startSluices(t, nodes, "--config", dir, "--debug-addr", "",
		"--store", "redis", "--redis-url", srv.URL(), "--redis-timeout", "100ms")
	poll(t, "sluice_nodes 3 on every process", func() bool { return allMetric(procs, "sluice_nodes", strconv.Itoa(nodes)) })
	for i := range used {
		if got := codesOf(procs[i%nodes].must("restore", desc("k", "a"))); got != "OK:OK" {
			t.Fatalf("request %d before the outage: %s", i, got)
		}
	}

	srv.Kill()
	killed := time.Now()
	time.Sleep(time.Until(killed.Add(down)))
	srv.Restart()
	restarted := time.Now()
	if n, err := srv.Do("EXISTS", "sluice:nodes"); aof && (err != nil || n != int64(1)) {
		t.Fatalf("Redis did not restore the registry from its append-only file: EXISTS %v, %v", n, err)
	}
	// Killed again as soon as every node has renewed its entry in the
	// restored registry once.
	renewed := map[string]bool{}
	for len(renewed) < nodes {
		if time.Since(restarted) > e2eWait {
			t.Fatalf("%d of %d nodes renewed their entries %s after Redis restarted", len(renewed), nodes, e2eWait)
		}
		for id := range registryRenewals(t, srv) {
			renewed[id] = true
		}
		time.Sleep(2 * time.Millisecond)
	}
	srv.Kill()
	up := time.Since(restarted)
	counts := make([]string, nodes)
	for i, p := range procs {
		counts[i] = p.metric("sluice_nodes")
	}

	// Load in rounds of 2 s until a round admits nothing: every node has
	// spent its share.
	targets := []*target{newTarget("restore", "k", "b", limitSpec{alg: "fixed_window", n: limit, period: time.Hour}, true)}
	admitted := make([]int, nodes)
	total := 0
	for round, more := 0, true; more; round++ {
		if round == 10 {
			t.Fatalf("still admitting after %d rounds of load: %v", round, admitted)
		}
		l := startLoad(t, procs, 48, targets, func(int, int) int { return 0 }, time.Now())
		time.Sleep(2 * time.Second)
		more = false
		for _, s := range l.finish() {
			if s.ok() {
				admitted[s.proc]++
				total++
				more = true
			}
		}
	}
	t.Logf("Redis up %s between the kills; the nodes counted %s nodes; admitted on the new key %v, %d in all (at most %d)",
		up.Round(time.Millisecond), strings.Join(counts, ", "), admitted, total, limit)
	if total > limit {
		t.Errorf("%d admitted on a new key during the second outage, more than the limit of %d: the nodes counted %s nodes", total, limit, strings.Join(counts, ", "))
	}
	for i, c := range counts {
		if c != strconv.Itoa(nodes) {
			t.Errorf("process %d counted %s nodes in the second outage, not %d", i, c, nodes)
		}
	}
}

// registryRenewals returns the ids of the nodes whose renewals of their
// registry entries are in srv's slow log.
func registryRenewals(t *testing.T, srv *redistest.Server) map[string]bool {
	t.Helper()
	v, err := srv.Do("SLOWLOG", "GET", "-1")
	if err != nil {
		return nil // Redis loading, say
	}
	ids := map[string]bool{}
	entries, _ := v.([]any)
	for _, e := range entries {
		fields, _ := e.([]any)
		if len(fields) < 4 {
			continue
		}
		args, _ := fields[3].([]any)
		// FCALL sluice_nodes_<hash> 1 <registry> <id> <ttl> join
		if len(args) == 7 && args[0] == "FCALL" && strings.HasPrefix(args[1].(string), "sluice_nodes_") && args[6] == "join" {
			ids[args[4].(string)] = true
		}
	}
	return ids
}
