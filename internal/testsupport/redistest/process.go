package redistest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Time bounds. Every wait in the package has one of these deadlines.
const (
	startTimeout = 10 * time.Second // until a started server answers PING
	stopTimeout  = 3 * time.Second  // SHUTDOWN NOSAVE before SIGKILL
	killTimeout  = 5 * time.Second  // SIGKILL until the process is reaped
	pollInterval = 20 * time.Millisecond
)

// Ports are drawn from [portMin, portMax): below Linux's ephemeral range
// (32768 and up) so that outgoing connections never take them, and low
// enough that the Cluster bus port, port+10000, is below it too.
const (
	portMin = 10000
	portMax = 22768
)

var ports struct {
	sync.Mutex
	given map[int]bool
}

// freePort returns a loopback port that is free, and whose cluster bus port
// (port+10000) is free too, and that this process has not handed out
// before. Another process may still take it before the server binds it;
// starters retry on "Address already in use".
func freePort() (int, error) {
	ports.Lock()
	defer ports.Unlock()
	if ports.given == nil {
		ports.given = make(map[int]bool)
	}
	for range 1000 {
		p := portMin + rand.IntN(portMax-portMin)
		if ports.given[p] || !portFree(p) || !portFree(p+10000) {
			continue
		}
		ports.given[p] = true
		return p, nil
	}
	return 0, errors.New("redistest: no free loopback port found")
}

func portFree(p int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// process is one redis-server or redis-sentinel, started and restarted with
// the same arguments, in its own process group, logging into logPath.
type process struct {
	name    string
	bin     string
	args    []string
	dir     string
	logPath string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has been reaped
}

func (p *process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !isClosed(p.exited) {
		return fmt.Errorf("redistest: %s is already running", p.name)
	}
	// Redis writes its log here too (logfile), in append mode; the startup
	// errors it prints before opening its log land here as well.
	out, err := os.OpenFile(p.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "--- redistest: starting %s %s\n", p.bin, strings.Join(p.args, " "))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Dir = p.dir
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		out.Close()
		return err
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		out.Close()
		close(exited)
	}()
	p.cmd, p.exited = cmd, exited
	return nil
}

// running reports whether the process was started and has not exited.
func (p *process) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil && !isClosed(p.exited)
}

// done returns a channel closed when the current process has exited; nil
// (blocking forever) if it was never started.
func (p *process) done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// kill sends SIGKILL to the process group and waits until it is reaped.
func (p *process) kill() error {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil || isClosed(exited) {
		return nil
	}
	killGroup(cmd)
	select {
	case <-exited:
		return nil
	case <-time.After(killTimeout):
		return fmt.Errorf("redistest: %s (pid %d) still running %v after SIGKILL", p.name, cmd.Process.Pid, killTimeout)
	}
}

// stop asks the server to exit with shutdown (a command sent by the
// caller, such as SHUTDOWN NOSAVE), then kills it if it has not exited
// within stopTimeout.
func (p *process) stop(shutdown func()) error {
	if !p.running() {
		return nil
	}
	done := p.done()
	if shutdown != nil {
		shutdown()
	}
	select {
	case <-done:
		return nil
	case <-time.After(stopTimeout):
		return p.kill()
	}
}

// logTail returns the last n lines of the log.
func (p *process) logTail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

func (p *process) logContains(s string) bool {
	b, _ := os.ReadFile(p.logPath)
	return bytes.Contains(b, []byte(s))
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// waitUntil polls ready until it returns nil, the deadline passes, or exited
// is closed (the server died: no point waiting).
func waitUntil(timeout time.Duration, exited <-chan struct{}, ready func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %w", timeout, err)
		}
		select {
		case <-exited:
			return fmt.Errorf("exited while waiting: %w", err)
		case <-time.After(pollInterval):
		}
	}
}

// writeConfig writes a Redis configuration file, one directive a line.
func writeConfig(path string, lines [][]string) error {
	var b strings.Builder
	for _, l := range lines {
		for i, tok := range l {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(quoteConfig(tok))
		}
		b.WriteByte('\n')
	}
	return os.WriteFile(path, []byte(b.String()), 0o600)
}

// quoteConfig quotes a token for redis.conf when it needs it.
func quoteConfig(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\r\n\"'\\") {
		return s
	}
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`, "\r", `\r`, "\t", `\t`)
	return `"` + r.Replace(s) + `"`
}

// binary finds a Redis program on PATH.
func binary(name string) (string, error) {
	path, err := exec.LookPath(name)
	if err != nil {
		return "", err
	}
	return filepath.Abs(path)
}

// signal sends sig to the process, if it is running.
func (p *process) signal(sig os.Signal) error {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil || isClosed(exited) {
		return nil
	}
	return cmd.Process.Signal(sig)
}
