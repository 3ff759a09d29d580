package redact_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/base/redact"
	"github.com/sluicehq/sluice/internal/testsupport/secrettest"
)

func TestValue(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"redis://default:s3cret@127.0.0.1:6379/0", "redis://xxxxx@127.0.0.1:6379/0"},
		{"rediss://:s3cret@redis:6380", "rediss://xxxxx@redis:6380"},
		{"redis://user@host:6379", "redis://xxxxx@host:6379"},
		{"redis://host:6379", "redis://host:6379"},
		{"unix:///run/redis.sock", "unix:///run/redis.sock"},
		{"unix://:pw@/run/redis.sock", "unix://xxxxx@/run/redis.sock"},
		{"redis://u:pa/ss@word@host:bad", "redis://xxxxx@host:bad"},
		{"redis://:my pass@host", "redis://xxxxx@host"},
		{`redis://:a"b'c<d>e@host`, "redis://xxxxx@host"},
		{"redis://:a://b@host", "redis://xxxxx@host"},
		{"redis://:p#w?x@host:1/0?addr=h2:2", "redis://xxxxx@host:1/0?addr=h2:2"},
		{"u:s3cret@h:1", "xxxxx@h:1"},
		{"h1:6379,u:s3cret@h2:6379", "xxxxx@h2:6379"},
		{"u:x://y@h:1", "xxxxx@h:1"},
		{"h1:1,redis://u:p@h2:2", "xxxxx@h2:2"},
		{"http://api.example:8080/v1", "http://api.example:8080/v1"},
		{"-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n", "xxxxx"},
		{"", ""},
	} {
		if got := redact.Value(c.in); got != c.want {
			t.Errorf("Value(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestArgs(t *testing.T) {
	in := []string{"sluice", "serve", "--config", "r.yaml",
		"--redis-url", "redis://default:s1@127.0.0.1:6379",
		"--redis-password", "s2", "-redis-password=s3", "--xds-headers", "authorization=Bearer s4",
		"--admin-token-file", "tokens", "--statsd-tags=k:v", "--redis-url=redis://:s5@h:1",
		"--coordinator-url=redis://:s 6@h:1", "--upstream", `http://u:"s7"@h`, "--redis-password", "-s8",
		"--grpc-tls-key", "-----BEGIN EC PRIVATE KEY-----\ns9\n-----END EC PRIVATE KEY-----",
		"--", "--redis-password"}
	want := []string{"sluice", "serve", "--config", "r.yaml",
		"--redis-url", "redis://xxxxx@127.0.0.1:6379",
		"--redis-password", "xxxxx", "-redis-password=xxxxx", "--xds-headers", "xxxxx",
		"--admin-token-file", "tokens", "--statsd-tags=k:v", "--redis-url=redis://xxxxx@h:1",
		"--coordinator-url=redis://xxxxx@h:1", "--upstream", "http://xxxxx@h", "--redis-password", "xxxxx",
		"--grpc-tls-key", "xxxxx",
		"--", "--redis-password"}
	got := redact.Args(in)
	if !slices.Equal(got, want) {
		t.Errorf("Args\n got %q\nwant %q", got, want)
	}
	if in[5] != "redis://default:s1@127.0.0.1:6379" {
		t.Error("Args changed its argument")
	}
}

func TestSecretFlag(t *testing.T) {
	for name, want := range map[string]bool{
		"redis-password": true, "password": true, "xds-headers": true, "api-token": true, "client-secret": true,
		"redis-auth": true, "admin-token-file": false, "token-file": false, "redis-url": false, "config": false,
		"header": false, "grpc-tls-key": false, "redis-tls-key": false,
		"completion-tokens": false, "response-headers": false, "envoy-headers": false,
	} {
		if got := redact.SecretFlag(name); got != want {
			t.Errorf("SecretFlag(%q) = %v, want %v", name, got, want)
		}
	}
	for name, want := range map[string]bool{
		"REDIS_AUTH": true, "REDIS_SENTINEL_AUTH": true, "SLUICE_REDIS_PASSWORD": true, "OTEL_EXPORTER_OTLP_HEADERS": true,
		"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": true, "SLUICE_ADMIN_TOKEN_FILE": false, "REDIS_URL": false,
		"REDIS_TLS_CLIENT_KEY": false, "LIMIT_RESPONSE_HEADERS_ENABLED": false, "SLUICE_RESPONSE_HEADERS": false,
	} {
		if got := redact.SecretEnv(name); got != want {
			t.Errorf("SecretEnv(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestURLError: what url.Parse says of a bad URL, without the URL or any
// piece of it.
func TestURLError(t *testing.T) {
	for raw, want := range map[string]string{
		"redis://:my pass@host":       "invalid userinfo",
		"redis://:pa/ss@host":         "invalid port after host",
		"redis://:s3cret%zz@host":     "invalid URL escape (a % not followed by two hexadecimal digits)",
		"redis://h\x7fst:1":           "invalid control character in URL",
		"redis://[s3cret:1":           "missing ']' in host",
		"http://s3cr<et>@h":           "invalid userinfo",
		"http://h/%s3cret":            "invalid URL escape (a % not followed by two hexadecimal digits)",
		"http://ho st":                "invalid character in host name",
		"http://s3cret\x00@h":         "invalid control character in URL",
		"http://u:s3cret@[::1%zz]:80": "invalid URL escape (a % not followed by two hexadecimal digits)",
	} {
		_, err := url.Parse(raw)
		if err == nil {
			t.Errorf("url.Parse(%q) took it", raw)
			continue
		}
		if got := redact.URLError(err); got != want {
			t.Errorf("URLError(%q) = %q, want %q (url.Parse: %v)", raw, got, want, err)
		}
	}
}

func TestSecrets(t *testing.T) {
	got := redact.Secrets(
		[]string{"--redis-url", "redis://u:pw1@h", "--redis-password=pw2", "--xds-headers", "authorization=Bearer tok3,x-key=k4",
			"--config", "rules.yaml", "--statsd-tags=a:b"},
		[]string{"REDIS_AUTH=user:pw5", "SLUICE_COORDINATOR_URL=redis://:pw6@h", "SLUICE_ADMIN_TOKEN_FILE=/t@x", "SLUICE_CONFIG=r.yaml"})
	want := []string{"/t", ":pw6", "Bearer tok3", "authorization=Bearer tok3,x-key=k4", "k4", "pw1", "pw2", "pw5", "pw6", "tok3", "u:pw1", "user:pw5"}
	if !slices.Equal(got, want) {
		t.Errorf("Secrets\n got %q\nwant %q", got, want)
	}
}

func TestScrubber(t *testing.T) {
	s := redact.NewScrubber([]string{`p"a ss`, "abc", "t%40ken"})
	for in, want := range map[string]string{
		`parse "redis://:p\"a ss@h": bad`:          `parse "redis://:xxxxx@h": bad`,
		`{"err":"parse \"redis://:p\\\"a ss@h\""}`: `{"err":"parse \"redis://:xxxxx@h\""}`,
		"redis://:p%22a%20ss@h":                    "redis://:xxxxx@h",
		"abc is too short to look for":             "abc is too short to look for",
		"t%40ken and t@ken":                        "xxxxx and xxxxx",
	} {
		if got := s.String(in); got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
	}
	var nilScrubber *redact.Scrubber
	if got := nilScrubber.String("x"); got != "x" {
		t.Errorf("nil Scrubber: %q", got)
	}
}

// TestArgsHidePasswords: a command line shows none of thousands of
// random passwords, in a URL of any form or in a secret flag.
func TestArgsHidePasswords(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		p := secrettest.New(r, false)
		pw := p.Text
		var args []string
		for _, u := range secrettest.URLForms(pw) {
			args = append(args, "--redis-url", u, "--coordinator-url="+u, "-upstream="+u, u)
		}
		args = append(args, "--redis-password", pw, "--redis-password="+pw, "-redis-password="+pw,
			"--xds-headers", "authorization=Bearer "+pw, "--admin-token", pw)
		got := strings.Join(redact.Args(args), "\x00")
		if run := p.Shown(got); run != "" {
			t.Fatalf("password %q: Args shows %q:\n%q", pw, run, got)
		}
	}
}

// TestScrubbedTextHidesPasswords: whatever a library makes of a secret
// of a command line or an environment (quoted in an error, in a text or
// JSON log line, percent-encoded in a URL), the Scrubber of Secrets
// shows none of hundreds of random passwords (each builds a Scrubber).
func TestScrubbedTextHidesPasswords(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 200 {
		p := secrettest.New(r, false)
		pw := p.Text
		forms := secrettest.URLForms(pw)
		args := []string{"--redis-password", pw}
		var env []string
		for i, u := range forms {
			args = append(args, fmt.Sprintf("--url%d=%s", i, u))
			env = append(env, fmt.Sprintf("SLUICE_URL%d=%s", i, u))
		}
		env = append(env, "REDIS_AUTH=user:"+pw, "OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer "+pw)
		s := redact.NewScrubber(redact.Secrets(args, env))
		var text bytes.Buffer
		text.WriteString(strings.Join(args, " ") + strings.Join(env, " "))
		for _, u := range forms {
			_, perr := url.Parse(u)
			err := fmt.Errorf("dial %s: %q: %v: %w", u, u, perr, errors.New(pw))
			for _, h := range []slog.Handler{slog.NewTextHandler(&text, nil), slog.NewJSONHandler(&text, nil)} {
				slog.New(h).Error("failed", "err", err, "url", u, "password", pw)
			}
			fmt.Fprintf(&text, "%s %q %+q %#v\n", u, u, u, u)
		}
		if got := s.String(text.String()); p.Shown(got) != "" {
			t.Fatalf("password %q: scrubbed text shows %q:\n%q", pw, p.Shown(got), got)
		}
	}
}

// TestValueHidesPasswords: Value of a URL-like value shows none of
// thousands of random passwords, and url.Parse's complaint about it
// (URLError) none either.
func TestValueHidesPasswords(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for range 5000 {
		p := secrettest.New(r, false)
		pw := p.Text
		for _, u := range secrettest.URLForms(pw) {
			got := redact.Value(u)
			if _, err := url.Parse(u); err != nil {
				got += " " + redact.URLError(err)
			}
			if run := p.Shown(got); run != "" {
				t.Fatalf("password %q: Value(%q) shows %q: %q", pw, u, run, got)
			}
		}
	}
}
