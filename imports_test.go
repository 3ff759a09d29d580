package sluice_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportRules holds the packages to the import rules their doc
// comments state, over their whole dependency graph (what each imports,
// directly or not): data flows one way, from the transports through the
// decision core to the stores and the algorithms, and the Envoy protocol
// types stay in the codecs at the edge.
func TestImportRules(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	const mod = "github.com/sluicehq/sluice"
	transports := []string{mod + "/internal/rls", mod + "/internal/server", mod + "/httplimit", mod + "/internal/proxy", mod + "/internal/rlsclient", mod + "/internal/simulate", mod + "/internal/httpconf"}
	grpc := []string{"google.golang.org/grpc", "google.golang.org/protobuf", "github.com/envoyproxy/"}
	// What no store may import: the rules, the core, a transport, an
	// RPC stack or the Envoy types (the Prometheus client of the store
	// metrics brings protobuf in, which is fine).
	storeBans := append([]string{mod + "/rules", mod + "/decide", "google.golang.org/grpc", "github.com/envoyproxy/"}, transports...)
	rules := map[string][]string{
		// The stores and the arithmetic know nothing of rules or of the
		// ways requests arrive.
		mod + "/internal/algo": append(storeBans, grpc...),
		// The embedded store needs nothing beyond its hash; its
		// Prometheus export is package memstoremetrics.
		mod + "/memstore":   append(storeBans, "github.com/prometheus/", "google.golang.org/protobuf"),
		mod + "/redisstore": storeBans,
		mod + "/localcache": storeBans,
		// Leases wrap any store, and name none.
		mod + "/lease": append(storeBans, mod+"/memstore", mod+"/redisstore", mod+"/localcache", "github.com/prometheus/"),
		mod + "/rules": append(append([]string{mod + "/decide", mod + "/memstore", mod + "/redisstore"}, transports...), grpc...),
		// The decision core: plain Go, no protocol, no store.
		mod + "/decide": append(append([]string{mod + "/memstore", mod + "/redisstore", mod + "/localcache"}, transports...), grpc...),
		// The HTTP middleware and the proxy call the core directly: no
		// gRPC, no protobuf, no Envoy types.
		mod + "/httplimit": append([]string{mod + "/internal/rls", mod + "/internal/server", mod + "/internal/rlsclient", mod + "/internal/proxy", mod + "/memstore", mod + "/redisstore"}, grpc...),
		// (The proxy's Prometheus metrics bring protobuf along.)
		mod + "/internal/proxy": {mod + "/internal/rls", mod + "/internal/server", mod + "/internal/rlsclient", mod + "/memstore", mod + "/redisstore", "google.golang.org/grpc", "github.com/envoyproxy/"},
		// Rules from xDS: a source of rules, deciding and serving nothing.
		mod + "/internal/xdsrules": {mod + "/decide", mod + "/memstore", mod + "/redisstore", mod + "/localcache", mod + "/internal/server", mod + "/httplimit", mod + "/internal/proxy", mod + "/internal/rls", mod + "/internal/rlsclient"},
		// The YAML walker of the rules and http readers owns no schema.
		mod + "/internal/yamlwalk": {mod},
		// What takes the secrets out of what is shown: the standard
		// library alone.
		mod + "/internal/redact": {mod, "github.com/", "golang.org/", "google.golang.org/", "go.yaml.in/"},
		// The header values and modes every front door shares.
		mod + "/internal/ratelimitheaders": append(append([]string{mod + "/memstore", mod + "/redisstore"}, transports...), grpc...),
		// The Envoy codec decodes and encodes; it serves nothing and
		// stores nothing (its proto package brings gRPC's stubs along).
		mod + "/internal/rls": {mod + "/internal/server", mod + "/httplimit", mod + "/internal/proxy", mod + "/internal/rlsclient", mod + "/memstore", mod + "/redisstore", mod + "/localcache"},
		// The Rate Limit Quota Service matches with the rules and keeps
		// its shares through a Redis client it is given: no other
		// transport, no store, no decision core (it decides no hits).
		// Runtime overrides: matched with the rules' entries, kept in a
		// file or given a backend; no transport of the rate limit
		// service, no store, no decision core.
		mod + "/internal/overrides": {mod + "/internal/server", mod + "/httplimit", mod + "/internal/proxy", mod + "/internal/rlsclient", mod + "/internal/rls", mod + "/internal/rlqs", mod + "/decide", mod + "/memstore", mod + "/redisstore", mod + "/localcache", mod + "/lease", "google.golang.org/grpc", "github.com/envoyproxy/"},
		// Heavy hitters: a data structure, fed by the transports.
		mod + "/internal/hitters": append(append([]string{mod + "/rules", mod + "/decide", mod + "/memstore", mod + "/redisstore", mod + "/localcache", mod + "/lease"}, transports...), grpc...),
		mod + "/internal/rlqs":    {mod + "/internal/server", mod + "/httplimit", mod + "/internal/proxy", mod + "/internal/rlsclient", mod + "/internal/rls", mod + "/decide", mod + "/memstore", mod + "/redisstore", mod + "/localcache", mod + "/lease"},
	}
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Deps " "}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, deps, _ := strings.Cut(line, " ")
		forbidden, ok := rules[pkg]
		if !ok {
			continue
		}
		seen[pkg] = true
		for _, dep := range strings.Fields(deps) {
			for _, f := range forbidden {
				if dep == f || strings.HasPrefix(dep, strings.TrimSuffix(f, "/")+"/") {
					t.Errorf("%s depends on %s", pkg, dep)
				}
			}
		}
	}
	for pkg := range rules {
		if !seen[pkg] {
			t.Errorf("%s: not found by go list", pkg)
		}
	}
}
