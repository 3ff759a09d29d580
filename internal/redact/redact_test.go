package redact_test

import (
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/redact"
)

func TestString(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"redis://default:s3cret@127.0.0.1:6379/0", "redis://default:xxxxx@127.0.0.1:6379/0"},
		{"rediss://:s3cret@redis:6380", "rediss://:xxxxx@redis:6380"},
		{"redis://user@host:6379", "redis://user@host:6379"},
		{"redis://host:6379", "redis://host:6379"},
		{"no secret here: a:b, c@d", "no secret here: a:b, c@d"},
		{"mail ops@example.com at 10:30", "mail ops@example.com at 10:30"},
		{`parse "redis://u:pa/ss@word@host:bad": invalid port ":bad" after host`, `parse "redis://u:xxxxx@host:bad": invalid port ":bad" after host`},
		{`address "u:s3cret@host:6379" is not host:port`, `address "u:xxxxx@host:6379" is not host:port`},
		{"--redis-url=redis://u:s3cret@h:1", "--redis-url=redis://u:xxxxx@h:1"},
		{"url=u:s3cret@h:1,h2:1", "url=u:xxxxx@h:1,h2:1"},
		{"h1:6379,u:s3cret@h2:6379", "h1:xxxxx@h2:6379"},
		{"two: redis://a:one@h redis://b:two@h", "two: redis://a:xxxxx@h redis://b:xxxxx@h"},
		{"", ""},
	} {
		if got := redact.String(c.in); got != c.want {
			t.Errorf("String(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestArgs(t *testing.T) {
	in := []string{"sluice", "serve", "--config", "r.yaml",
		"--redis-url", "redis://default:s1@127.0.0.1:6379",
		"--redis-password", "s2", "-redis-password=s3", "--xds-headers", "authorization=Bearer s4",
		"--admin-token-file", "tokens", "--statsd-tags=k:v", "--redis-url=redis://:s5@h:1", "--", "--redis-password"}
	want := []string{"sluice", "serve", "--config", "r.yaml",
		"--redis-url", "redis://default:xxxxx@127.0.0.1:6379",
		"--redis-password", "xxxxx", "-redis-password=xxxxx", "--xds-headers", "xxxxx",
		"--admin-token-file", "tokens", "--statsd-tags=k:v", "--redis-url=redis://:xxxxx@h:1", "--", "--redis-password"}
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
		"redis-auth": true, "admin-token-file": false, "redis-url": false, "config": false, "header": false,
	} {
		if got := redact.SecretFlag(name); got != want {
			t.Errorf("SecretFlag(%q) = %v, want %v", name, got, want)
		}
	}
}

// FuzzString: the password of a URL never survives String, whatever the
// text around it and whatever the password holds.
func FuzzString(f *testing.F) {
	f.Add("before ", "s3cret", " after")
	f.Add(`parse "`, "p@ss/w:rd", `": invalid port`)
	f.Add("a=", "x", "")
	f.Fuzz(func(t *testing.T, before, password, after string) {
		if len(password) < 4 || strings.ContainsAny(password, " \t\n\r\x00\"'`<>") || strings.Contains(before+after, password) || strings.Contains(redact.Mask, password) {
			t.Skip()
		}
		u := "redis://default:" + password + "@127.0.0.1:6379/0"
		if strings.ContainsAny(before[max(len(before)-1, 0):], "=:/@") || strings.ContainsAny(after, "@") {
			t.Skip() // the URL is glued to its neighbours: another URL
		}
		got := redact.String(before + u + after)
		if strings.Contains(got, password) {
			t.Errorf("String(%q) = %q: the password shows", before+u+after, got)
		}
		if p, err := url.Parse(u); err == nil && before == "" && after == "" && got != p.Redacted() && strings.Count(password, "@") == 0 {
			t.Errorf("String(%q) = %q, URL.Redacted %q", u, got, p.Redacted())
		}
	})
}
