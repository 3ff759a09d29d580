package httpconf_test

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/edges/httpconf"
)

// Every spelling of a name, with or without a port, is written one way;
// what cannot be read as a name or an address with a port is refused.
func TestHost(t *testing.T) {
	for host, want := range map[string]string{
		"":                        "",
		"api.example.com":         "api.example.com",
		"API.Example.COM":         "api.example.com",
		"api.example.com.":        "api.example.com",
		"API.EXAMPLE.COM.:8090":   "api.example.com:8090",
		"api.example.com:":        "api.example.com:",
		"Bücher.Example.":         "xn--bcher-kva.example",
		"BÜCHER.example:443":      "xn--bcher-kva.example:443",
		"XN--BCHER-KVA.example":   "xn--bcher-kva.example",
		"[::1]":                   "[::1]",
		"[2001:DB8::A]:80":        "[2001:db8::a]:80",
		"[fe80::1%25eth0]":        "[fe80::1%25eth0]",
		"127.0.0.1:9":             "127.0.0.1:9",
		"under_score.example.com": "under_score.example.com",
	} {
		got, err := httpconf.Host(host)
		if err != nil || got != want {
			t.Errorf("Host(%q) = %q, %v; want %q", host, got, err, want)
		}
		if again, err := httpconf.Host(got); err != nil || again != got {
			t.Errorf("Host(%q) = %q, %v; want it unchanged", got, again, err)
		}
	}
	for _, host := range []string{
		"api%2Eexample.com", "api.example.com:80:80", "api.example.com:http", "::1", "[::1", "[::1]x",
		"\xffapi.example.com", "bü_cher.example", ".", "api.example.com..", "a..b", ".a", "ü..x", "a。.b",
	} {
		if got, err := httpconf.Host(host); err == nil {
			t.Errorf("Host(%q) = %q, want an error", host, got)
		}
	}
	if n := testing.AllocsPerRun(100, func() { httpconf.Host("api.example.com:8090") }); n != 0 {
		t.Errorf("a host already written so: %v allocations, want 0", n)
	}
}

// FuzzHost: whatever Host accepts, it writes in lower case, without a
// trailing dot, and so that it writes it again unchanged; a host that
// differs from another only in the case of its ASCII letters and a
// trailing dot is written as that one is.
func FuzzHost(f *testing.F) {
	for _, s := range []string{"api.example.com", "API.Example.com.:8090", "[::A]:1", "Bücher.example.", "a%41", ":", "[", "."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, host string) {
		got, err := httpconf.Host(host)
		if err != nil {
			return
		}
		name, _, _ := strings.Cut(got, ":")
		if strings.HasPrefix(got, "[") {
			name = got[:strings.IndexByte(got, ']')+1]
		}
		if strings.ToLower(name) != name && !strings.HasPrefix(name, "[") || strings.HasSuffix(name, ".") {
			t.Errorf("Host(%q) = %q: upper case or a trailing dot left", host, got)
		}
		if again, err := httpconf.Host(got); err != nil || again != got {
			t.Errorf("Host(%q) = %q, then %q, %v", host, got, again, err)
		}
		if other, err := httpconf.Host(strings.ToUpper(host)); strings.IndexFunc(host, func(r rune) bool { return r >= 0x80 }) < 0 && (err != nil || other != got) {
			t.Errorf("Host(%q) = %q, but Host(%q) = %q, %v", host, got, strings.ToUpper(host), other, err)
		}
	})
}
