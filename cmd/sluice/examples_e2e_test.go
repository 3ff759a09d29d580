package main

import (
	"bufio"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The examples' binaries, built once each on first use.
var exampleBuilds sync.Map // name -> func() (string, error)

// exampleBinary builds examples/name (with -race when the tests have it).
func exampleBinary(t *testing.T, name string) string {
	t.Helper()
	sluiceBinary(t) // the same skip in -short, and the build directory
	build, _ := exampleBuilds.LoadOrStore(name, sync.OnceValues(func() (string, error) {
		path := filepath.Join(e2eBuild.dir, name)
		args := []string{"build", "-o", path}
		if raceEnabled() {
			args = append(args, "-race")
		}
		out, err := exec.Command("go", append(args, "../../examples/"+name)...).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("go build examples/%s: %v\n%s", name, err, out)
		}
		return path, nil
	}))
	path, err := build.(func() (string, error))()
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// example is a running example program, its output (stdout and stderr)
// kept line by line.
type example struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  []string
	done chan struct{}
}

// startExample runs examples/name with args until the test ends.
func startExample(t *testing.T, name string, args ...string) *example {
	t.Helper()
	e := &example{cmd: exec.Command(exampleBinary(t, name), args...), done: make(chan struct{})}
	e.cmd.Env = []string{"GORACE=halt_on_error=1"}
	r, w := io.Pipe()
	e.cmd.Stdout, e.cmd.Stderr = w, w
	if err := e.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			e.mu.Lock()
			e.out = append(e.out, sc.Text())
			e.mu.Unlock()
		}
	}()
	go func() {
		e.cmd.Wait()
		w.Close()
		<-scanned
		close(e.done)
	}()
	t.Cleanup(func() {
		e.cmd.Process.Kill()
		<-e.done
	})
	return e
}

func (e *example) output() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return strings.Join(e.out, "\n")
}

// waitLine waits for a line of output that contains want, and returns it.
func (e *example) waitLine(t *testing.T, want string) string {
	t.Helper()
	var found string
	poll(t, fmt.Sprintf("a line with %q", want), func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, l := range e.out {
			if strings.Contains(l, want) {
				found = l
				return true
			}
		}
		return false
	})
	return found
}

// TestExampleXDSRules: examples/xds-rules serves a rules file over xDS to
// a real sluice serve --config-xds: its limit is in force over the HTTP
// JSON API, a change of the file is served as a new version and changes
// the answer, and a file that does not parse leaves the version in force.
func TestExampleXDSRules(t *testing.T) {
	beside(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	rule := func(n int) string {
		return fmt.Sprintf("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: %d}\n", n)
	}
	writeRules(t, file, rule(2))
	x := startExample(t, "xds-rules", "-rules", file, "-addr", "127.0.0.1:0", "-poll", "50ms")
	addr := strings.TrimSpace(strings.SplitAfter(x.waitLine(t, "listening on "), "listening on ")[1])
	x.waitLine(t, "serving version 1: domain api (1 descriptors)")

	p := startSluice(t, nil, "--config-xds", addr)
	poll(t, "the rules from xds-rules", func() bool {
		code, _, _ := p.http("GET", "/readyz", "")
		return code == 200
	})
	x.waitLine(t, "uses version 1")
	const body = `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"ann"}]}]}`
	for i, want := range []string{`"overallCode":"OK"`, `"overallCode":"OK"`, `"overallCode":"OVER_LIMIT"`} {
		if _, resp, _ := p.http("POST", "/json", body); !strings.Contains(resp, want) {
			t.Fatalf("request %d: %s, want %s", i+1, resp, want)
		}
	}

	writeRules(t, file, rule(1000))
	x.waitLine(t, "serving version 2")
	poll(t, "the limit of version 2 in force", func() bool {
		_, resp, _ := p.http("POST", "/json", body)
		return strings.Contains(resp, `"overallCode":"OK"`) && strings.Contains(resp, `"requestsPerUnit":1000`)
	})

	writeRules(t, file, "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	if l := x.waitLine(t, "(still serving version 2)"); !strings.Contains(l, "FORTNIGHT") {
		t.Errorf("the refusal of the file does not name the unit: %s", l)
	}
	if _, resp, _ := p.http("POST", "/json", body); !strings.Contains(resp, `"requestsPerUnit":1000`) {
		t.Errorf("after a file that does not parse: %s, want version 2's limit", resp)
	}
}

// TestExampleRLQSClient: examples/rlqs-client, against a real sluice
// serve, reports usage of four buckets and prints the assignments of the
// rules: a token bucket of the limit (the only Envoy wants it all), deny
// all for a limit of zero, allow all for an unlimited rule, and abandoned
// for a bucket no rule matches.
func TestExampleRLQSClient(t *testing.T) {
	beside(t)
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, file, `domain: edge
descriptors:
  - key: tenant
    value: acme
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: tenant
    value: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: tenant
    value: free
    rate_limit: {unlimited: true}
`)
	p := startSluice(t, nil, "--config", file, "--rlqs-ttl", "7s")
	c := startExample(t, "rlqs-client", "-addr", p.grpcAddr, "-domain", "edge",
		"-bucket", "tenant=acme", "-bucket", "tenant=blocked", "-bucket", "tenant=free", "-bucket", "tenant=nobody",
		"-reports", "2", "-interval", "100ms", "-allowed", "5", "-denied", "2", "-wait", e2eWait.String())
	select {
	case <-c.done:
	case <-time.After(e2eWait):
		t.Fatalf("rlqs-client still running after %s:\n%s", e2eWait, c.output())
	}
	if code := c.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("rlqs-client: exit %d:\n%s", code, c.output())
	}
	answer := `bucket tenant=acme: token bucket of 60 tokens, 60 added every 1m0s, for 7s
bucket tenant=blocked: deny all, for 7s
bucket tenant=free: allow all, for 7s
bucket tenant=nobody: abandoned (matches no rule)`
	want := "report 1: 4 buckets, 5 allowed and 2 denied each\n" + answer + "\nreport 2: 4 buckets, 5 allowed and 2 denied each\n" + answer
	if got := c.output(); got != want {
		t.Errorf("rlqs-client printed:\n%s\nwant:\n%s", got, want)
	}
}
