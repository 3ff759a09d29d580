package redistest

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testsupport/testpart"
)

// InstallHint is the command that installs what the package needs on
// Debian and Ubuntu; scripts/test runs it when the programs are missing.
const InstallHint = "apt-get install redis-server redis-tools redis-sentinel"

// Require fails the test when redis-server, redis-cli or redis-sentinel is
// not on PATH and the environment variable CI is true (CI must never skip
// silently), and skips it with the install command otherwise. Standalone,
// Cluster and Sentinel call it first.
func Require(t testing.TB) {
	t.Helper()
	var missing []string
	for _, name := range []string{"redis-server", "redis-cli", "redis-sentinel"} {
		if _, err := binary(name); err != nil {
			missing = append(missing, name)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("redistest: %s not found on PATH; install with: %s (scripts/test does)",
		strings.Join(missing, ", "), InstallHint)
	testpart.Missing(t, msg)
}

// An Option configures the servers of Standalone, Cluster and Sentinel.
type Option func(*options)

type options struct {
	user     string
	password string
	sentinel string // requirepass of the sentinels
	tls      bool
	config   [][]string
	certs    *certs
}

// WithPassword protects the servers with requirepass: the default user
// needs AUTH password.
func WithPassword(password string) Option {
	return func(o *options) { o.user, o.password = "", password }
}

// WithUser creates the ACL user name, allowed every command, key and
// channel, with the password, and turns the default user off, so that a
// client must AUTH name password.
func WithUser(name, password string) Option {
	return func(o *options) { o.user, o.password = name, password }
}

// WithSentinelPassword protects the sentinels of Sentinel with
// requirepass (they use it with each other too), apart from the data
// servers' WithPassword or WithUser.
func WithSentinelPassword(password string) Option {
	return func(o *options) { o.sentinel = password }
}

// WithTLS serves TLS only (no plain port), with a certificate for 127.0.0.1
// signed by a throwaway CA; Server.TLS is a client configuration that
// trusts it. Replication and the cluster bus use TLS too. The servers do
// not ask clients for certificates.
func WithTLS() Option {
	return func(o *options) { o.tls = true }
}

// WithConfig adds one configuration directive, as its words, to every
// data server (not to sentinels): WithConfig("maxmemory", "10mb"). It comes
// last, so it overrides the package's own settings.
func WithConfig(directive ...string) Option {
	return func(o *options) { o.config = append(o.config, directive) }
}

func newOptions(t testing.TB, opts []Option) *options {
	t.Helper()
	o := &options{}
	for _, opt := range opts {
		opt(o)
	}
	if o.tls {
		c, err := newCerts(filepath.Join(t.TempDir(), "tls"))
		if err != nil {
			t.Fatalf("redistest: certificates: %v", err)
		}
		o.certs = c
	}
	return o
}

func (o *options) dialer() Dialer {
	d := Dialer{Username: o.user, Password: o.password, Timeout: 2 * time.Second}
	if o.certs != nil {
		d.TLS = o.certs.clientConfig()
	}
	return d
}

// tlsLines are the TLS settings shared by data servers and sentinels.
func (o *options) tlsLines(port int) [][]string {
	if o.certs == nil {
		return [][]string{{"port", strconv.Itoa(port)}}
	}
	return [][]string{
		{"port", "0"},
		{"tls-port", strconv.Itoa(port)},
		{"tls-cert-file", o.certs.CertFile},
		{"tls-key-file", o.certs.KeyFile},
		{"tls-ca-cert-file", o.certs.CAFile},
		{"tls-auth-clients", "no"},
		{"tls-replication", "yes"},
	}
}

// dataConfig is the configuration of a redis-server: loopback only, no
// persistence, the DEBUG command allowed from loopback (DEBUG SLEEP makes a
// slow server), auth and TLS as asked, then role (cluster or replica
// settings), then the caller's directives.
func (o *options) dataConfig(port int, dir string, role [][]string) [][]string {
	l := [][]string{
		{"bind", "127.0.0.1"},
		{"daemonize", "no"},
		{"dir", dir},
		{"logfile", filepath.Join(dir, "redis.log")},
		{"save", ""},
		{"appendonly", "no"},
		{"enable-debug-command", "local"},
		// Replicas sync at once instead of after the default 5 s wait for
		// more replicas to share the transfer.
		{"repl-diskless-sync-delay", "0"},
	}
	l = append(l, o.tlsLines(port)...)
	if o.certs != nil {
		l = append(l, []string{"tls-cluster", "yes"})
	}
	switch {
	case o.user != "":
		l = append(l,
			[]string{"user", o.user, "on", ">" + o.password, "~*", "&*", "+@all"},
			[]string{"user", "default", "off"},
			[]string{"masteruser", o.user},
			[]string{"masterauth", o.password})
	case o.password != "":
		l = append(l, []string{"requirepass", o.password}, []string{"masterauth", o.password})
	}
	l = append(l, role...)
	return append(l, o.config...)
}

// Server is one redis-server (or redis-sentinel) process started by this
// package, stopped and its files removed when the test ends.
type Server struct {
	Username string      // ACL user clients must AUTH as; empty for the default user
	Password string      // empty when the server needs no AUTH
	TLS      *tls.Config // client configuration for a TLS server; nil for plain TCP
	CAFile   string      // the CA certificate file of a TLS server
	// CertFile and KeyFile are a client certificate of that CA and its
	// key, for a server that asks for one (WithConfig("tls-auth-clients",
	// "yes")).
	CertFile, KeyFile string

	t      testing.TB
	port   int
	proc   *process
	dialer Dialer
}

// Standalone starts a redis-server on a free loopback port with no
// persistence and waits until it answers PING. It is shut down (SHUTDOWN
// NOSAVE, then SIGKILL) and its files removed when the test ends; if the
// test failed, the end of its log is logged first.
func Standalone(t testing.TB, opts ...Option) *Server {
	t.Helper()
	Require(t)
	o := newOptions(t, opts)
	s, err := launch(t, o, "redis", "redis-server", func(port int, dir string) [][]string {
		return o.dataConfig(port, dir, nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// launch starts one server: a free port, a config file written by conf in
// a new temporary directory, a wait for PING. It tries another port when
// the one it picked was taken meanwhile.
func launch(t testing.TB, o *options, name, program string, conf func(port int, dir string) [][]string) (*Server, error) {
	t.Helper()
	bin, err := binary(program)
	if err != nil {
		return nil, err
	}
	dir := t.TempDir()
	confPath := filepath.Join(dir, program+".conf")
	for range 5 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		if err := writeConfig(confPath, conf(port, dir)); err != nil {
			return nil, err
		}
		s := &Server{
			Username: o.user,
			Password: o.password,
			t:        t,
			port:     port,
			dialer:   o.dialer(),
			proc: &process{
				name:    fmt.Sprintf("%s :%d", name, port),
				bin:     bin,
				args:    []string{confPath},
				dir:     dir,
				logPath: filepath.Join(dir, "redis.log"),
			},
		}
		if o.certs != nil {
			s.TLS, s.CAFile = o.certs.clientConfig(), o.certs.CAFile
			s.CertFile, s.KeyFile = o.certs.CertFile, o.certs.KeyFile
		}
		if err := s.proc.start(); err != nil {
			return nil, err
		}
		err = s.waitReady()
		if err == nil {
			t.Cleanup(s.cleanup)
			return s, nil
		}
		s.proc.kill()
		if !s.proc.logContains("Address already in use") {
			return nil, fmt.Errorf("redistest: %s: %w\n%s", s.proc.name, err, s.proc.logTail(30))
		}
		os.Remove(s.proc.logPath)
	}
	return nil, fmt.Errorf("redistest: %s: every port tried was taken", name)
}

func (s *Server) waitReady() error {
	return waitUntil(startTimeout, s.proc.done(), func() error {
		v, err := s.Do("PING")
		if err != nil {
			return err
		}
		if v != "PONG" {
			return fmt.Errorf("PING answered %v", v)
		}
		return nil
	})
}

func (s *Server) cleanup() {
	if s.t.Failed() {
		s.t.Logf("redistest: %s log (%s), last lines:\n%s", s.proc.name, s.proc.logPath, s.proc.logTail(40))
	}
	if err := s.proc.stop(s.shutdown); err != nil {
		s.t.Error(err)
	}
}

// shutdown sends SHUTDOWN NOSAVE NOW (NOW: do not wait for replicas),
// ignoring the reply: the server closes the connection as it exits.
func (s *Server) shutdown() {
	c, err := s.dialer.Dial(s.Addr())
	if err != nil {
		return
	}
	defer c.Close()
	c.Do("CLIENT", "UNPAUSE")
	c.Do("SHUTDOWN", "NOSAVE", "NOW")
}

// Addr is host:port, always on 127.0.0.1.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port is the server's port (its TLS port for a TLS server).
func (s *Server) Port() int { return s.port }

// URL is redis://[user:password@]127.0.0.1:port, or rediss:// for TLS.
func (s *Server) URL() string {
	u := url.URL{Scheme: "redis", Host: s.Addr()}
	if s.TLS != nil {
		u.Scheme = "rediss"
	}
	if s.Password != "" {
		u.User = url.UserPassword(s.Username, s.Password)
	}
	return u.String()
}

// Dialer returns the settings that reach this server: its credentials and
// TLS configuration.
func (s *Server) Dialer() Dialer { return s.dialer }

// Dial opens a connection, authenticated when the server needs it.
func (s *Server) Dial() (*Conn, error) { return s.dialer.Dial(s.Addr()) }

// Do runs one command on a new connection. See [Conn.Do] for the types of
// arguments and replies.
func (s *Server) Do(args ...any) (any, error) { return s.dialer.do(s.Addr(), args...) }

// Cmd runs one command like Do and fails the test on any error, including
// an error reply. Like t.Fatal, call it from the test's goroutine.
func (s *Server) Cmd(args ...any) any {
	s.t.Helper()
	v, err := s.Do(args...)
	if err != nil {
		s.t.Fatalf("redistest: %s %v: %v", s.proc.name, args, err)
	}
	return v
}

// Kill ends the server with SIGKILL, as a crash would: no shutdown, open
// connections reset. Restart brings it back on the same port.
func (s *Server) Kill() {
	s.t.Helper()
	if err := s.proc.kill(); err != nil {
		s.t.Error(err)
	}
}

// Running reports whether the server process is alive.
func (s *Server) Running() bool { return s.proc.running() }

// Restart starts the server again on the same port, with the same
// configuration and directory, after shutting it down if it is running,
// and waits until it answers PING. Without persistence a restarted
// standalone server is empty; a cluster node keeps its identity (its
// nodes.conf). It fails the test if the server does not come back; call it
// from the test's goroutine.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.proc.stop(s.shutdown); err != nil {
		s.t.Fatal(err)
	}
	if err := s.restart(); err != nil {
		s.t.Fatal(err)
	}
}

func (s *Server) restart() error {
	// The port was just freed by the old process; if something else took
	// it meanwhile there is nothing to do but report it.
	if err := s.proc.start(); err != nil {
		return err
	}
	if err := s.waitReady(); err != nil {
		s.proc.kill()
		return fmt.Errorf("redistest: restarting %s: %w\n%s", s.proc.name, err, s.proc.logTail(30))
	}
	return nil
}

// Pause suspends the processing of every client's commands for d with
// CLIENT PAUSE ALL, a server that stops answering without dropping
// connections. It returns at once.
func (s *Server) Pause(d time.Duration) {
	s.t.Helper()
	s.Cmd("CLIENT", "PAUSE", max(d.Milliseconds(), 1), "ALL")
}

// Freeze stops the server process with SIGSTOP: the kernel still accepts
// connections and takes in what clients send, but nothing is answered, as
// with a server that hangs or a host that is gone without a reset. Thaw
// resumes it; the test's cleanup thaws it too (a stopped process cannot be
// shut down).
func (s *Server) Freeze() {
	s.t.Helper()
	if err := s.proc.signal(stopSignal); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { s.proc.signal(contSignal) })
}

// Thaw resumes a server stopped by Freeze with SIGCONT.
func (s *Server) Thaw() {
	s.t.Helper()
	if err := s.proc.signal(contSignal); err != nil {
		s.t.Fatal(err)
	}
}

// Sleep blocks the server for d with DEBUG SLEEP, as a long command or a
// slow disk would: it answers nothing meanwhile. The sleep runs on a
// connection of its own; Sleep returns once the server is seen blocked (a
// PING on another connection goes unanswered), with a channel closed when
// the sleep has ended.
func (s *Server) Sleep(d time.Duration) <-chan struct{} {
	s.t.Helper()
	long := s.dialer
	long.Timeout = d + 5*time.Second
	c, err := long.Dial(s.Addr())
	if err != nil {
		s.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer c.Close()
		c.Do("DEBUG", "SLEEP", strconv.FormatFloat(d.Seconds(), 'f', -1, 64))
	}()
	probe := s.dialer
	probe.Timeout = 20 * time.Millisecond
	deadline := time.Now().Add(min(d, 5*time.Second))
	for time.Now().Before(deadline) {
		if _, err := probe.do(s.Addr(), "PING"); err != nil {
			return done // blocked
		}
		time.Sleep(time.Millisecond)
	}
	return done
}

// WaitFor polls cond until it holds, and fails t if it does not within
// 10 seconds: for a test waiting on what a server, or a client of it,
// does in its own time (a connection found silent, a breaker opened).
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// UsedCPU returns the CPU seconds the server has used, user and system
// (INFO cpu): what a benchmark divides by its operations to learn Redis's
// CPU per operation, which other load on the machine does not inflate as
// it does wall time.
func (c *Conn) UsedCPU() (float64, error) {
	v, err := c.Do("INFO", "cpu")
	if err != nil {
		return 0, err
	}
	info, ok := v.(string)
	if !ok {
		return 0, fmt.Errorf("redistest: INFO cpu replied %T", v)
	}
	var sum float64
	for _, line := range strings.Split(info, "\r\n") {
		name, val, _ := strings.Cut(line, ":")
		if name == "used_cpu_user" || name == "used_cpu_sys" {
			f, err := strconv.ParseFloat(val, 64)
			if err != nil {
				return 0, fmt.Errorf("redistest: INFO cpu: %s: %w", line, err)
			}
			sum += f
		}
	}
	return sum, nil
}

// Time is the server's clock, as TIME answers it: the clock the stores
// decide by, which a test cannot set.
func (s *Server) Time() (time.Time, error) {
	v, err := s.Do("TIME")
	if err != nil {
		return time.Time{}, err
	}
	parts, ok := v.([]any)
	if !ok || len(parts) != 2 {
		return time.Time{}, fmt.Errorf("TIME answered %v", v)
	}
	sec, err1 := strconv.ParseInt(fmt.Sprint(parts[0]), 10, 64)
	usec, err2 := strconv.ParseInt(fmt.Sprint(parts[1]), 10, 64)
	if err1 != nil || err2 != nil {
		return time.Time{}, fmt.Errorf("TIME answered %v", v)
	}
	return time.Unix(sec, usec*1000), nil
}
