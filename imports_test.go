package sluice_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The groups of third-party packages the allow lists name.
var (
	// The embedded store's hash.
	xxh3 = []string{"github.com/zeebo/xxh3", "github.com/klauspost/cpuid"}
	// The Prometheus client, with what it brings (protobuf among it).
	prometheus = []string{"github.com/prometheus/", "github.com/beorn7/perks", "github.com/cespare/xxhash", "github.com/munnerz/goautoneg", "google.golang.org/protobuf/", "golang.org/x/sys/"}
	// The rules' YAML.
	yaml = []string{"go.yaml.in/yaml/v3"}
	// gRPC and the Envoy protos, for the codecs and the servers.
	envoy = []string{"google.golang.org/grpc", "google.golang.org/protobuf/", "google.golang.org/genproto/", "github.com/envoyproxy/", "github.com/cncf/xds/", "golang.org/x/net/", "golang.org/x/sys/", "golang.org/x/text/"}
	// The MaxMind database reader of the proxy's GeoIP sources.
	maxmind = []string{"github.com/oschwald/maxminddb-golang/v2", "golang.org/x/sys/"}
)

// allowed lists, for every public package and for the internal ones whose
// weight matters to a user (the proxy without Redis, the codec), every
// package it may depend on, directly or not, beyond the standard library:
// the module's own by path relative to the module ("" is the root), the
// others by path prefix. Data flows one way, from the transports through
// the decision core to the stores and the algorithms; the Envoy protocol
// types stay in the codecs at the edge; a package that needs Redis or
// Prometheus says so here.
var allowed = map[string][][]string{
	// The vocabulary: the arithmetic, the context key through which a
	// front door of this module is told of permits, and the hook through
	// which the decision core makes a Permit held elsewhere; nothing else.
	"": {{"internal/base/algo", "internal/vocab/permittrace", "internal/vocab/permitfunc"}},
	// Why a store failed: the standard library only.
	"fault": {},
	// The stores know nothing of rules or of the ways requests arrive.
	"memstore":                   {{"", "internal/vocab/permittrace", "internal/vocab/permitfunc", "internal/base/algo", "internal/vocab/limits"}, xxh3},
	"redisstore":                 {{"", "internal/vocab/permittrace", "internal/vocab/permitfunc", "fault", "internal/base/algo", "internal/vocab/limits", "internal/stores/breaker", "internal/base/logsample", "internal/base/redact", "internal/base/wheremetric", "redisstore/internal/luasrc"}, xxh3, prometheus, {"github.com/redis/rueidis"}},
	"redisstore/internal/luasrc": {{"", "internal/vocab/permittrace", "internal/vocab/permitfunc", "internal/base/algo"}},
	"localcache":                 {{"", "internal/vocab/permittrace", "internal/vocab/permitfunc", "internal/base/algo", "internal/vocab/limits", "internal/base/wheremetric", "internal/stores/decorator"}, xxh3, prometheus},
	// Leases wrap any store, and name none.
	"lease":     {{"", "internal/vocab/permittrace", "internal/vocab/permitfunc", "fault", "internal/base/algo", "internal/stores/decorator"}, xxh3},
	"storetest": {{"", "internal/vocab/permittrace", "internal/vocab/permitfunc", "internal/base/algo", "internal/vocab/limits", "internal/stores/decorator"}},
	"rules":     {{"", "internal/vocab/permittrace", "internal/vocab/permitfunc", "internal/base/algo", "internal/base/entrytext", "internal/base/yamlwalk", "internal/base/calendar"}, yaml},
	// The decision core: plain Go, no protocol, no store.
	"decide": {{"", "internal/vocab/permittrace", "internal/vocab/permitfunc", "fault", "internal/base/algo", "internal/vocab/bounds", "internal/base/entrytext", "internal/base/yamlwalk", "internal/base/calendar", "rules"}, yaml},
	// The HTTP middleware calls the core directly: no gRPC, no protobuf,
	// no Envoy types, no Redis client, no Prometheus.
	"httplimit": {{"", "internal/vocab/permittrace", "internal/vocab/permitfunc", "fault", "internal/base/algo", "internal/vocab/bounds", "internal/vocab/limits", "internal/base/entrytext", "internal/base/yamlwalk", "internal/base/calendar", "internal/base/logsample", "internal/decision/ratelimitheaders", "internal/edges/openai", "rules", "decide"}, yaml},
	"httpretry": {{"internal/base/algo"}},
	// The proxy: the middleware in front of a reverse proxy, its
	// Prometheus metrics and top keys; no Redis client unless the
	// command wires one, no gRPC, no Envoy types.
	"internal/edges/proxy": {{"", "internal/vocab/permittrace", "internal/vocab/permitfunc", "fault", "internal/base/algo", "internal/vocab/bounds", "internal/vocab/limits", "internal/base/entrytext", "internal/base/yamlwalk", "internal/base/calendar", "internal/base/logsample", "internal/decision/ratelimitheaders", "internal/edges/openai", "rules", "decide", "httplimit",
		"internal/edges/dashboard", "internal/edges/hitters", "internal/edges/topkeys", "internal/edges/httpconf", "internal/base/wheremetric", "internal/edges/geoip", "internal/decision/readiness"}, yaml, prometheus, maxmind,
		{"golang.org/x/net/", "golang.org/x/text/"}}, // the reverse proxy's HTTP/2
	// The Envoy codec converts; it serves nothing and stores nothing.
	"internal/edges/rls": {{"", "internal/vocab/permittrace", "internal/vocab/permitfunc", "fault", "internal/base/algo", "internal/vocab/bounds", "internal/vocab/limits", "internal/base/entrytext", "internal/base/yamlwalk", "internal/base/calendar", "rules", "decide"}, yaml, envoy},
	// Top keys: a data structure, fed by the hooks; no Redis client.
	"internal/edges/hitters": {{"internal/base/entrytext"}},
	// What takes the secrets out of what is shown: the standard library.
	"internal/base/redact": nil,
	// The YAML walker of the rules and http readers owns no schema.
	"internal/base/yamlwalk": {yaml},
	// The GeoIP databases: MaxMind's reader (and the system calls it
	// maps files with), no writer, nothing of httplimit.
	"internal/edges/geoip": {maxmind},
}

// TestImportAllowList holds every public package, and the internal ones
// named in allowed, to what allowed lets it depend on; a new public
// package must be given its list.
func TestImportAllowList(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	const mod = "github.com/sluicehq/sluice"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{.Name}} {{len .GoFiles}} {{join .Deps " "}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg, name, files, deps := fields[0], fields[1], fields[2], fields[3:]
		rel := strings.TrimPrefix(strings.TrimPrefix(pkg, mod), "/")
		lists, ok := allowed[rel]
		// Commands (cmd/, the examples) are programs, not API.
		public := !strings.Contains("/"+rel+"/", "/internal/") && !strings.HasPrefix(rel, "cmd/") && name != "main"
		switch {
		case !ok && public && files != "0":
			t.Errorf("%s: a public package without an allow list (imports_test.go)", pkg)
			continue
		case !ok:
			continue
		}
		seen[rel] = true
		for _, dep := range deps {
			if !strings.Contains(strings.Split(dep, "/")[0], ".") {
				continue // the standard library
			}
			if !allows(lists, mod, dep) {
				t.Errorf("%s depends on %s, which its allow list does not name", pkg, dep)
			}
		}
	}
	for rel := range allowed {
		if !seen[rel] {
			t.Errorf("%s: in the allow lists, not found by go list", rel)
		}
	}
}

// allows reports whether dep is in lists: a module package by its exact
// path, another by a prefix.
func allows(lists [][]string, mod, dep string) bool {
	for _, l := range lists {
		for _, a := range l {
			switch {
			case !strings.Contains(a, ".") || a == "":
				if p := strings.TrimSuffix(mod+"/"+a, "/"); dep == p {
					return true
				}
			case dep == a || strings.HasPrefix(dep, a) && (strings.HasSuffix(a, "/") || strings.HasPrefix(dep, a+"/")):
				return true
			}
		}
	}
	return false
}
