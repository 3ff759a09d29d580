package main

// End-to-end tests of what the listeners of sluice serve show, and to
// whom: the debug listener (profiles, rules, top keys, dashboard) and the
// admin API answer only the loopback unless an address is named, and no
// page, answer or log line shows a Redis password.

import (
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
	"github.com/sluicehq/sluice/internal/testsupport/testpart"
)

// TestServeE2ENoSecretShown: sluice serve on a real Redis that needs a
// password, given in --redis-url (and once more in --redis-password),
// shows the password nowhere: not in any page of the debug listener
// (pprof's cmdline included), of the HTTP listener or of the admin API,
// and not in its log. The same holds when the password is wrong.
func TestServeE2ENoSecretShown(t *testing.T) {
	beside(t)
	const secret = "Sup3rS3cretRedisPassw0rd"
	redistest.Require(t)
	srv := redistest.Standalone(t, redistest.WithPassword(secret))
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n")
	tokens := writeFile(t, "tokens", "ops:0123456789abcdef0123456789abcdef\n")

	for _, c := range []struct {
		name string
		url  string
		more []string
	}{
		{"right password", "redis://default:" + secret + "@" + srv.Addr() + "/0", []string{"--redis-password", secret}},
		{"wrong password", "redis://default:Wrong" + secret + "@" + srv.Addr(), []string{"--redis-password=Wrong" + secret}},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"--config", rules, "--store", "redis", "--redis-url", c.url,
				"--debug-addr", ":0", "--admin-addr", ":0", "--admin-token-file", tokens, "--log-level", "debug"}, c.more...)
			p := startSluice(t, nil, args...)
			for _, name := range []string{"debug", "admin"} {
				if a := p.addr(name); !strings.HasPrefix(a, "127.0.0.1:") {
					t.Errorf("%s listener on %q, want 127.0.0.1 (a bare :PORT)", name, a)
				}
			}
			for range 3 { // keys for /hitters and the dashboard
				p.rl("api", desc("user", "alice"))
			}
			shown := map[string]string{}
			get := func(base, path string, header ...string) {
				t.Helper()
				req, err := http.NewRequest("GET", "http://"+base+path, nil)
				if err != nil {
					t.Fatal(err)
				}
				if len(header) == 2 {
					req.Header.Set(header[0], header[1])
				}
				client := &http.Client{Timeout: e2eWait}
				resp, err := client.Do(req)
				if err != nil {
					t.Fatalf("GET %s: %v", path, err)
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil {
					t.Fatalf("GET %s: %v", path, err)
				}
				shown[base+path] = resp.Status + "\n" + string(body)
			}
			for _, path := range []string{
				"/", "/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/cmdline/", "/debug/pprof/goroutine?debug=2",
				"/debug/pprof/goroutine?debug=1", "/debug/pprof/heap?debug=1", "/debug/pprof/allocs?debug=1",
				"/debug/pprof/threadcreate?debug=1", "/debug/pprof/block?debug=1", "/debug/pprof/mutex?debug=1",
				"/debug/pprof/heap", "/debug/pprof/symbol", "/debug/pprof/profile?seconds=1", "/debug/pprof/trace?seconds=1",
				"/debug/vars", "/rules", "/rules?format=text", "/hitters", "/hitters?scope=cluster", "/dashboard", "/dashboard/data",
			} {
				get(p.dbg, path)
			}
			for _, path := range []string{"/healthz", "/readyz", "/healthcheck", "/metrics"} {
				get(p.httpAddr, path)
			}
			for _, path := range []string{"/v1/overrides", "/v1/overrides/export"} {
				get(p.addr("admin"), path, "Authorization", "Bearer 0123456789abcdef0123456789abcdef")
			}
			for where, body := range shown {
				if strings.Contains(body, secret) {
					t.Errorf("%s shows the password:\n%.2000s", where, body)
				}
			}
			cmdline := shown[p.dbg+"/debug/pprof/cmdline"]
			if !strings.Contains(cmdline, "--redis-url\x00redis://xxxxx@"+srv.Addr()) || !strings.Contains(cmdline, "--admin-token-file\x00"+tokens) {
				t.Errorf("/debug/pprof/cmdline: %q, want the command line with the password masked", cmdline)
			}
			p.stop(syscall.SIGTERM)
			if log := p.log(); strings.Contains(log, secret) {
				t.Errorf("the log shows the password:\n%s", log)
			}
		})
	}
}

// TestServeE2EBadRedisURLHidesThePassword: a --redis-url that does not
// parse is refused without showing its password.
func TestServeE2EBadRedisURLHidesThePassword(t *testing.T) {
	beside(t)
	const secret = "Sup3rS3cretRedisPassw0rd"
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, "domain: api\n")
	for _, u := range []string{"redis://default:" + secret + "@127.0.0.1:bad", "redis://default:" + secret + "%zz@127.0.0.1:1", "default:" + secret + "@127.0.0.1:1"} {
		p := launch(t, nil, "--config", rules, "--store", "redis", "--redis-url", u)
		if code := p.wait(); code != 1 {
			t.Errorf("--redis-url %q: exit %d, want 1", u, code)
		}
		if log := p.log(); strings.Contains(log, secret) || !strings.Contains(log, "xxxxx") {
			t.Errorf("--redis-url %q: the output shows the password, or does not say which URL:\n%s", u, log)
		}
	}
}

// TestServeE2EDebugAddress: the debug listener answers only the loopback
// unless its address names a host: a bare :PORT, or envoyproxy/ratelimit's
// DEBUG_PORT without DEBUG_HOST, listens on 127.0.0.1 (a client of
// 127.0.0.2, another address of the machine, is refused), and 0.0.0.0 (as
// --debug-addr or DEBUG_HOST) listens on every interface.
func TestServeE2EDebugAddress(t *testing.T) {
	beside(t)
	probe, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		testpart.Missing(t, "cannot use loopback address 127.0.0.2 here: "+err.Error())
	}
	probe.Close()
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, "domain: api\n")
	for _, c := range []struct {
		name       string
		args, env  []string
		everywhere bool
	}{
		{"bare port", []string{"--debug-addr", ":0"}, nil, false},
		{"DEBUG_PORT alone", nil, []string{"DEBUG_PORT=0"}, false},
		{"loopback named", []string{"--debug-addr", "127.0.0.1:0"}, nil, false},
		{"every interface named", []string{"--debug-addr", "0.0.0.0:0"}, nil, true},
		{"DEBUG_HOST 0.0.0.0", nil, []string{"DEBUG_HOST=0.0.0.0", "DEBUG_PORT=0"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := startSluice(t, c.env, append([]string{"--config", rules}, c.args...)...)
			host, port, err := net.SplitHostPort(p.dbg)
			if err != nil {
				t.Fatalf("debug listener %q: %v", p.dbg, err)
			}
			if loopback := host == "127.0.0.1"; loopback == c.everywhere {
				t.Errorf("debug listener on %q, want every interface %v", p.dbg, c.everywhere)
			}
			conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.2", port), e2eWait)
			if err == nil {
				conn.Close()
			}
			if reached := err == nil; reached != c.everywhere {
				t.Errorf("debug listener %s reached from 127.0.0.2: %v (%v), want %v", p.dbg, reached, err, c.everywhere)
			}
			if code, _, _ := httpDo(t, "GET", "http://127.0.0.1:"+port+"/rules", ""); code != 200 {
				t.Errorf("GET /rules on 127.0.0.1:%s: %d", port, code)
			}
		})
	}
}
