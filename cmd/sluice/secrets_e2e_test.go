package main

// End-to-end property tests of the rule that sluice never shows a
// secret: random passwords holding every kind of byte (those of URL
// syntax, quotes, spaces, '<' '>', '%', control bytes, invalid UTF-8 and
// other Unicode; not NUL, which no argument or variable of a process can
// hold: the kernel passes them as C strings) given to the real binary in
// URLs, secret flags, environment variables and a token file, and looked
// for, whole or any piece of them (internal/testsupport/secrettest), in everything
// it shows: the debug listener's pages (pprof's cmdline, /rules,
// /hitters, the dashboard's data), /readyz and /metrics, the admin API,
// sluice explain's output and --help, the logs in JSON and in text, and
// the errors of a start refused.

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
	"github.com/sluicehq/sluice/internal/testsupport/secrettest"
)

// secrets is the passwords of one test, and where each was given.
type secrets struct {
	r   *rand.Rand
	pws []secrettest.Password
	at  []string
}

// next returns a new password for where, ending in end.
func (s *secrets) next(where string, end ...string) string {
	p := secrettest.New(s.r, true)
	p.Text += strings.Join(end, "")
	s.pws, s.at = append(s.pws, p), append(s.at, where)
	return p.Text
}

// userinfo writes user and password as a URL's userinfo with as little
// percent-encoding as url.Parse takes: the bytes RFC 3986 allows there
// (quotes, parentheses, ';', '=', ',', ':' among them) as they are.
func userinfo(user, password string) string {
	var b strings.Builder
	b.WriteString(url.User(user).String() + ":")
	for i := 0; i < len(password); i++ {
		c := password[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~!$&'()*+,;=:", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// token returns a new bearer token for an --admin-token-file: a password
// with no control byte (a token is a line of the file and the value of
// an HTTP header), and a run of 16 letters and digits (16 bytes at
// least).
func (s *secrets) token(where string) string {
	p := secrettest.New(s.r, true)
	p.Text = strings.Map(func(c rune) rune {
		if c < 0x20 || c == 0x7f {
			return -1
		}
		return c
	}, p.Text)
	run := make([]byte, 16)
	for i := range run {
		run[i] = "abcdefghijklmnopqrstuvwxyz0123456789"[s.r.IntN(36)]
	}
	p.Text += string(run)
	p.Runs = append(p.Runs, string(run))
	s.pws, s.at = append(s.pws, p), append(s.at, where)
	return p.Text
}

// check fails t for every password that text (what where shows) shows.
func (s *secrets) check(t *testing.T, where, text string) {
	t.Helper()
	for i, p := range s.pws {
		if run := p.Shown(text); run != "" {
			t.Errorf("%s shows %q of the password given in %s (%q):\n%.3000s", where, run, s.at[i], p.Text, text)
		}
	}
}

// get returns the status and body of GET url, with the header hv (name,
// value) if given.
func get(t *testing.T, url string, hv ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(hv) == 2 {
		req.Header.Set(hv[0], hv[1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.Status + "\n" + string(body)
}

// runBinary runs the binary with args and the environment env, and
// returns its exit status and its stdout and stderr together.
func runBinary(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	cmd := exec.CommandContext(ctx, sluiceBinary(t), args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("sluice %s: %v", args[0], err)
	}
	return code, string(out)
}

// TestE2ESecretsNeverShown starts sluice serve, once with JSON logs and
// once with text logs, on a real Redis, with random passwords in every
// place a secret is given: the Redis URL (as an ACL user's, valid and
// used), --redis-password (used), the coordinator URL of the region tier
// (used), the admin API's token file (used, by sluice explain too),
// --xds-headers, the OTLP exporter's endpoint and headers, and variables
// sluice reads but whose flag wins (SLUICE_REDIS_PASSWORD, REDIS_AUTH,
// REDIS_URL, SLUICE_ADMIN_URL, envoy-rl's xDS headers). No page, answer,
// output or log line shows any piece of any of them.
func TestE2ESecretsNeverShown(t *testing.T) {
	beside(t)
	redistest.Require(t)
	srv := redistest.Standalone(t)
	for i, format := range []string{"json", "text"} {
		t.Run(format, func(t *testing.T) {
			s := &secrets{r: rand.New(rand.NewPCG(uint64(100+i), 1))}
			secretsServe(t, srv, s, format)
		})
	}
}

func secretsServe(t *testing.T, srv *redistest.Server, s *secrets, format string) {
	// A quote and a parenthesis, which a URL may hold as they are.
	urlPW, flagPW := s.next("--redis-url", "'x)"), s.next("--redis-password")
	// The ACL user takes both: --redis-password wins over the URL's.
	srv.Cmd("ACL", "SETUSER", "sluice", "reset", "on", ">"+urlPW, ">"+flagPW, "~*", "&*", "+@all")
	token := s.token("--admin-token-file")
	tokens := writeFile(t, "tokens", "ops:"+token+"\n")
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n")
	addr := map[string]string{}
	for _, name := range []string{"grpc", "http", "debug", "admin"} {
		addr[name] = "127.0.0.1:" + freePort(t)
	}
	args := []string{"--log-format", format, "--log-level", "debug", "--config", rules,
		"--grpc-addr", addr["grpc"], "--http-addr", addr["http"], "--debug-addr", addr["debug"],
		"--admin-addr", addr["admin"], "--admin-token-file", tokens,
		"--store", "redis", "--redis-url", "redis://" + userinfo("sluice", urlPW) + "@" + srv.Addr() + "/0",
		"--redis-password", flagPW,
		"--region", "r1", "--regions", "r1,r2",
		"--coordinator-url=redis://" + userinfo("", s.next("--coordinator-url", "\"")) + "@" + srv.Addr(),
		"--xds-headers", "authorization=Bearer " + s.next("--xds-headers"),
		"--tracing",
	}
	env := []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + url.UserPassword("otel", s.next("OTEL_EXPORTER_OTLP_ENDPOINT")).String() + "@127.0.0.1:" + freePort(t),
		"OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer%20" + url.QueryEscape(s.next("OTEL_EXPORTER_OTLP_HEADERS")),
		"SLUICE_REDIS_PASSWORD=" + s.next("SLUICE_REDIS_PASSWORD"),
		"REDIS_AUTH=sluice:" + s.next("REDIS_AUTH"), // its user is the URL's: it is read, as --redis-username
		"REDIS_URL=redis://:" + s.next("REDIS_URL") + "@127.0.0.1:1",
		"SLUICE_ADMIN_URL=http://admin:" + s.next("SLUICE_ADMIN_URL") + "@127.0.0.1:1",
		"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS=authorization=" + s.next("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"),
	}
	p := launchCommand(t, "serve", nil, env, args...)
	ready, connected := []string{`"msg":"ready"`}, []string{`"msg":"connected to redis"`, `"component":"redis"`}
	if format == "text" {
		ready, connected = []string{"msg=ready"}, []string{`msg="connected to redis"`, "component=redis "}
	}
	p.waitLog(ready...)
	p.waitLog(connected...) // with the passwords
	conn, err := grpc.NewClient(addr["grpc"], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	p.conn = conn
	for range 3 { // keys for /hitters and the dashboard, spans for the exporter
		p.must("api", desc("user", "alice"))
	}
	cmdline := get(t, "http://"+addr["debug"]+"/debug/pprof/cmdline")
	if !strings.Contains(cmdline, "--redis-password\x00xxxxx\x00") || !strings.Contains(cmdline, "--redis-url\x00redis://xxxxx@"+srv.Addr()) {
		t.Errorf("/debug/pprof/cmdline: %q, want the command line, masked", cmdline)
	}
	s.check(t, "/debug/pprof/cmdline", cmdline)
	for _, path := range []string{"/", "/rules", "/rules?format=text", "/hitters", "/dashboard/data", "/debug/pprof/goroutine?debug=2"} {
		s.check(t, path, get(t, "http://"+addr["debug"]+path))
	}
	for _, path := range []string{"/readyz", "/healthcheck", "/metrics"} {
		s.check(t, path, get(t, "http://"+addr["http"]+path))
	}
	s.check(t, "/v1/overrides", get(t, "http://"+addr["admin"]+"/v1/overrides", "Authorization", "Bearer "+token))

	code, out := runBinary(t, nil, "explain", "--server", "http://"+addr["admin"], "--token-file", tokens, "--domain", "api", "user=alice")
	if code != 0 || !strings.Contains(out, "user") {
		t.Errorf("sluice explain: exit %d:\n%s", code, out)
	}
	s.check(t, "sluice explain", out)
	explainEnv := []string{"SLUICE_ADMIN_URL=http://admin:" + s.next("SLUICE_ADMIN_URL of explain") + "@" + addr["admin"]}
	for _, args := range [][]string{{"explain", "--help"}, {"explain", "--help-all"}, {"explain", "--token-file", tokens, "--domain", "api", "user=alice"}} {
		_, out := runBinary(t, explainEnv, args...)
		s.check(t, strings.Join(args, " "), out)
	}

	if code := p.stop(syscall.SIGTERM); code != 0 {
		t.Errorf("exit %d", code)
	}
	s.check(t, "the log ("+format+")", p.log())
}

// TestE2ESecretsNeverShownAtStart: for a few random passwords given raw
// (not percent-encoded: most make an invalid URL) in the URLs of sluice
// serve (--redis-url, SLUICE_REDIS_URL, envoy-rl's REDIS_URL,
// --coordinator-url), sluice proxy (--upstream, --redis-url) and sluice
// explain (--server), the command refuses to start, or starts, without
// showing any piece of the password in its errors or logs.
func TestE2ESecretsNeverShownAtStart(t *testing.T) {
	beside(t)
	redistest.Require(t)
	srv := redistest.Standalone(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, "domain: api\n")
	proxyFile := filepath.Join(t.TempDir(), "proxy.yaml")
	writeRules(t, proxyFile, strings.Replace(proxyRules, "LOGIN", "2", 1))
	tokens := writeFile(t, "tokens", "ops:0123456789abcdef0123456789abcdef\n")
	serveAddrs := []string{"grpc-addr", "http-addr", "debug-addr"}
	proxyAddrs := []string{"listen", "admin-listen"}
	for seed := range uint64(3) {
		s := &secrets{r: rand.New(rand.NewPCG(seed, 2))}
		for _, c := range []struct {
			name, command string
			addrs, env    []string
			args          []string
		}{
			{"--redis-url", "serve", serveAddrs, nil,
				[]string{"--config", rules, "--store", "redis", "--redis-url", "redis://u:" + s.next("--redis-url") + "@127.0.0.1:1/0"}},
			{"SLUICE_REDIS_URL, text logs", "serve", serveAddrs, []string{"SLUICE_REDIS_URL=redis://:" + s.next("SLUICE_REDIS_URL") + "@127.0.0.1:1"},
				[]string{"--config", rules, "--store", "redis", "--log-format", "text"}},
			{"REDIS_URL", "serve", serveAddrs, []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=u:" + s.next("REDIS_URL") + "@127.0.0.1:1", "REDIS_AUTH=" + s.next("REDIS_AUTH")},
				[]string{"--config", rules}},
			{"--coordinator-url", "serve", serveAddrs, nil,
				[]string{"--config", rules, "--store", "redis", "--redis-url", "redis://" + srv.Addr(), "--region", "r1", "--regions", "r1,r2",
					"--coordinator-url", "redis://:" + s.next("--coordinator-url") + "@127.0.0.1:1"}},
			{"--upstream", "proxy", proxyAddrs, nil,
				[]string{"--config", proxyFile, "--upstream", "http://u:" + s.next("--upstream") + "@127.0.0.1:1"}},
			{"proxy --redis-url", "proxy", proxyAddrs, nil,
				[]string{"--config", proxyFile, "--upstream", "http://127.0.0.1:1", "--store", "redis", "--redis-url", "rediss://" + s.next("proxy --redis-url") + "@127.0.0.1:1"}},
			{"explain --server", "explain", nil, nil,
				[]string{"--server", "http://admin:" + s.next("explain --server") + "@127.0.0.1:1", "--token-file", tokens, "--domain", "api", "user=a"}},
		} {
			t.Run(fmt.Sprintf("%d/%s", seed, c.name), func(t *testing.T) {
				if c.command == "explain" { // not a server: no logs, no listeners
					code, out := runBinary(t, c.env, append([]string{c.command}, c.args...)...)
					if code == 0 {
						t.Errorf("exit 0:\n%s", out)
					}
					s.check(t, "sluice "+c.command+" with "+c.name, out)
					return
				}
				p := launchCommand(t, c.command, c.addrs, c.env, c.args...)
				deadline := time.Now().Add(e2eWait)
			wait:
				for time.Now().Before(deadline) {
					select {
					case <-p.done:
						break wait
					case <-time.After(20 * time.Millisecond):
					}
					if log := p.log(); strings.Contains(log, `"msg":"ready"`) || strings.Contains(log, "msg=ready") {
						p.stop(syscall.SIGTERM)
						break
					}
				}
				p.wait()
				s.check(t, "sluice "+c.command+" with "+c.name, p.log())
			})
		}
	}
}

// TestE2EOtherSecretsLeftAlone: a variable that is not sluice's, however
// secret its name sounds (a CI's job token, SSH_AUTH_SOCK), is not looked
// for in the logs; its value, were it masked, would blot out any text of
// them that happens to hold it (here, the rules file's name and the
// number 1000).
func TestE2EOtherSecretsLeftAlone(t *testing.T) {
	beside(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, "domain: api1000\n")
	p := launchCommand(t, "serve", []string{"grpc-addr", "http-addr", "debug-addr"},
		[]string{"CI_JOB_TOKEN=rules.yaml", "SSH_AUTH_SOCK=api1000"}, "--config", rules)
	deadline := time.Now().Add(e2eWait)
	for time.Now().Before(deadline) && !strings.Contains(p.log(), `"msg":"ready"`) {
		time.Sleep(20 * time.Millisecond)
	}
	p.stop(syscall.SIGTERM)
	p.wait()
	log := p.log()
	if !strings.Contains(log, `"msg":"ready"`) {
		t.Fatalf("not ready:\n%s", log)
	}
	for _, want := range []string{"rules.yaml", `"api1000"`} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %s: masked as if a secret of sluice's\n%s", want, log)
		}
	}
}
