package httpconf_test

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/base/yamlwalk"
	"github.com/sluicehq/sluice/internal/decision/ratelimitheaders"
	"github.com/sluicehq/sluice/internal/edges/httpconf"
	"github.com/sluicehq/sluice/rules"
)

const full = `domain: api
http:
  client_ip:
    trusted_proxies: [10.0.0.0/8, "::1"]
    headers: [X-Forwarded-For, forwarded]
    ipv6_prefix: 56
    ipv4_prefix: 24
  headers: [ietf, Retry-After]
  shadow_mode: true
  routes:
    - pattern: "POST /login"
      name: login
      descriptors:
        - [{key: remote_address}]
        - [{key: user, header: X-User}]
        - [{key: method, source: method}, {key: path, source: path}]
        - [{key: plan, api_key: X-API-Key}]
        - [{country: CF-IPCountry}, {value: gold}]
      shaping: {max_delay: 750ms, max_queue: 20}
      failures:
        statuses: [401, 403]
        descriptors: [[{key: failed_login, source: remote_address}]]
      concurrency: {max: 4, descriptor: [{key: user, header: X-User}]}
    - pattern: "/"
      shaping: {max_delay: 2s}
      concurrency: {max: 100}
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
`

func TestParseFull(t *testing.T) {
	s, err := httpconf.Parse("test.yaml", []byte(full))
	if err != nil {
		t.Fatal(err)
	}
	want := &httpconf.Section{
		ClientIP: httplimit.ClientIP{
			TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")},
			Headers:        []string{"X-Forwarded-For", "forwarded"},
			IPv6Prefix:     56,
			IPv4Prefix:     24,
		},
		Headers:    ratelimitheaders.HeadersIETF | ratelimitheaders.HeadersRetryAfter,
		ShadowMode: true,
		Routes: []httpconf.Route{
			{Pattern: "POST /login", Name: "login", Line: 11, Descriptors: []httplimit.Descriptor{
				{{Key: "remote_address", Source: httplimit.RemoteAddress()}},
				{{Key: "user", Source: httplimit.Header("X-User")}},
				{{Key: "method", Source: httplimit.Method()}, {Key: "path", Source: httplimit.Path()}},
				{{Key: "plan", Source: httplimit.APIKey("X-API-Key")}},
				{{Source: httplimit.Country("CF-IPCountry")}, {Source: httplimit.Const("gold")}},
			},
				Shaping: &httplimit.Shaping{MaxDelay: 750 * time.Millisecond, MaxQueue: 20},
				Failures: &httplimit.Failures{
					Statuses:    []int{401, 403},
					Descriptors: []httplimit.Descriptor{{{Key: "failed_login", Source: httplimit.RemoteAddress()}}},
				},
				Concurrency: &httplimit.Concurrency{Max: 4, Descriptor: httplimit.Descriptor{{Key: "user", Source: httplimit.Header("X-User")}}},
			},
			{Pattern: "/", Name: "/", Line: 24,
				Shaping:     &httplimit.Shaping{MaxDelay: 2 * time.Second},
				Concurrency: &httplimit.Concurrency{Max: 100}},
		},
	}
	if !reflect.DeepEqual(s, want) {
		t.Errorf("got  %+v\nwant %+v", s, want)
	}
}

func TestDefault(t *testing.T) {
	for _, src := range []string{
		"",
		"domain: api\n",
		"domain: api\ndescriptors: []\n",
		"- not a mapping\n",
		"domain: api\nhttp:\n  shadow_mode: false\n",
		"domain: api\nhttp:\n  routes: ~\n",
	} {
		s, err := httpconf.Parse("test.yaml", []byte(src))
		if err != nil {
			t.Errorf("%q: %v", src, err)
			continue
		}
		if !reflect.DeepEqual(s.Routes, httpconf.Default().Routes) {
			t.Errorf("%q: routes %+v", src, s.Routes)
		}
	}
}

// headers names the families as sluice serve's --response-headers does:
// each item is one name of that flag's list, or all, or none alone.
func TestParseHeaders(t *testing.T) {
	for _, tc := range []struct {
		list string
		want ratelimitheaders.HeaderMode
	}{
		{"[all]", ratelimitheaders.HeadersAll},
		{"[None]", ratelimitheaders.HeadersNone},
		{"[off]", ratelimitheaders.HeadersNone},
		{"[x-ratelimit, Retry-After]", ratelimitheaders.HeadersXRateLimit | ratelimitheaders.HeadersRetryAfter},
		{"[ietf, all]", ratelimitheaders.HeadersAll},
	} {
		s, err := httpconf.Parse("test.yaml", []byte("domain: api\nhttp:\n  headers: "+tc.list+"\n"))
		if err != nil || s.Headers != tc.want {
			t.Errorf("headers: %s: %v %v, want %v", tc.list, s.Headers, err, tc.want)
			continue
		}
		flag, err := ratelimitheaders.ParseHeaderMode(strings.Trim(tc.list, "[]"))
		if err != nil || flag != tc.want {
			t.Errorf("--response-headers %s: %v %v, want %v", strings.Trim(tc.list, "[]"), flag, err, tc.want)
		}
	}
}

// Every problem of a section, each at its line and column.
func TestErrors(t *testing.T) {
	const head = "domain: api\nhttp:\n"
	for _, tc := range []struct {
		name, src string
		want      []string // "line:col: message" substrings, in order
	}{
		{"not a mapping", "http: [1]\n", []string{"1:7: the http section must be a mapping, got a list"}},
		{"unknown key", head + "  route: []\n", []string{`3:3: unknown key "route" in the http section (want one of client_ip, headers, shadow_mode, geoip, routes)`}},
		{"repeated key", head + "  shadow_mode: true\n  shadow_mode: false\n", []string{`4:3: key "shadow_mode" repeated (first at line 3)`}},
		{"shadow string", head + "  shadow_mode: 'yes'\n", []string{`3:16: shadow_mode must be true or false, got "yes"`}},
		{"bad proxy", head + "  client_ip:\n    trusted_proxies: [10.0.0.0/8, 300.1.1.1, 'a,b']\n", []string{
			`4:35: "300.1.1.1" is not an IP address or a CIDR prefix`, `4:46: "a,b" is not an IP address`}},
		{"proxies scalar", head + "  client_ip:\n    trusted_proxies: 10.0.0.0/8\n", []string{`4:22: trusted_proxies must be a list, got "10.0.0.0/8"`}},
		{"bad forwarding header", head + "  client_ip:\n    headers: [X-Client-IP]\n", []string{`4:15: forwarding header "X-Client-IP" is not X-Forwarded-For, Forwarded or X-Real-IP`}},
		{"no forwarding header", head + "  client_ip:\n    headers: []\n", []string{`4:14: client_ip headers is empty`}},
		{"ipv6 prefix", head + "  client_ip:\n    ipv6_prefix: 129\n    ipv4_prefix: 0\n", []string{
			`4:18: ipv6_prefix must be a whole number from 1 to 128, got "129"`, `5:18: ipv4_prefix must be a whole number from 1 to 32, got "0"`}},
		{"client_ip key", head + "  client_ip:\n    trusted: []\n", []string{`4:5: unknown key "trusted" in client_ip`}},
		{"header family", head + "  headers: [ietf, draft]\n", []string{`3:19: unknown header family "draft"`}},
		{"none not alone", head + "  headers: [none, ietf]\n", []string{`3:13: none must be alone in headers`}},
		{"headers empty", head + "  headers: []\n", []string{`3:12: headers is empty (use [none]`}},
		{"routes empty", head + "  routes: []\n", []string{`3:11: routes is empty`}},
		{"routes mapping", head + "  routes: {pattern: /}\n", []string{`3:11: routes must be a list, got a mapping`}},
		{"no pattern", head + "  routes:\n    - name: x\n", []string{`4:7: a route needs a pattern`}},
		{"bad pattern", head + "  routes:\n    - pattern: /a/{x\n", []string{`test.yaml:4: pattern "/a/{x": parsing "/a/{x": at offset 3: bad wildcard segment`}},
		{"no slash", head + "  routes:\n    - pattern: GET\n", []string{`test.yaml:4: pattern "GET": parsing "GET": at offset 0: host/path missing /`}},
		{"lower method", head + "  routes:\n    - pattern: get /x\n", []string{`4:16: pattern "get /x": the method must be upper case, as requests send it ("GET")`}},
		{"lower method, tab", head + "  routes:\n    - pattern: \"get\\t/x\"\n", []string{`pattern "get\t/x": the method must be upper case`}},
		{"host escape", head + "  routes:\n    - pattern: api%2Eexample.com/\n", []string{`4:16: pattern "api%2Eexample.com/": the host: a name with a percent escape`}},
		{"host empty label", head + "  routes:\n    - pattern: GET api..example.com/\n", []string{`4:16: pattern "GET api..example.com/": the host: a name with an empty label`}},
		{"host IDNA", head + "  routes:\n    - pattern: bü_cher.example/\n", []string{`the host: a name that is not valid IDNA`}},
		{"host port", head + "  routes:\n    - pattern: api.example.com:8090/\n", []string{`4:16: pattern "api.example.com:8090/": a pattern's host has no port`}},
		{"host IPv6", head + "  routes:\n    - pattern: \"[::1]/\"\n", []string{`4:16: pattern "[::1]/": an IPv6 address cannot be a pattern's host`}},
		{"host spellings", head + "  routes:\n    - pattern: api.example.com/\n    - {pattern: API.Example.com./, name: again}\n", []string{
			`test.yaml:5: pattern "api.example.com/" conflicts with the pattern "api.example.com/" of the route at line 4`}},
		{"space in path", head + "  routes:\n    - pattern: GET /a b\n", []string{`4:16: pattern "GET /a b": a pattern is [METHOD ][HOST]/PATH`}},
		{"same pattern", head + "  routes:\n    - pattern: /\n    - pattern: /a\n    - {pattern: /, name: root}\n", []string{
			`test.yaml:6: pattern "/" conflicts with the pattern "/" of the route at line 4`}},
		{"conflict", head + "  routes:\n    - pattern: /a/{x}\n    - pattern: /{y}/b\n", []string{
			`test.yaml:5: pattern "/{y}/b" conflicts with the pattern "/a/{x}" of the route at line 4: both match some requests and neither is more specific`}},
		{"same name", head + "  routes:\n    - {pattern: /a, name: n}\n    - {pattern: /b, name: n}\n", []string{`5:27: route name "n" repeated (first at line 4)`}},
		{"name is a pattern", head + "  routes:\n    - {pattern: /a}\n    - {pattern: /b, name: /a}\n", []string{`5:27: route name "/a" repeated (first at line 4)`}},
		{"reserved name", head + "  routes:\n    - {pattern: /a, name: _unmatched}\n", []string{`4:27: route name "_unmatched" must be printable`}},
		{"route key", head + "  routes:\n    - {pattern: /a, shape: true}\n", []string{`4:21: unknown key "shape" in a route (want one of pattern, name, descriptors, shaping, failures, concurrency, tokens)`}},
		{"tokens no reserve", head + "  routes:\n    - {pattern: /a, tokens: {descriptor: [{key: t, value: x}]}}\n", []string{`4:29: tokens needs reserve`}},
		{"tokens no descriptor", head + "  routes:\n    - {pattern: /a, tokens: {reserve: {default: 5}}}\n", []string{`4:29: tokens needs descriptor`}},
		{"tokens no default", head + "  routes:\n    - {pattern: /a, tokens: {descriptor: [{key: t, value: x}], reserve: {max: 5}}}\n", []string{`reserve needs default`}},
		{"tokens default over max", head + "  routes:\n    - {pattern: /a, tokens: {descriptor: [{key: t, value: x}], reserve: {default: 9, max: 5}}}\n", []string{`reserve: default 9 is above max 5`}},
		{"tokens prompt", head + "  routes:\n    - {pattern: /a, tokens: {descriptor: [{key: t, value: x}], reserve: {default: 9, prompt: words}}}\n", []string{`prompt must be bytes`}},
		{"tokens weight", head + "  routes:\n    - {pattern: /a, tokens: {descriptor: [{key: t, value: x}], reserve: {default: 9}, usage: {input_weight: 0}}}\n", []string{`input_weight must be a whole number from 1`}},
		{"tokens header", head + "  routes:\n    - {pattern: /a, tokens: {descriptor: [{key: t, value: x}], reserve: {default: 9, header: \"a b\"}}}\n", []string{`reserve header "a b" is not a valid header name`}},
		{"tokens unbounded", head + "  routes:\n    - {pattern: /a, tokens: {descriptor: [{key: t, value: x}], reserve: {default: 9}, enforce: true, unbounded: maybe}}\n", []string{`unbounded must be refuse`}},
		{"tokens unbounded without enforce", head + "  routes:\n    - {pattern: /a, tokens: {descriptor: [{key: t, value: x}], reserve: {default: 9}, unbounded: allow}}\n", []string{`unbounded needs enforce: true`}},
		{"tokens and shaping", head + "  routes:\n    - {pattern: /a, shaping: {max_delay: 1s}, tokens: {descriptor: [{key: t, value: x}], reserve: {default: 9}}}\n", []string{`a route with tokens cannot have shaping or failures`}},
		{"shaping not a mapping", head + "  routes:\n    - {pattern: /a, shaping: true}\n", []string{`4:30: shaping must be a mapping, got "true"`}},
		{"shaping no delay", head + "  routes:\n    - {pattern: /a, shaping: {max_queue: 3}}\n", []string{`4:30: shaping needs max_delay`}},
		{"shaping bad delay", head + "  routes:\n    - {pattern: /a, shaping: {max_delay: 5}}\n", []string{`4:42: max_delay must be a duration from 1ms to 1h0m0s`}},
		{"shaping long delay", head + "  routes:\n    - {pattern: /a, shaping: {max_delay: 2h}}\n", []string{`4:42: max_delay must be a duration`}},
		{"shaping queue", head + "  routes:\n    - {pattern: /a, shaping: {max_delay: 1s, max_queue: 0}}\n", []string{`4:57: max_queue must be a whole number from 1 to 1048576`}},
		{"shaping key", head + "  routes:\n    - {pattern: /a, shaping: {max_delay: 1s, burst: 3}}\n", []string{`4:46: unknown key "burst" in shaping`}},
		{"failures empty", head + "  routes:\n    - {pattern: /a, failures: {}}\n", []string{`4:31: failures needs descriptors`, `4:31: failures needs statuses`}},
		{"failures status", head + "  routes:\n    - {pattern: /a, failures: {statuses: [401, 99], descriptors: [[{key: remote_address}]]}}\n", []string{`4:48: a status must be a whole number from 100 to 599`}},
		{"failures statuses empty", head + "  routes:\n    - {pattern: /a, failures: {statuses: [], descriptors: [[{key: remote_address}]]}}\n", []string{`4:42: statuses is empty`}},
		{"failures bad entry", head + "  routes:\n    - {pattern: /a, failures: {statuses: [401], descriptors: [[{key: u}]]}}\n", []string{`4:64: an entry needs a source`}},
		{"concurrency no max", head + "  routes:\n    - {pattern: /a, concurrency: {descriptor: [{key: remote_address}]}}\n", []string{`4:34: concurrency needs max`}},
		{"concurrency max", head + "  routes:\n    - {pattern: /a, concurrency: {max: 0}}\n", []string{`4:40: max must be a whole number from 1`}},
		{"concurrency empty", head + "  routes:\n    - {pattern: /a, concurrency: {max: 1, descriptor: []}}\n", []string{`4:55: descriptor is empty`}},
		{"descriptors empty", head + "  routes:\n    - {pattern: /a, descriptors: []}\n", []string{`4:34: descriptors is empty`}},
		{"descriptor mapping", head + "  routes:\n    - pattern: /a\n      descriptors:\n        - {key: remote_address}\n", []string{
			`6:11: a descriptor (a list of entries) must be a list, got a mapping`}},
		{"empty descriptor", head + "  routes:\n    - pattern: /a\n      descriptors: [[]]\n", []string{`5:21: a descriptor needs at least one entry`}},
		{"no source", head + "  routes:\n    - pattern: /a\n      descriptors: [[{key: user}]]\n", []string{`5:22: an entry needs a source`}},
		{"two sources", head + "  routes:\n    - pattern: /a\n      descriptors: [[{key: user, header: X-User, api_key: X-Key}]]\n", []string{
			`5:50: "api_key" is a second source in one entry`}},
		{"unknown source", head + "  routes:\n    - pattern: /a\n      descriptors: [[{source: cookie}]]\n", []string{`5:31: unknown source "cookie"`}},
		{"bad header name", head + "  routes:\n    - pattern: /a\n      descriptors: [[{key: u, header: \"X User\"}]]\n", []string{`5:39: "X User" is not a header name`}},
		{"header injection", head + "  routes:\n    - pattern: /a\n      descriptors: [[{key: u, header: \"X-User\\r\\nX-Admin\"}]]\n", []string{`is not a header name`}},
		{"bad const", head + "  routes:\n    - pattern: /a\n      descriptors: [[{value: \"a\\nb\"}]]\n", []string{`5:30: value must be printable`}},
		{"entry key", head + "  routes:\n    - pattern: /a\n      descriptors: [[{key: u, cookie: c}]]\n", []string{`5:31: unknown key "cookie" in an entry`}},
		{"too many entries", head + "  routes:\n    - pattern: /a\n      descriptors: [[" + strings.Repeat("{source: path},", 9) + "]]\n", []string{
			`5:21: a descriptor (a list of entries) has 9 items (at most 8)`}},
		{"bad yaml", head + "  routes:\n   - x\n  y\n", []string{`test.yaml:5: invalid YAML:`}},
		{"several", head + "  shadow_mode: 1\n  routes:\n    - {pattern: get /}\n    - {name: x}\n", []string{
			`3:16: shadow_mode must be true or false`, `5:17: pattern "get /"`, `6:7: a route needs a pattern`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := httpconf.Parse("test.yaml", []byte(tc.src))
			var re *rules.Error
			if !errors.As(err, &re) {
				t.Fatalf("error %v, want a *rules.Error", err)
			}
			msgs := make([]string, len(re.Problems))
			for i, p := range re.Problems {
				msgs[i] = p.String()
			}
			if len(msgs) != len(tc.want) {
				t.Errorf("%d problems, want %d:\n%s", len(msgs), len(tc.want), strings.Join(msgs, "\n"))
			}
			for i, w := range tc.want {
				if i < len(msgs) && !strings.Contains(msgs[i], w) {
					t.Errorf("problem %d is\n\t%s\nwant it to contain\n\t%s", i, msgs[i], w)
				}
			}
		})
	}
}

// A pattern's host is written as requests' hosts are matched (Host): in
// lower case, without a trailing dot, in its IDNA form; the method and
// path are left as they are, and the route is named by the pattern so
// written.
func TestPatternHosts(t *testing.T) {
	s, err := httpconf.Parse("test.yaml", []byte(`domain: api
http:
  routes:
    - pattern: "API.Example.COM./V1/{Name}"
    - pattern: "POST\tAdmin.Example.com/Login"
    - {pattern: "Bücher.example/", name: books}
    - pattern: "/Other/"
`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range s.Routes {
		got = append(got, r.Pattern+" = "+r.Name)
	}
	want := []string{"api.example.com/V1/{Name} = api.example.com/V1/{Name}", "POST\tadmin.example.com/Login = POST\tadmin.example.com/Login",
		"xn--bcher-kva.example/ = books", "/Other/ = /Other/"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("patterns %q, want %q", got, want)
	}
}

// LoadFile reports the problems of the rules and of the section together,
// a YAML syntax error once.
func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	write := func(src string) string {
		path := filepath.Join(dir, "rules.yaml")
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	c, s, err := httpconf.LoadFile(write(full))
	if err != nil {
		t.Fatal(err)
	}
	if c.Domain("api") == nil || len(s.Routes) != 2 {
		t.Errorf("rules %v, routes %+v", c.Domains(), s.Routes)
	}

	_, _, err = httpconf.LoadFile(write("domain: api\nhttp:\n  shadow: true\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"))
	if err == nil {
		t.Fatal("no error")
	}
	for _, w := range []string{`:3:3: unknown key "shadow" in the http section`, `:6:24: invalid rate limit unit 'fortnight'`} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error\n%v\nlacks %q", err, w)
		}
	}

	_, _, err = httpconf.LoadFile(write("domain: api\nhttp:\n  routes:\n   - x\n  y\n"))
	var re *rules.Error
	if !errors.As(err, &re) || len(re.Problems) != 1 || !strings.Contains(re.Problems[0].Msg, "invalid YAML") {
		t.Errorf("bad YAML: %v", err)
	}

	if _, _, err := httpconf.LoadFile(filepath.Join(dir, "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

// TestParseAliasBudget: aliases that expand the section past what any real
// file holds stop the walk with one problem, as they stop a rules file's:
// the budget's, or the one past yamlwalk.MaxProblems (this bomb's
// routes repeat one pattern, each a problem, so the latter comes first).
func TestParseAliasBudget(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: api\nx:\n  e: &e {key: k, header: X-K}\n")
	b.WriteString("  d: &d [" + strings.TrimSuffix(strings.Repeat("*e, ", httplimit.MaxEntries), ", ") + "]\n")
	b.WriteString("  ds: &ds [" + strings.TrimSuffix(strings.Repeat("*d, ", httplimit.MaxDescriptors), ", ") + "]\n")
	b.WriteString("  r: &r {pattern: /, descriptors: *ds, failures: {statuses: [401], descriptors: *ds}, concurrency: {max: 1, descriptor: *d}}\n")
	b.WriteString("http:\n  routes: [" + strings.TrimSuffix(strings.Repeat("*r, ", httpconf.MaxRoutes), ", ") + "]\n")
	_, err := httpconf.Parse("bomb.yaml", []byte(b.String()))
	var re *rules.Error
	if !errors.As(err, &re) {
		t.Fatalf("error %v, want a *rules.Error", err)
	}
	last := re.Problems[len(re.Problems)-1]
	if last.Msg != "file too large or too deeply aliased" && !strings.HasPrefix(last.Msg, fmt.Sprintf("more than %d problems", yamlwalk.MaxProblems)) {
		t.Errorf("last problem %v, want the budget's or the problem cap's", last)
	}
	if len(re.Problems) > yamlwalk.MaxProblems+1 {
		t.Errorf("%d problems: the walk went on past the budget", len(re.Problems))
	}
}

// TestParseMergeKeys: the section takes YAML merge keys as the rules do,
// the mapping's own keys first.
func TestParseMergeKeys(t *testing.T) {
	src := "domain: api\nbase: &base {max_delay: 1s, max_queue: 5}\nhttp:\n  routes:\n    - pattern: /a\n      shaping: {<<: *base, max_queue: 7}\n"
	s, err := httpconf.Parse("merge.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if sh := s.Routes[0].Shaping; sh == nil || sh.MaxDelay != time.Second || sh.MaxQueue != 7 {
		t.Errorf("shaping %+v, want max_delay 1s from the merge and max_queue 7 of its own", sh)
	}
}

func TestTokens(t *testing.T) {
	src := `domain: llm
http:
  routes:
    - pattern: "POST /v1/chat/completions"
      descriptors: [[{key: api_key, api_key: Authorization}]]
      tokens:
        descriptor: [{key: api_key_tokens, api_key: Authorization}]
        reserve: {fields: [max_tokens], header: X-Max, default: 100, max: 400, prompt: bytes}
        usage: {input_weight: 1, output_weight: 4, header: X-Used}
        enforce: true
        unbounded: allow
        max_body: 1000
`
	s, err := httpconf.Parse("t.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	tok := s.Routes[0].Tokens
	if tok == nil {
		t.Fatal("no tokens")
	}
	want := httplimit.Tokens{
		Descriptor: httplimit.Descriptor{{Key: "api_key_tokens", Source: httplimit.APIKey("Authorization")}},
		Fields:     []string{"max_tokens"}, Header: "X-Max", Default: 100, Max: 400, PromptBytes: true,
		InputWeight: 1, OutputWeight: 4, UsageHeader: "X-Used", Enforce: true, AllowUnbounded: true, MaxBody: 1000,
	}
	if fmt.Sprint(*tok) != fmt.Sprint(want) {
		t.Fatalf("tokens\n%+v\nwant\n%+v", *tok, want)
	}
}
