package main

// sluice ready: the wait that follows a server started in the background
// (sluice serve ... &), which must tell its own process from another one
// holding the port, and a process that has exited from one still
// starting.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func init() {
	commands["ready"] = command{
		summary: "wait until a server started in the background is ready",
		run: func(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
			return cmdReady(ctx, args, os.LookupEnv, stdout, stderr)
		},
		help: func(env lookupEnv) *help { h, _ := readyHelp(env); return h },
	}
}

// pidHeader carries, in the answers to GET /readyz of sluice serve,
// sluice proxy and sluice nullapi, the process ID of the one answering,
// so that sluice ready can tell it from another process on the port.
const pidHeader = "Sluice-Pid"

// withPid adds pidHeader to the answers to /readyz of h.
func withPid(h http.Handler) http.Handler {
	pid := []string{strconv.Itoa(os.Getpid())}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			w.Header()[pidHeader] = pid
		}
		h.ServeHTTP(w, r)
	})
}

// readyFlags are the settings of sluice ready.
type readyFlags struct {
	addr     string
	log      string
	line     string
	timeout  time.Duration
	interval time.Duration // between two looks; not a flag
}

// readyEnv: --addr defaults to the HTTP address sluice serve listens on
// in the same environment.
var readyEnv = envReading{
	brief: "--addr defaults to SLUICE_HTTP_ADDR, or envoyproxy/ratelimit's HOST and PORT, as sluice serve's --http-addr.",
	note:  "--addr defaults to the address sluice serve's --http-addr takes from the environment: SLUICE_HTTP_ADDR, else envoyproxy/ratelimit's HOST and PORT; no other flag reads the environment.",
	vars:  map[string]string{"addr": envName("http-addr")},
	envoy: map[string]envoyVar{"addr": envoyVars["http-addr"]},
}

// readyHelp builds the flags of sluice ready, --addr's default from env.
func readyHelp(env lookupEnv) (*help, *readyFlags) {
	f := &readyFlags{interval: 100 * time.Millisecond}
	h := newHelp("ready", "ready [--addr ADDR | --log FILE --line TEXT] [--timeout D] PID",
		`Waits until the process PID, started in the background (in a shell: the
command with & at its end, then PID is $!), is ready, then prints how to
stop it. sluice serve, sluice proxy and sluice nullapi are ready when
their own process answers GET /readyz on --addr with 200: each names its
process ID in the answer. Another program is ready when a line of its
log, --log, holds --line.

It fails at once, rather than wait, when PID exits before it is ready (a
port it needs is taken, a flag is wrong: its log says which), and when
another process answers on --addr: the port is taken, and whatever
comes next would talk to a stranger. Exits 0 when ready, 1 when not.`)
	h.more = `In a shell, "sluice serve --config rules.yaml &" starts a server in the
background and "sluice ready $!" waits for it. For sluice proxy, --addr
is its --admin-listen (127.0.0.1:9090 by default); for sluice nullapi,
its --listen. A program that is not sluice logs to the file of --log
(for socat, "socat -d -d ... 2>socat.log &", ready at "listening on").`
	h.env = readyEnv
	def := "127.0.0.1:8080"
	if v, ok := env(readyEnv.vars["addr"]); ok {
		def = v
	} else if v, ok := envoyVars["http-addr"].value(env); ok {
		def = v
	}
	h.fs.StringVar(&f.addr, "addr", def, "`host:port` whose GET /readyz the process answers: sluice serve's --http-addr, sluice proxy's --admin-listen, sluice nullapi's --listen; an empty host is the loopback")
	h.fs.StringVar(&f.log, "log", "", "`file` the process logs to, for a program that is not sluice: ready when a line of it holds --line")
	h.fs.StringVar(&f.line, "line", "", "`text` of the line of --log that says the program is ready (for socat -d -d, \"listening on\")")
	h.fs.DurationVar(&f.timeout, "timeout", 2*time.Minute, "how long to wait for a process that neither gets ready nor exits")
	return h, f
}

func cmdReady(ctx context.Context, args []string, env lookupEnv, stdout, stderr io.Writer) error {
	h, f := readyHelp(env)
	if err := h.parse(args, true, stderr); err != nil {
		return err
	}
	fail := func(msg string) error {
		fmt.Fprintf(stderr, "sluice ready: %s\n", msg)
		usageHint(h.fs)
		return errUsage
	}
	var pid int
	switch {
	case h.fs.NArg() != 1:
		return fail("want one PID (of a process started in the background: $! in a shell)")
	case (f.log == "") != (f.line == ""):
		return fail("--log and --line go together")
	case f.timeout <= 0:
		return fail("--timeout must be positive")
	default:
		var err error
		if pid, err = strconv.Atoi(h.fs.Arg(0)); err != nil || pid <= 0 {
			return fail(fmt.Sprintf("PID %q is not a process ID", h.fs.Arg(0)))
		}
	}
	look := func() (bool, error) { return f.lookHTTP(ctx, pid) }
	what := "on " + dialAddr(f.addr)
	if f.log != "" {
		look = func() (bool, error) { return f.lookLog() }
		what = fmt.Sprintf("(%q in %s)", f.line, f.log)
	}
	deadline := time.Now().Add(f.timeout)
	for {
		ready, err := look()
		if ready {
			fmt.Fprintf(stdout, "pid %d is ready %s; stop it with: kill %d\n", pid, what, pid)
			return nil
		}
		var taken *portTakenError
		if errors.As(err, &taken) {
			return err
		}
		if !processAlive(pid) {
			return f.exited(pid, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pid %d not ready %s within %v: %v", pid, what, f.timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(f.interval):
		}
	}
}

// portTakenError is another process answering on --addr.
type portTakenError struct {
	addr, who string
	pid       int
}

func (e *portTakenError) Error() string {
	return fmt.Sprintf("%s is answered by %s, not by pid %d: the port is taken. Stop what listens there, or start pid %d's command on another address",
		e.addr, e.who, e.pid, e.pid)
}

// lookHTTP asks --addr for /readyz once: ready when PID answers 200, a
// portTakenError when another process answers.
func (f *readyFlags) lookHTTP(ctx context.Context, pid int) (bool, error) {
	addr := dialAddr(f.addr)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
	if err != nil {
		return false, err
	}
	// No proxy from the environment, no connection kept: each look is
	// a new connection to whoever listens now.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return false, fmt.Errorf("nothing listens on %s", addr)
		}
		return false, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	first, _, _ := strings.Cut(strings.TrimSpace(string(body)), "\n")
	got := resp.Header.Get(pidHeader)
	switch {
	case got == strconv.Itoa(pid) && resp.StatusCode == http.StatusOK:
		return true, nil
	case got == strconv.Itoa(pid):
		return false, fmt.Errorf("/readyz answers %d: %s", resp.StatusCode, first)
	case got != "":
		return false, &portTakenError{addr: addr, pid: pid, who: "another sluice (pid " + got + ")"}
	}
	return false, &portTakenError{addr: addr, pid: pid, who: fmt.Sprintf("another server (/readyz answers %d %q)", resp.StatusCode, first)}
}

// lookLog reads --log once: ready when a line holds --line.
func (f *readyFlags) lookLog() (bool, error) {
	b, err := os.ReadFile(f.log)
	if err != nil {
		return false, err
	}
	for line := range bytes.Lines(b) {
		if bytes.Contains(line, []byte(f.line)) {
			return true, nil
		}
	}
	return false, fmt.Errorf("no line of %s holds %q yet", f.log, f.line)
}

// exited is the error for a process that exited before it was ready,
// with the end of its log when there is one.
func (f *readyFlags) exited(pid int, last error) error {
	msg := fmt.Sprintf("pid %d exited before it was ready (a port it needs taken? its log says why)", pid)
	if f.log == "" {
		return fmt.Errorf("%s; last look: %v", msg, last)
	}
	b, _ := os.ReadFile(f.log)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return fmt.Errorf("%s; the end of %s:\n%s", msg, f.log, strings.Join(lines[max(0, len(lines)-5):], "\n"))
}

// dialAddr is the address to ask for a listening address: an empty or
// unspecified host is the loopback.
func dialAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return net.JoinHostPort(host, port)
}

// processAlive reports whether the process pid runs: it exists and is not
// a zombie (exited, not yet reaped by its parent).
func processAlive(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	defer p.Release()
	if err := p.Signal(syscall.Signal(0)); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	return !zombie(pid)
}
