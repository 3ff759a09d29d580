package main

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// runReady runs sluice ready with args and returns its exit status and
// what it printed.
func runReady(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(sluiceBinary(t), append([]string{"ready"}, args...)...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, out.String(), errb.String()
}

// stranger is a plain HTTP server on a loopback port, not sluice, that
// records what it is asked.
type stranger struct {
	addr string
	mu   sync.Mutex
	reqs []string // "METHOD /path"
}

func startStranger(t *testing.T) *stranger {
	t.Helper()
	s := &stranger{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.reqs = append(s.reqs, r.Method+" "+r.URL.Path)
		s.mu.Unlock()
		fmt.Fprintln(w, "OK") // what any /readyz says
	}))
	t.Cleanup(srv.Close)
	s.addr = srv.Listener.Addr().String()
	return s
}

func (s *stranger) asked() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.reqs...)
}

// readyRules writes a small rules file.
func readyRules(t *testing.T) string {
	t.Helper()
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, dayRule("d", "k", 10))
	return rules
}

// TestReadyE2E: sluice ready returns once the serve it names answers,
// says how to stop it, and that serve's pid is what it printed.
func TestReadyE2E(t *testing.T) {
	beside(t)
	addr := "127.0.0.1:" + freePort(t)
	p := launch(t, nil, "--config", readyRules(t), "--http-addr", addr)
	pid := p.cmd.Process.Pid
	code, out, errs := runReady(t, nil, "--addr", addr, strconv.Itoa(pid))
	if code != 0 {
		t.Fatalf("sluice ready: exit %d\n%s%s", code, out, errs)
	}
	if want := fmt.Sprintf("pid %d is ready on %s; stop it with: kill %d\n", pid, addr, pid); out != want {
		t.Errorf("printed %q, want %q", out, want)
	}
	// --addr defaults to serve's --http-addr as the environment sets it.
	if code, out, errs := runReady(t, []string{"SLUICE_HTTP_ADDR=" + addr}, strconv.Itoa(pid)); code != 0 || !strings.Contains(out, addr) {
		t.Errorf("with SLUICE_HTTP_ADDR: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := runReady(t, []string{"PORT=" + addr[strings.LastIndex(addr, ":")+1:]}, strconv.Itoa(pid)); code != 0 || !strings.Contains(out, addr) {
		t.Errorf("with PORT: exit %d\n%s%s", code, out, errs)
	}
}

// TestReadyE2EPortTaken: a serve started on a port another server holds
// exits, and sluice ready says the port is taken instead of taking the
// other server's answer for its own; it asks that server nothing but
// /readyz.
func TestReadyE2EPortTaken(t *testing.T) {
	beside(t)
	s := startStranger(t)
	p := launch(t, nil, "--config", readyRules(t), "--http-addr", s.addr)
	code, out, errs := runReady(t, nil, "--addr", s.addr, strconv.Itoa(p.cmd.Process.Pid))
	want := fmt.Sprintf(`%s is answered by another server (/readyz answers 200 "OK"), not by pid %d: the port is taken`, s.addr, p.cmd.Process.Pid)
	if code != 1 || out != "" || !strings.Contains(errs, want) {
		t.Errorf("exit %d, stdout %q, stderr %q; want 1 and %q", code, out, errs, want)
	}
	for _, r := range s.asked() {
		if r != "GET /readyz" {
			t.Errorf("the other server was asked %q", r)
		}
	}
	// Another sluice on the port is named by its pid.
	other := startSluice(t, nil, "--config", readyRules(t))
	p = launch(t, nil, "--config", readyRules(t), "--http-addr", other.httpAddr)
	code, _, errs = runReady(t, nil, "--addr", other.httpAddr, strconv.Itoa(p.cmd.Process.Pid))
	if want := fmt.Sprintf("answered by another sluice (pid %d), not by pid %d: the port is taken", other.cmd.Process.Pid, p.cmd.Process.Pid); code != 1 || !strings.Contains(errs, want) {
		t.Errorf("exit %d, stderr %q; want 1 and %q", code, errs, want)
	}
}

// TestReadyE2EExited: a serve that exits (here its gRPC port is taken,
// by a listener that answers nothing) fails the wait at once, whatever
// the timeout, and an exited child not yet reaped counts as exited.
func TestReadyE2EExited(t *testing.T) {
	beside(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := "127.0.0.1:" + freePort(t)
	p := launch(t, nil, "--config", readyRules(t), "--http-addr", addr, "--grpc-addr", ln.Addr().String())
	code, _, errs := runReady(t, nil, "--addr", addr, "--timeout", "1h", strconv.Itoa(p.cmd.Process.Pid))
	if want := fmt.Sprintf("pid %d exited before it was ready", p.cmd.Process.Pid); code != 1 || !strings.Contains(errs, want) {
		t.Errorf("exit %d, stderr %q; want 1 and %q", code, errs, want)
	}
	<-p.done
	if !strings.Contains(p.log(), "address already in use") {
		t.Errorf("serve's log does not say why:\n%s", p.log())
	}

	// A zombie: exited, its parent (this test) not waiting for it yet.
	z := exec.Command("true")
	if err := z.Start(); err != nil {
		t.Fatal(err)
	}
	defer z.Wait()
	code, _, errs = runReady(t, nil, "--addr", addr, "--timeout", "1h", strconv.Itoa(z.Process.Pid))
	if code != 1 || !strings.Contains(errs, "exited before it was ready") {
		t.Errorf("an exited child: exit %d, stderr %q", code, errs)
	}
}

// TestReadyE2ELog: for a program that is not sluice, ready is a line of
// its log; one that exits first fails the wait, with its log's end.
func TestReadyE2ELog(t *testing.T) {
	beside(t)
	sluiceBinary(t) // built before the programs start, not while they run
	dir := t.TempDir()
	start := func(script string) (*exec.Cmd, string) {
		log := filepath.Join(dir, strconv.Itoa(len(script))+".log")
		cmd := exec.Command("sh", "-c", "exec 2>"+log+"; "+script)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		t.Cleanup(func() { cmd.Process.Kill(); <-done })
		return cmd, log
	}
	cmd, log := start("sleep 0.3; echo 'N listening on AF=2 0.0.0.0:8125' >&2; exec sleep 600")
	code, out, errs := runReady(t, nil, "--log", log, "--line", "listening on", strconv.Itoa(cmd.Process.Pid))
	if want := fmt.Sprintf("pid %d is ready (\"listening on\" in %s); stop it with: kill %d\n", cmd.Process.Pid, log, cmd.Process.Pid); code != 0 || out != want {
		t.Errorf("exit %d, stdout %q, stderr %q; want 0 and %q", code, out, errs, want)
	}
	cmd, log = start("echo 'E bind(5, {AF=2 0.0.0.0:8125}, 16): Address already in use' >&2; exit 1")
	code, _, errs = runReady(t, nil, "--log", log, "--line", "listening on", "--timeout", "1h", strconv.Itoa(cmd.Process.Pid))
	if code != 1 || !strings.Contains(errs, "exited before it was ready") || !strings.Contains(errs, "Address already in use") {
		t.Errorf("exit %d, stderr %q; want 1, exited, and the log's end", code, errs)
	}
}

// TestReadyE2ETimeout: a process that neither answers nor exits fails
// the wait after --timeout, saying what it saw last.
func TestReadyE2ETimeout(t *testing.T) {
	beside(t)
	sluiceBinary(t) // built before sleep starts, not while it runs
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	addr := "127.0.0.1:" + freePort(t)
	code, _, errs := runReady(t, nil, "--addr", addr, "--timeout", "300ms", strconv.Itoa(cmd.Process.Pid))
	if want := fmt.Sprintf("not ready on %s within 300ms: nothing listens on %s", addr, addr); code != 1 || !strings.Contains(errs, want) {
		t.Errorf("exit %d, stderr %q; want 1 and %q", code, errs, want)
	}
}

// TestReadyUsage: a usage error exits 2 and says what is wrong.
func TestReadyUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "want one PID"},
		{[]string{"1", "2"}, "want one PID"},
		{[]string{"x"}, `PID "x" is not a process ID`},
		{[]string{"0"}, `PID "0" is not a process ID`},
		{[]string{"--log", "f", "1"}, "--log and --line go together"},
		{[]string{"--timeout", "0s", "1"}, "--timeout must be positive"},
	} {
		var out, errs bytes.Buffer
		if code := run(t.Context(), append([]string{"ready"}, tc.args...), nil, &out, &errs); code != 2 || !regexp.MustCompile(regexp.QuoteMeta(tc.want)).MatchString(errs.String()) {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", tc.args, code, errs.String(), tc.want)
		}
	}
}

// TestReadyDialAddr: a listening address is asked on the loopback.
func TestReadyDialAddr(t *testing.T) {
	for in, want := range map[string]string{
		":8080": "127.0.0.1:8080", "0.0.0.0:8080": "127.0.0.1:8080", "[::]:8080": "[::1]:8080",
		"10.0.0.1:9090": "10.0.0.1:9090", "localhost:1": "localhost:1",
	} {
		if got := dialAddr(in); got != want {
			t.Errorf("dialAddr(%q) = %q, want %q", in, got, want)
		}
	}
}

// The pid header comes with /readyz only.
func TestWithPid(t *testing.T) {
	h := withPid(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for path, want := range map[string]string{"/readyz": strconv.Itoa(os.Getpid()), "/json": "", "/healthz": ""} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if got := rec.Header().Get(pidHeader); got != want {
			t.Errorf("%s: %s %q, want %q", path, pidHeader, got, want)
		}
	}
}
