package httpconf

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/rules"
)

// TestFailureConcurrencyRefused: LoadFile refuses a route whose failure
// descriptor can reach a rule with a concurrency limit, at the
// descriptor's line, naming the route, the descriptor and the rule; and
// takes the same rules when no failure descriptor can reach it: its key
// differs, it is nested at another depth, a fixed value is taken by
// another rule first, or the route's own descriptors reach it.
func TestFailureConcurrencyRefused(t *testing.T) {
	const conc = "    concurrency: {max: 4}\n"
	for _, tc := range []struct {
		name, fail, rules string
		want              string // "" when the file loads
	}{
		{"value-less", `[{key: failed_login, source: remote_address}]`,
			"  - key: failed_login\n" + conc,
			`test.yaml:9:23: route "login": failures.descriptors[0] {failed_login: <request>} can reach rule api.failed_login (line 11), which has a concurrency limit`},
		{"a value the request may send", `[{key: user, header: X-User}]`,
			"  - key: user\n    value: admin\n" + conc,
			`failures.descriptors[0] {user: <request>} can reach rule api.user_admin`},
		{"a wildcard value", `[{key: user, header: X-User}]`,
			"  - key: user\n    value: adm*\n" + conc,
			"can reach rule api.user_adm*"},
		{"a key wildcard", `[{key: failed_login, source: remote_address}]`,
			"  - key: failed*\n" + conc,
			"can reach rule api.failed*"},
		{"the default key of a header", `[{header: X-User}]`,
			"  - key: X-User\n" + conc,
			"{X-User: <request>} can reach rule api.X-User"},
		{"a fixed value", `[{key: tier, value: gold}]`,
			"  - key: tier\n    value: gold\n" + conc,
			"{tier: gold} can reach rule api.tier_gold"},
		{"a fixed value, by a wildcard", `[{key: tier, value: gold}]`,
			"  - key: tier\n    value: g*\n" + conc + "  - key: tier\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
			"can reach rule api.tier_g*"},
		{"nested", `[{key: app, value: web}, {key: user, header: X-User}]`,
			"  - key: app\n    value: web\n    descriptors:\n      - key: user\n    " + conc,
			"can reach rule api.app_web.user"},
		{"another key", `[{key: failed_login, source: remote_address}]`,
			"  - key: remote_address\n" + conc, ""},
		{"another depth", `[{key: app, value: web}]`,
			"  - key: app\n    value: web\n    descriptors:\n      - key: user\n    " + conc, ""},
		{"a fixed value taken by its own rule", `[{key: tier, value: gold}]`,
			"  - key: tier\n    value: gold\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: tier\n" + conc, ""},
		{"a fixed value no wildcard matches", `[{key: tier, value: gold}]`,
			"  - key: tier\n    value: s*\n" + conc, ""},
		{"a key wildcard of other keys", `[{key: failed_login, source: remote_address}]`,
			"  - key: user*\n" + conc, ""},
		{"the route's descriptors", `[{key: failed_login, source: remote_address}]`,
			"  - key: remote_address\n" + conc + "  - key: failed_login\n    rate_limit: {unit: minute, requests_per_unit: 1}\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := `domain: api
http:
  routes:
    - pattern: "POST /login"
      name: login
      descriptors: [[{key: remote_address}]]
      failures:
        statuses: [401]
        descriptors: [` + tc.fail + `]
descriptors:
` + tc.rules
			path := filepath.Join(t.TempDir(), "test.yaml")
			if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			_, _, err := LoadFile(path)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused:\n%v\n%s", err, src)
				}
				return
			}
			var re *rules.Error
			if !errors.As(err, &re) || len(re.Problems) != 1 || !strings.Contains(re.Problems[0].String(), tc.want) {
				t.Fatalf("got %v\nwant one problem with %q\n%s", err, tc.want, src)
			}
		})
	}
}

// recorder is a Decider that records the descriptors of the first
// request it is asked to decide, and decides none.
type recorder struct{ descs chan []rules.Descriptor }

func (r recorder) Decide(_ context.Context, req *decide.Request, o *decide.Outcome) error {
	var ds []rules.Descriptor
	for _, d := range req.Descriptors {
		ds = append(ds, rules.Descriptor{Entries: append([]rules.Entry(nil), d.Entries...)})
	}
	select {
	case r.descs <- ds:
	default:
	}
	o.Reset()
	return errors.New("recorded")
}

// TestShapeKeys: the keys (and fixed values) the section's shapes give
// the failure descriptors are those httplimit sends for them: the
// sources' default keys included.
func TestShapeKeys(t *testing.T) {
	src := `domain: api
http:
  routes:
    - pattern: /
      failures:
        statuses: [401]
        descriptors:
          - [{header: X-User}]
          - [{api_key: Authorization}]
          - [{country: CF-IPCountry}]
          - [{value: v}]
          - [{source: remote_address}]
          - [{source: method}]
          - [{source: path}]
          - [{key: remote_address}]
          - [{key: k, header: X-User}, {key: c, value: w}]
`
	s, p, err := parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	f := s.Routes[0].Failures
	rec := recorder{descs: make(chan []rules.Descriptor, 1)}
	mw, err := httplimit.New(httplimit.Config{Decider: rec, Domain: "api", Failures: f})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest("POST", "/login", nil)
	req.Header.Set("X-User", "u")
	req.Header.Set("Authorization", "Bearer a")
	req.Header.Set("CF-IPCountry", "FR")
	mw(http.NotFoundHandler()).ServeHTTP(httptest.NewRecorder(), req)
	sent := <-rec.descs
	shapes := p.failureShapes[f]
	if len(sent) != len(shapes) {
		t.Fatalf("%d descriptors sent, %d shapes", len(sent), len(shapes))
	}
	for i, d := range sent {
		sh := shapes[i]
		if len(d.Entries) != len(sh.entries) {
			t.Fatalf("descriptor %d: sent %v, shape %v", i, d.Entries, sh)
		}
		for j, e := range d.Entries {
			if se := sh.entries[j]; e.Key != se.key || se.fixed && e.Value != se.value {
				t.Errorf("descriptor %d entry %d: sent %s=%s, shape %s", i, j, e.Key, e.Value, sh)
			}
		}
	}
}
