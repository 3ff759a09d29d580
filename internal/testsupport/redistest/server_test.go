package redistest

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

func TestStandalone(t *testing.T) {
	t.Parallel()
	s := Standalone(t)
	if got := s.Cmd("PING"); got != "PONG" {
		t.Fatalf("PING = %v", got)
	}
	if got := s.Cmd("SET", "k", "v"); got != "OK" {
		t.Fatalf("SET = %v", got)
	}
	if got := s.Cmd("GET", "k"); got != "v" {
		t.Fatalf("GET = %v", got)
	}
	if got := s.Cmd("INCRBY", "n", 41); got != int64(41) {
		t.Fatalf("INCRBY = %#v", got)
	}
	if got := s.Cmd("GET", "missing"); got != nil {
		t.Fatalf("GET missing = %#v", got)
	}
	if _, err := s.Do("NOSUCHCOMMAND"); !errors.As(err, new(Error)) {
		t.Fatalf("unknown command: err = %v, want an Error reply", err)
	}
	if got := s.Cmd("CONFIG", "GET", "save"); !equal(got, []any{"save", ""}) {
		t.Fatalf("CONFIG GET save = %#v, want no snapshots", got)
	}
	if got := s.Cmd("CONFIG", "GET", "appendonly"); !equal(got, []any{"appendonly", "no"}) {
		t.Fatalf("CONFIG GET appendonly = %#v", got)
	}
	if !strings.HasPrefix(s.Addr(), "127.0.0.1:") || s.URL() != "redis://"+s.Addr() {
		t.Fatalf("Addr %q, URL %q", s.Addr(), s.URL())
	}
}

func TestKillRestart(t *testing.T) {
	t.Parallel()
	s := Standalone(t)
	addr := s.Addr()
	s.Cmd("SET", "k", "v")
	c, err := s.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	s.Kill()
	if s.Running() {
		t.Fatal("Running after Kill")
	}
	if _, err := c.Do("PING"); err == nil {
		t.Fatal("PING on a connection to a killed server succeeded")
	}
	if _, err := s.Do("PING"); err == nil {
		t.Fatal("PING to a killed server succeeded")
	}

	s.Restart()
	if s.Addr() != addr {
		t.Fatalf("Restart moved the server from %s to %s", addr, s.Addr())
	}
	if got := s.Cmd("GET", "k"); got != nil {
		t.Fatalf("GET after restart = %#v, want nil (no persistence)", got)
	}
	s.Cmd("SET", "k", "again")

	// Restart of a running server shuts it down first.
	s.Restart()
	if got := s.Cmd("PING"); got != "PONG" {
		t.Fatalf("PING = %v", got)
	}
}

func TestPassword(t *testing.T) {
	t.Parallel()
	s := Standalone(t, WithPassword("s3cret pass"))
	if got := s.Cmd("SET", "k", "v"); got != "OK" {
		t.Fatalf("SET = %v", got)
	}
	_, err := Dialer{}.do(s.Addr(), "GET", "k")
	if err == nil || !strings.HasPrefix(err.Error(), "NOAUTH") {
		t.Fatalf("GET without AUTH: err = %v, want NOAUTH", err)
	}
	if _, err := (Dialer{Password: "wrong"}).Dial(s.Addr()); err == nil {
		t.Fatal("AUTH with a wrong password succeeded")
	}
	if got, want := s.URL(), "redis://:s3cret%20pass@"+s.Addr(); got != want {
		t.Fatalf("URL = %q, want %q", got, want)
	}
	s.Kill()
	s.Restart()
	if got := s.Cmd("PING"); got != "PONG" {
		t.Fatalf("PING after restart = %v", got)
	}
}

func TestACLUser(t *testing.T) {
	t.Parallel()
	s := Standalone(t, WithUser("sluice", "pw"))
	if got := s.Cmd("ACL", "WHOAMI"); got != "sluice" {
		t.Fatalf("ACL WHOAMI = %v", got)
	}
	if _, err := (Dialer{Password: "pw"}).Dial(s.Addr()); err == nil {
		t.Fatal("AUTH as the default user succeeded; it should be off")
	}
	if got, want := s.URL(), "redis://sluice:pw@"+s.Addr(); got != want {
		t.Fatalf("URL = %q, want %q", got, want)
	}
}

func TestTLS(t *testing.T) {
	t.Parallel()
	s := Standalone(t, WithTLS())
	if s.TLS == nil || s.CAFile == "" {
		t.Fatal("no TLS configuration for a TLS server")
	}
	if got := s.Cmd("SET", "k", "v"); got != "OK" {
		t.Fatalf("SET over TLS = %v", got)
	}
	if got := s.Cmd("CONFIG", "GET", "port"); !equal(got, []any{"port", "0"}) {
		t.Fatalf("CONFIG GET port = %#v, want no plain port", got)
	}
	// Plain RESP to the TLS port gets no answer.
	if _, err := (Dialer{Timeout: 500 * time.Millisecond}).do(s.Addr(), "PING"); err == nil {
		t.Fatal("plain PING to the TLS port succeeded")
	}
	if !strings.HasPrefix(s.URL(), "rediss://") {
		t.Fatalf("URL = %q", s.URL())
	}
	s.Kill()
	s.Restart()
	if got := s.Cmd("PING"); got != "PONG" {
		t.Fatalf("PING after restart = %v", got)
	}
}

func TestPause(t *testing.T) {
	t.Parallel()
	s := Standalone(t)
	s.Pause(300 * time.Millisecond)
	start := time.Now()
	s.Cmd("PING")
	if waited := time.Since(start); waited < 200*time.Millisecond {
		t.Fatalf("PING answered after %v during a 300ms pause", waited)
	}
}

func TestWithConfig(t *testing.T) {
	t.Parallel()
	s := Standalone(t, WithConfig("maxmemory", "10mb"), WithConfig("maxmemory-policy", "allkeys-lru"))
	if got := s.Cmd("CONFIG", "GET", "maxmemory"); !equal(got, []any{"maxmemory", "10485760"}) {
		t.Fatalf("CONFIG GET maxmemory = %#v", got)
	}
	if got := s.Cmd("CONFIG", "GET", "maxmemory-policy"); !equal(got, []any{"maxmemory-policy", "allkeys-lru"}) {
		t.Fatalf("CONFIG GET maxmemory-policy = %#v", got)
	}
}

// TestCleanup checks that a server is gone, its port free, once its test
// has ended.
func TestCleanup(t *testing.T) {
	t.Parallel()
	var s *Server
	t.Run("inner", func(t *testing.T) {
		s = Standalone(t)
	})
	if s.Running() {
		t.Fatal("server still running after its test ended")
	}
	if _, err := net.DialTimeout("tcp", s.Addr(), time.Second); err == nil {
		t.Fatal("port still accepting connections after cleanup")
	}
}

func TestFreePort(t *testing.T) {
	t.Parallel()
	seen := map[int]bool{}
	for range 20 {
		p, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] || p < portMin || p >= portMax {
			t.Fatalf("port %d repeated or out of range", p)
		}
		seen[p] = true
	}
}

func TestQuoteConfig(t *testing.T) {
	for in, want := range map[string]string{
		"yes":         "yes",
		"":            `""`,
		"a b":         `"a b"`,
		`q"uo\te`:     `"q\"uo\\te"`,
		">p w":        `">p w"`,
		"line\nbreak": `"line\nbreak"`,
	} {
		if got := quoteConfig(in); got != want {
			t.Errorf("quoteConfig(%q) = %s, want %s", in, got, want)
		}
	}
}

func equal(a, b any) bool {
	as, aok := a.([]any)
	bs, bok := b.([]any)
	if aok != bok {
		return false
	}
	if !aok {
		return a == b
	}
	if len(as) != len(bs) {
		return false
	}
	for i := range as {
		if !equal(as[i], bs[i]) {
			return false
		}
	}
	return true
}

// outcome records what Require did instead of ending the test.
type outcome struct {
	testing.TB
	fatal, skip string
}

func (o *outcome) Fatal(args ...any) { o.fatal = fmt.Sprint(args...) }
func (o *outcome) Skip(args ...any)  { o.skip = fmt.Sprint(args...) }

// TestRequire runs without the binaries on PATH: CI fails, elsewhere the
// test skips, both with the install command. Not parallel: it sets
// environment variables.
func TestRequire(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	for ci, want := range map[string]string{"true": "fatal", "1": "fatal", "": "skip", "false": "skip"} {
		t.Setenv("CI", ci)
		o := &outcome{TB: t}
		Require(o)
		got, msg := "skip", o.skip
		if o.fatal != "" {
			got, msg = "fatal", o.fatal
		}
		if got != want || o.fatal != "" && o.skip != "" || !strings.Contains(msg, InstallHint) {
			t.Errorf("CI=%q: fatal %q, skip %q; want %s with the install command", ci, o.fatal, o.skip, want)
		}
	}
}
