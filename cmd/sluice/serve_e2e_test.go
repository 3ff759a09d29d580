package main

// End-to-end tests of sluice serve: the real binary, built once, started as
// a subprocess on loopback ports it picks itself (127.0.0.1:0, read back
// from its JSON log), driven by a real gRPC client and real HTTP. Every wait
// polls with a deadline.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/edges/rlqs"
)

// e2eWait bounds every wait of the end-to-end tests.
const e2eWait = 15 * time.Second

var e2eBuild struct {
	dir  string // removed by TestMain
	once sync.Once
	path string
	err  error
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sluice-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	e2eBuild.dir = dir
	// The tests that spend their time waiting run side by side after the
	// others (beside_test.go), -parallel of them at once, 6 unless given.
	flag.Parse()
	n := 6
	flag.Visit(func(f *flag.Flag) {
		if f.Name == "test.parallel" {
			n, _ = strconv.Atoi(f.Value.String())
		}
	})
	places = make(chan struct{}, max(n, 1))
	flag.Set("test.parallel", "1000")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// raceEnabled reports whether the tests run with -race; the binary under
// test is then built with it too, so that the service itself is checked.
func raceEnabled() bool {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "-race" {
				return s.Value == "true"
			}
		}
	}
	return false
}

// sluiceBinary builds the command once, on first use.
func sluiceBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end: builds and runs the binary")
	}
	e2eBuild.once.Do(func() {
		path := filepath.Join(e2eBuild.dir, "sluice")
		// -buildvcs=auto: the revision is embedded (sluice version shows
		// it) even where GOFLAGS turns it off.
		args := []string{"build", "-buildvcs=auto", "-o", path}
		if raceEnabled() {
			args = append(args, "-race")
		}
		out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
		if err != nil {
			e2eBuild.err = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		e2eBuild.path = path
	})
	if e2eBuild.err != nil {
		t.Fatal(e2eBuild.err)
	}
	return e2eBuild.path
}

// proc is a running sluice serve.
type proc struct {
	t                       *testing.T
	cmd                     *exec.Cmd
	grpcAddr, httpAddr, dbg string
	addrs                   map[string]string // every listener's address, by name

	mu    sync.Mutex
	lines []string
	ready chan struct{}
	done  chan struct{} // closed when the process has exited
	code  int

	conn *grpc.ClientConn
}

// startSluice starts sluice serve with args and extra environment
// variables, on loopback ports unless args or env name them, and waits
// until it is ready.
func startSluice(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := launch(t, env, args...)
	p.connect()
	return p
}

// connect waits until the process launched is ready and opens a gRPC
// connection to it.
func (p *proc) connect() {
	p.t.Helper()
	p.waitReady()
	if p.grpcAddr == "" || p.httpAddr == "" {
		p.t.Fatalf("no listening addresses in the log:\n%s", p.log())
	}
	conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		p.t.Fatal(err)
	}
	p.conn = conn
	p.t.Cleanup(func() { conn.Close() })
}

// waitReady waits until the process has logged "ready", or that it
// listens but is "not ready yet" (rules from xDS still to come).
func (p *proc) waitReady() {
	p.t.Helper()
	select {
	case <-p.ready:
	case <-p.done:
		p.t.Fatalf("sluice exited with %d before ready:\n%s", p.code, p.log())
	case <-time.After(e2eWait):
		p.t.Fatalf("sluice not ready within %s:\n%s", e2eWait, p.log())
	}
}

// launch starts sluice serve without waiting for it.
func launch(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return launchCommand(t, "serve", []string{"grpc-addr", "http-addr", "debug-addr"}, env, args...)
}

// launchCommand starts sluice command with JSON logs, its address flags
// addrFlags on loopback ports unless args or env name them, without
// waiting for it.
func launchCommand(t *testing.T, command string, addrFlags, env []string, args ...string) *proc {
	t.Helper()
	bin := sluiceBinary(t)
	all := []string{command, "--log-format", "json"}
	has := func(name string) bool {
		for _, a := range args {
			if a == "--"+name || strings.HasPrefix(a, "--"+name+"=") {
				return true
			}
		}
		vars := append([]string{envName(name)}, envoyVars[name].names...)
		for _, e := range env {
			for _, v := range vars {
				if strings.HasPrefix(e, v+"=") {
					return true
				}
			}
		}
		return false
	}
	for _, name := range addrFlags {
		if !has(name) {
			all = append(all, "--"+name, "127.0.0.1:0")
		}
	}
	cmd := exec.Command(bin, append(all, args...)...)
	// A clean environment: no SLUICE_ or Envoy variables of the caller.
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "GORACE=halt_on_error=1 atexit_sleep_ms=50"}, env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, ready: make(chan struct{}), done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go p.read(stderr)
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			cmd.Process.Kill()
			<-p.done
		}
		switch log := p.log(); {
		case strings.Contains(log, "DATA RACE"):
			t.Errorf("a data race in sluice %s:\n%s", command, log)
		case t.Failed():
			t.Logf("sluice %s log:\n%s", command, log)
		}
	})
	return p
}

// read collects the log lines, notes the addresses and readiness, and
// reaps the process at the end of its output.
func (p *proc) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	readyClosed := false
	for sc.Scan() {
		line := sc.Text()
		var rec struct{ Msg, Listener, Addr string }
		json.Unmarshal([]byte(line), &rec)
		p.mu.Lock()
		p.lines = append(p.lines, line)
		if rec.Msg == "listening" {
			if p.addrs == nil {
				p.addrs = map[string]string{}
			}
			p.addrs[rec.Listener] = rec.Addr
			switch rec.Listener {
			case "grpc":
				p.grpcAddr = rec.Addr
			case "http":
				p.httpAddr = rec.Addr
			case "debug":
				p.dbg = rec.Addr
			}
		}
		p.mu.Unlock()
		if (rec.Msg == "ready" || strings.HasPrefix(rec.Msg, "not ready yet")) && !readyClosed {
			close(p.ready)
			readyClosed = true
		}
	}
	err := p.cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		p.code = ee.ExitCode()
	default:
		p.code = -1
	}
	close(p.done)
}

// addr is the address the process logged for its listener name.
func (p *proc) addr(name string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addrs[name]
}

func (p *proc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// waitLog waits until a log line contains every one of want.
func (p *proc) waitLog(want ...string) string {
	p.t.Helper()
	deadline := time.Now().Add(e2eWait)
	for {
		p.mu.Lock()
		for _, line := range p.lines {
			all := true
			for _, w := range want {
				all = all && strings.Contains(line, w)
			}
			if all {
				p.mu.Unlock()
				return line
			}
		}
		p.mu.Unlock()
		if time.Now().After(deadline) {
			p.t.Fatalf("no log line with %q within %s", want, e2eWait)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stop sends sig and returns the exit status.
func (p *proc) stop(sig os.Signal) int {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatal(err)
	}
	return p.wait()
}

func (p *proc) wait() int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(e2eWait):
		p.t.Fatalf("sluice serve did not exit within %s", e2eWait)
		return -1
	}
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// peek makes d a check that consumes nothing (hits_addend 0).
func peek(d *ratelimitv3.RateLimitDescriptor) *ratelimitv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(0)
	return d
}

func (p *proc) rl(domain string, descs ...*ratelimitv3.RateLimitDescriptor) (*rlsv3.RateLimitResponse, error) {
	return p.rlReq(&rlsv3.RateLimitRequest{Domain: domain, Descriptors: descs})
}

func (p *proc) rlReq(req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	return rlsv3.NewRateLimitServiceClient(p.conn).ShouldRateLimit(ctx, req)
}

// must answers a request that must succeed.
func (p *proc) must(domain string, descs ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	p.t.Helper()
	resp, err := p.rl(domain, descs...)
	if err != nil {
		p.t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// codes spells a response as "OVERALL:desc1,desc2".
func codesOf(r *rlsv3.RateLimitResponse) string {
	var b strings.Builder
	b.WriteString(r.GetOverallCode().String())
	for i, s := range r.GetStatuses() {
		if i == 0 {
			b.WriteByte(':')
		} else {
			b.WriteByte(',')
		}
		b.WriteString(s.GetCode().String())
	}
	return b.String()
}

func (p *proc) http(method, path, body string) (int, string, http.Header) {
	p.t.Helper()
	return httpDo(p.t, method, "http://"+p.httpAddr+path, body)
}

func httpDo(t *testing.T, method, url, body string) (int, string, http.Header) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Header
}

// metric returns the value of the sample whose line starts with series
// (name and labels as exposed), or "" if there is none.
func (p *proc) metric(series string) string {
	p.t.Helper()
	code, body, _ := p.http("GET", "/metrics", "")
	if code != 200 {
		p.t.Fatalf("/metrics: %d", code)
	}
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			return strings.Fields(rest)[0]
		}
	}
	return ""
}

// metricSum adds up the series of the metric name whose labels include
// every one of labels (each `key="value"`), 0 when there are none: a
// metric summed over the labels left out.
func (p *proc) metricSum(name string, labels ...string) float64 {
	p.t.Helper()
	code, body, _ := p.http("GET", "/metrics", "")
	if code != 200 {
		p.t.Fatalf("/metrics: %d", code)
	}
	return sumSeries(p.t, body, name, labels...)
}

// sumSeries is metricSum over the exposition body.
func sumSeries(t *testing.T, body, name string, labels ...string) float64 {
	t.Helper()
	sum := 0.0
lines:
	for _, line := range strings.Split(body, "\n") {
		series, value, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		got, set, _ := strings.Cut(series, "{")
		if got != name {
			continue
		}
		have := strings.Split(strings.TrimSuffix(set, "}"), ",")
		for _, l := range labels {
			if !slices.Contains(have, l) {
				continue lines
			}
		}
		v, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err != nil {
			t.Fatalf("metric %s: %q", line, value)
		}
		sum += v
	}
	return sum
}

// poll waits until cond holds.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(e2eWait)
	for i := 0; !cond(); i++ {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, e2eWait)
		}
		time.Sleep(pollPause(i))
	}
}

// pollPause is the pause before the look after the i-th (from 0) of a
// wait that polls: 10 ms, doubling up to 100 ms. Its looks are often
// /metrics pages, which cost a -race sluice some 10 ms of CPU each: a
// wait of seconds that looked every 10 ms at a few processes would keep
// the machine's cores busy, slowing what it waits for, and the tests
// beside it.
func pollPause(i int) time.Duration {
	return min(10*time.Millisecond<<min(i, 4), 100*time.Millisecond)
}

func writeRules(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// dayRule is a rules file of domain limiting key to n a day.
func dayRule(domain, key string, n int) string {
	return fmt.Sprintf("domain: %s\ndescriptors:\n  - key: %s\n    rate_limit: {unit: day, requests_per_unit: %d}\n", domain, key, n)
}

// Windows of a day (and buckets refilled over a day) keep the counts of
// the tests away from window boundaries.
const e2eRules = `domain: e2e
descriptors:
  - key: user                      # plain Envoy: 2 a day per user
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: path
    value: "/api/*"                # wildcard: a counter per distinct path
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: host
    value: "*.example.com"         # a wildcard anywhere in the value
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: file
    value: "/files/*"
    share_threshold: true          # every matching value shares one counter
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: tier
    value: old
    rate_limit: {unit: day, requests_per_unit: 1, name: old_limit}
  - key: tier
    value: new
    rate_limit:
      unit: day
      requests_per_unit: 100
      replaces: [{name: old_limit}]
  - key: free
    rate_limit: {unlimited: true}
  - key: one
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: five
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: bucket
    rate_limit: {algorithm: token_bucket, unit: day, requests_per_unit: 2, burst: 3}
`

func TestServeE2E(t *testing.T) {
	beside(t)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	writeRules(t, rules, e2eRules)
	// All-or-nothing, sluice's own way, which the subtests below check
	// (envoy_count_e2e_test.go checks Envoy's, the default).
	p := startSluice(t, nil, "--config", rules, "--response-headers", "all", "--all-or-nothing")

	t.Run("limit", func(t *testing.T) {
		p.t = t
		for i, want := range []string{"OK:OK", "OK:OK", "OVER_LIMIT:OVER_LIMIT"} {
			r := p.must("e2e", desc("user", "alice"))
			if got := codesOf(r); got != want {
				t.Fatalf("request %d: %s, want %s", i+1, got, want)
			}
			st := r.Statuses[0]
			if st.CurrentLimit.GetRequestsPerUnit() != 2 || st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_DAY {
				t.Errorf("current_limit %v", st.CurrentLimit)
			}
			if want := uint32(max(1-i, 0)); st.LimitRemaining != want {
				t.Errorf("request %d: remaining %d, want %d", i+1, st.LimitRemaining, want)
			}
			if d := st.DurationUntilReset.AsDuration(); d <= 0 || d > 24*time.Hour {
				t.Errorf("duration_until_reset %s", d)
			}
		}
		// Another user has a counter of its own; an unknown key matches
		// nothing and is OK without a limit; so is an unknown domain.
		if got := codesOf(p.must("e2e", desc("user", "bob"))); got != "OK:OK" {
			t.Errorf("bob: %s", got)
		}
		r := p.must("e2e", desc("nobody", "x"))
		if codesOf(r) != "OK:OK" || r.Statuses[0].CurrentLimit != nil {
			t.Errorf("no rule: %v", r)
		}
		if got := codesOf(p.must("elsewhere", desc("user", "alice"))); got != "OK:OK" {
			t.Errorf("unknown domain: %s", got)
		}
	})

	t.Run("response headers", func(t *testing.T) {
		p.t = t
		p.must("e2e", desc("one", "hdr"))
		r := p.must("e2e", desc("one", "hdr"))
		h := map[string]string{}
		for _, hv := range r.ResponseHeadersToAdd {
			h[strings.ToLower(hv.Key)] = hv.Value
		}
		for _, name := range []string{"retry-after", "x-ratelimit-limit", "ratelimit-policy", "ratelimit"} {
			if h[name] == "" {
				t.Errorf("no %s header in %v", name, h)
			}
		}
	})

	t.Run("all or nothing", func(t *testing.T) {
		p.t = t
		if got := codesOf(p.must("e2e", desc("one", "aon"), desc("five", "aon"))); got != "OK:OK,OK" {
			t.Fatalf("first: %s", got)
		}
		if got := codesOf(p.must("e2e", desc("one", "aon"), desc("five", "aon"))); got != "OVER_LIMIT:OVER_LIMIT,OK" {
			t.Fatalf("second: %s", got)
		}
		// The denied request consumed nothing of five's quota.
		if rem := p.must("e2e", peek(desc("five", "aon"))).Statuses[0].LimitRemaining; rem != 4 {
			t.Errorf("five remaining %d after a denied request, want 4", rem)
		}
	})

	t.Run("wildcard", func(t *testing.T) {
		p.t = t
		for _, c := range []struct{ key, value, want string }{
			{"path", "/api/users", "OK:OK"},
			{"path", "/api/users", "OVER_LIMIT:OVER_LIMIT"},
			{"path", "/api/orders", "OK:OK"}, // a counter per distinct value
			{"path", "/web/home", "OK:OK"},   // no match
			{"path", "/web/home", "OK:OK"},
			{"host", "a.example.com", "OK:OK"},
			{"host", "a.example.com", "OVER_LIMIT:OVER_LIMIT"},
			{"host", "b.example.com", "OK:OK"},
			{"host", "example.org", "OK:OK"},
			{"host", "example.org", "OK:OK"},
			{"file", "/files/a", "OK:OK"},
			{"file", "/files/b", "OVER_LIMIT:OVER_LIMIT"}, // shared
		} {
			if got := codesOf(p.must("e2e", desc(c.key, c.value))); got != c.want {
				t.Errorf("%s=%s: %s, want %s", c.key, c.value, got, c.want)
			}
		}
	})

	t.Run("shadow mode rule", func(t *testing.T) {
		p.t = t
		for i := range 3 {
			if got := codesOf(p.must("e2e", desc("shadowed", "s"))); got != "OK:OK" {
				t.Errorf("request %d: %s", i+1, got)
			}
		}
	})

	t.Run("replaces", func(t *testing.T) {
		p.t = t
		// Alone, old allows one a day; with new in the same request, new's
		// limit replaces it.
		if got := codesOf(p.must("e2e", desc("tier", "old"))); got != "OK:OK" {
			t.Fatalf("old alone: %s", got)
		}
		if got := codesOf(p.must("e2e", desc("tier", "old"))); got != "OVER_LIMIT:OVER_LIMIT" {
			t.Fatalf("old alone, again: %s", got)
		}
		for i := range 3 {
			if got := codesOf(p.must("e2e", desc("tier", "old"), desc("tier", "new"))); got != "OK:OK,OK" {
				t.Errorf("old and new %d: %s", i+1, got)
			}
		}
	})

	t.Run("unlimited", func(t *testing.T) {
		p.t = t
		for range 5 {
			if got := codesOf(p.must("e2e", desc("free", "x"))); got != "OK:OK" {
				t.Fatalf("unlimited: %s", got)
			}
		}
	})

	t.Run("hits_addend", func(t *testing.T) {
		p.t = t
		// Peeks consume nothing however many.
		for range 4 {
			r := p.must("e2e", peek(desc("user", "peeker")))
			if codesOf(r) != "OK:OK" || r.Statuses[0].LimitRemaining != 2 {
				t.Fatalf("peek: %s remaining %d", codesOf(r), r.Statuses[0].LimitRemaining)
			}
		}
		// The request's hits_addend: 2 takes the whole quota.
		r, err := p.rlReq(&rlsv3.RateLimitRequest{Domain: "e2e", HitsAddend: 2, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "bulk")}})
		if err != nil || codesOf(r) != "OK:OK" || r.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("hits_addend 2: %v %v", r, err)
		}
		// A descriptor's own hits_addend wins over the request's; more
		// than the quota is denied and consumes nothing.
		d := desc("user", "bulk2")
		d.HitsAddend = wrapperspb.UInt64(3)
		if got := codesOf(p.must("e2e", d)); got != "OVER_LIMIT:OVER_LIMIT" {
			t.Fatalf("hits_addend 3 of 2: %s", got)
		}
		if rem := p.must("e2e", peek(desc("user", "bulk2"))).Statuses[0].LimitRemaining; rem != 2 {
			t.Errorf("remaining %d after a denied request, want 2", rem)
		}
		// The token bucket: a burst of 3.
		d = desc("bucket", "b")
		d.HitsAddend = wrapperspb.UInt64(3)
		if got := codesOf(p.must("e2e", d)); got != "OK:OK" {
			t.Errorf("burst of 3: %s", got)
		}
		if got := codesOf(p.must("e2e", desc("bucket", "b"))); got != "OVER_LIMIT:OVER_LIMIT" {
			t.Errorf("after the burst: %s", got)
		}
	})

	t.Run("override", func(t *testing.T) {
		p.t = t
		d := func() *ratelimitv3.RateLimitDescriptor {
			d := desc("user", "overridden")
			d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_DAY}
			return d
		}
		r := p.must("e2e", d())
		if codesOf(r) != "OK:OK" || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1 {
			t.Fatalf("override: %v", r)
		}
		if got := codesOf(p.must("e2e", d())); got != "OVER_LIMIT:OVER_LIMIT" {
			t.Errorf("override, again: %s", got)
		}
	})

	t.Run("bad requests", func(t *testing.T) {
		p.t = t
		victim := desc("user", "victim")
		huge := desc("user", "victim")
		huge.HitsAddend = wrapperspb.UInt64(1 << 50)
		for name, req := range map[string]*rlsv3.RateLimitRequest{
			"no domain":          {Descriptors: []*ratelimitv3.RateLimitDescriptor{victim}},
			"no descriptors":     {Domain: "e2e"},
			"empty key":          {Domain: "e2e", Descriptors: []*ratelimitv3.RateLimitDescriptor{victim, desc("", "x")}},
			"no entries":         {Domain: "e2e", Descriptors: []*ratelimitv3.RateLimitDescriptor{victim, {}}},
			"10 KB value":        {Domain: "e2e", Descriptors: []*ratelimitv3.RateLimitDescriptor{victim, desc("user", strings.Repeat("v", 10<<10))}},
			"huge hits_addend":   {Domain: "e2e", Descriptors: []*ratelimitv3.RateLimitDescriptor{victim, huge}},
			"negative hits flag": {Domain: "e2e", Descriptors: []*ratelimitv3.RateLimitDescriptor{victim, {Entries: victim.Entries, IsNegativeHits: true}}},
		} {
			_, err := p.rlReq(req)
			if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() == "" {
				t.Errorf("%s: %v, want InvalidArgument with a message", name, err)
			}
			b, _ := protojson.Marshal(req)
			if code, body, _ := p.http("POST", "/json", string(b)); code != 400 || !strings.Contains(body, `"error"`) {
				t.Errorf("%s over HTTP: %d %s", name, code, body)
			}
		}
		for name, body := range map[string]string{
			"malformed JSON": `{"domain": "e2e", "descriptors": [`,
			"unknown field":  `{"domain": "e2e", "colour": "blue"}`,
			"wrong type":     `{"domain": 7}`,
		} {
			if code, resp, _ := p.http("POST", "/json", body); code != 400 {
				t.Errorf("%s: %d %s", name, code, resp)
			}
		}
		// Nothing was consumed.
		if rem := p.must("e2e", peek(desc("user", "victim"))).Statuses[0].LimitRemaining; rem != 2 {
			t.Errorf("victim remaining %d, want 2", rem)
		}
	})

	t.Run("json", func(t *testing.T) {
		p.t = t
		body := `{"domain":"e2e","descriptors":[{"entries":[{"key":"one","value":"json"}]}]}`
		code, resp, _ := p.http("POST", "/json", body)
		if code != 200 || !strings.Contains(resp, `"overallCode":"OK"`) {
			t.Fatalf("first: %d %s", code, resp)
		}
		code, resp, hdr := p.http("POST", "/json", body)
		if code != 429 || !strings.Contains(resp, `"overallCode":"OVER_LIMIT"`) {
			t.Fatalf("second: %d %s", code, resp)
		}
		var parsed rlsv3.RateLimitResponse
		if err := protojson.Unmarshal([]byte(resp), &parsed); err != nil || parsed.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1 {
			t.Errorf("response %s: %v", resp, err)
		}
		if hdr.Get("Retry-After") == "" {
			t.Errorf("no Retry-After on a 429: %v", hdr)
		}
		if code, _, _ := p.http("GET", "/json", ""); code != 405 {
			t.Errorf("GET /json: %d", code)
		}
	})

	t.Run("health", func(t *testing.T) {
		p.t = t
		for _, path := range []string{"/healthz", "/readyz", "/healthcheck"} {
			if code, body, _ := p.http("GET", path, ""); code != 200 {
				t.Errorf("%s: %d %s", path, code, body)
			}
		}
		hc := healthpb.NewHealthClient(p.conn)
		for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService"} {
			r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
			if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("gRPC health %q: %v %v", svc, r, err)
			}
		}
	})

	t.Run("metrics and debug", func(t *testing.T) {
		p.t = t
		for _, series := range []string{
			`sluice_config_loads_total{result="success"}`,
			`sluice_store_keys`,
		} {
			if p.metric(series) == "" {
				t.Errorf("no %s in /metrics", series)
			}
		}
		_, body, _ := p.http("GET", "/metrics", "")
		for _, want := range []string{"sluice_requests_total", "sluice_rule_over_limit_total", "sluice_decision_duration_seconds"} {
			if !strings.Contains(body, want) {
				t.Errorf("/metrics lacks %s", want)
			}
		}
		if strings.Contains(body, "victim") || strings.Contains(body, "alice") {
			t.Error("request values in metric labels")
		}
		code, body, _ := httpDo(t, "GET", "http://"+p.dbg+"/rules", "")
		if code != 200 || !strings.Contains(body, "e2e") {
			t.Errorf("debug /rules: %d %s", code, body)
		}
		if code, _, _ := httpDo(t, "GET", "http://"+p.dbg+"/debug/pprof/", ""); code != 200 {
			t.Errorf("debug pprof: %d", code)
		}
	})
}

func TestServeE2EReload(t *testing.T) {
	beside(t)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	limit := func(n int) string { return dayRule("r", "user", n) }
	writeRules(t, rules, limit(1))
	// The settings by environment variable this time, Envoy's for the
	// gRPC port.
	port := freePort(t)
	p := startSluice(t, []string{
		"SLUICE_CONFIG=" + rules,
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + port,
		"SLUICE_HTTP_ADDR=127.0.0.1:0", "SLUICE_DEBUG_ADDR=",
	})
	if p.grpcAddr != "127.0.0.1:"+port || p.dbg != "" {
		t.Fatalf("grpc %s (want port %s), debug %q", p.grpcAddr, port, p.dbg)
	}
	limitNow := func() uint32 {
		return p.must("r", peek(desc("user", "probe"))).Statuses[0].CurrentLimit.GetRequestsPerUnit()
	}
	if got := codesOf(p.must("r", desc("user", "a"))); got != "OK:OK" {
		t.Fatal(got)
	}
	if got := codesOf(p.must("r", desc("user", "a"))); got != "OVER_LIMIT:OVER_LIMIT" {
		t.Fatal(got)
	}

	// A good config: the new limit takes effect.
	writeRules(t, rules, limit(3))
	poll(t, "new limit in force", func() bool { return limitNow() == 3 })
	// A changed limit starts fresh counters (docs/operations.md).
	if got := codesOf(p.must("r", desc("user", "a"))); got != "OK:OK" {
		t.Errorf("user a under the new limit: %s", got)
	}
	for i, want := range []string{"OK:OK", "OK:OK", "OK:OK", "OVER_LIMIT:OVER_LIMIT"} {
		if got := codesOf(p.must("r", desc("user", "b"))); got != want {
			t.Errorf("request %d under the new limit: %s, want %s", i+1, got, want)
		}
	}

	// A bad config: rejected, counted, logged with its line; the old one
	// stays.
	writeRules(t, rules, "domain: r\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 9}\n")
	poll(t, "failure counted", func() bool { return p.metric(`sluice_config_loads_total{result="failure"}`) == "1" })
	p.waitLog(`"msg":"rules problem"`, `"line":4`, "fortnight")
	if got := limitNow(); got != 3 {
		t.Errorf("limit %d after a bad config, want 3", got)
	}
	if code, _, _ := p.http("GET", "/readyz", ""); code != 200 {
		t.Errorf("not ready after a rejected reload: %d", code)
	}

	// Fixed again, and SIGHUP reloads on demand.
	writeRules(t, rules, limit(4))
	poll(t, "fixed config in force", func() bool { return limitNow() == 4 })
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	p.waitLog("SIGHUP")
	if got := p.metric(`sluice_config_loads_total{result="success"}`); got != "3" {
		t.Errorf("successful loads %s, want 3 (initial, 3, 4)", got)
	}
	if code := p.stop(syscall.SIGTERM); code != 0 {
		t.Errorf("exit %d", code)
	}
}

func TestServeE2EShadowMode(t *testing.T) {
	beside(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, dayRule("s", "k", 1))
	p := startSluice(t, []string{"SHADOW_MODE=true"}, "--config", rules)
	// As envoyproxy/ratelimit: OK overall, the descriptor's own status
	// still OVER_LIMIT once its limit denies.
	for i, want := range []string{"OK:OK", "OK:OVER_LIMIT", "OK:OVER_LIMIT"} {
		r := p.must("s", desc("k", "v"))
		if codesOf(r) != want {
			t.Errorf("request %d: %s, want %s", i+1, codesOf(r), want)
		}
	}
	poll(t, "shadow denials counted", func() bool {
		_, body, _ := p.http("GET", "/metrics", "")
		return strings.Contains(body, `sluice_rule_shadow_mode_total{domain="s",rule="s.k"} 2`)
	})
	if code, _, _ := p.http("POST", "/json", `{"domain":"s","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`); code != 200 {
		t.Errorf("/json in shadow mode: %d", code)
	}
}

func TestServeE2EShutdownAndRestore(t *testing.T) {
	// Not beside the tests that wait: it asks within a drain delay of 500 ms, which their load could outlast.
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	state := filepath.Join(dir, "state", "sluice.state")
	if err := os.Mkdir(filepath.Dir(state), 0o755); err != nil {
		t.Fatal(err)
	}
	writeRules(t, rules, dayRule("p", "client", 2))
	args := []string{"--config", rules, "--state-file", state, "--drain-delay", "500ms"}
	p := startSluice(t, nil, args...)
	for i, want := range []string{"OK:OK", "OK:OK", "OVER_LIMIT:OVER_LIMIT"} {
		if got := codesOf(p.must("p", desc("client", "c"))); got != want {
			t.Fatalf("request %d: %s, want %s", i+1, got, want)
		}
	}

	// SIGTERM: readiness fails at once while requests are still answered
	// for the drain delay, then the process saves its state and exits 0.
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	poll(t, "readiness fails", func() bool {
		code, _, _ := p.http("GET", "/readyz", "")
		return code == 503
	})
	r, err := healthpb.NewHealthClient(p.conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health while draining: %v %v", r, err)
	}
	// Answered while draining: a check sees the debt the third request
	// left on the exhausted window (counted, as envoy-rl counts it).
	if got := codesOf(p.must("p", peek(desc("client", "c")))); got != "OVER_LIMIT:OVER_LIMIT" {
		t.Errorf("request while draining: %s, want OVER_LIMIT (in debt)", got)
	}
	if code := p.wait(); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
	if info, err := os.Stat(state); err != nil || info.Size() == 0 {
		t.Fatalf("state file: %v", err)
	}
	p.waitLog("state saved")

	// The same client is still limited after a restart; another is not.
	p2 := startSluice(t, nil, args...)
	p2.waitLog("state restored")
	if got := codesOf(p2.must("p", desc("client", "c"))); got != "OVER_LIMIT:OVER_LIMIT" {
		t.Errorf("after restart: %s, want OVER_LIMIT", got)
	}
	if got := codesOf(p2.must("p", desc("client", "d"))); got != "OK:OK" {
		t.Errorf("another client after restart: %s", got)
	}
	if code := p2.stop(os.Interrupt); code != 0 {
		t.Errorf("exit %d after SIGINT", code)
	}
}

func TestServeE2EPeriodicSnapshot(t *testing.T) {
	beside(t)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	state := filepath.Join(dir, "sluice.state")
	writeRules(t, rules, dayRule("c", "client", 1))
	args := []string{"--config", rules, "--state-file", state, "--snapshot-interval", "50ms"}
	p := startSluice(t, nil, args...)
	if got := codesOf(p.must("c", desc("client", "c"))); got != "OK:OK" {
		t.Fatal(got)
	}
	// Wait for a snapshot begun after the request (two more than when it
	// was answered: one may have been under way), then crash: no shutdown
	// snapshot.
	snapshots := func() int {
		n, _ := strconv.Atoi(p.metric(`sluice_state_snapshots_total{result="success"}`))
		return n
	}
	before := snapshots()
	poll(t, "a periodic snapshot", func() bool { return snapshots() >= before+2 })
	p.cmd.Process.Kill()
	p.wait()

	p2 := startSluice(t, nil, args...)
	if got := codesOf(p2.must("c", desc("client", "c"))); got != "OVER_LIMIT:OVER_LIMIT" {
		t.Errorf("after a crash: %s, want OVER_LIMIT from the periodic snapshot", got)
	}
}

// TestServeE2ECrashLossBound: with the default --snapshot-interval, a
// kill -9 loses at most the hits of the last interval: 123 hits, a wait of
// two intervals at most (the second snapshot began after the hits), a
// crash, and the restarted process still counts all 123.
func TestServeE2ECrashLossBound(t *testing.T) {
	beside(t)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	state := filepath.Join(dir, "sluice.state")
	writeRules(t, rules, dayRule("c", "client", 1000))
	args := []string{"--config", rules, "--state-file", state}
	p := startSluice(t, nil, args...)
	d := desc("client", "c")
	d.HitsAddend = wrapperspb.UInt64(123)
	if got := codesOf(p.must("c", d)); got != "OK:OK" {
		t.Fatal(got)
	}
	snapshots := func() int {
		n, _ := strconv.Atoi(p.metric(`sluice_state_snapshots_total{result="success"}`))
		return n
	}
	before := snapshots()
	deadline := time.Now().Add(2*defaultSnapshotInterval + 5*time.Second)
	for i := 0; snapshots() < before+2; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than 2 snapshots in %s with the default interval (%s)", 2*defaultSnapshotInterval+5*time.Second, defaultSnapshotInterval)
		}
		time.Sleep(pollPause(i))
	}
	p.cmd.Process.Kill()
	p.wait()

	p2 := startSluice(t, nil, args...)
	resp := p2.must("c", peek(desc("client", "c")))
	if got := resp.Statuses[0].LimitRemaining; got != 1000-123 {
		t.Errorf("after a kill -9: %d remaining, want %d", got, 1000-123)
	}
}

func TestServeE2EInFlightRequestFinishes(t *testing.T) {
	beside(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, dayRule("f", "k", 1))
	p := startSluice(t, nil, "--config", rules)

	// A request whose body is half sent when SIGTERM arrives.
	conn, err := net.DialTimeout("tcp", p.httpAddr, e2eWait)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(e2eWait))
	body := `{"domain":"f","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`
	fmt.Fprintf(conn, "POST /json HTTP/1.1\r\nHost: sluice\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:10])
	// Until the handler runs, the connection may not even be accepted, and
	// shutdown would rightly drop it: wait for the handler in the
	// goroutine dump of the debug listener.
	poll(t, "request in the handler", func() bool {
		_, dump, _ := httpDo(t, "GET", "http://"+p.dbg+"/debug/pprof/goroutine?debug=2", "")
		return strings.Contains(dump, "serveJSON")
	})
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The listener closes: shutdown has begun.
	poll(t, "listener closed", func() bool {
		c, err := net.DialTimeout("tcp", p.httpAddr, time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	select {
	case <-p.done:
		t.Fatal("exited with a request in flight")
	default:
	}
	io.WriteString(conn, body[10:])
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("in-flight request: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("in-flight request: %d", resp.StatusCode)
	}
	if code := p.wait(); code != 0 {
		t.Errorf("exit %d", code)
	}
}

func TestServeE2EStartFailures(t *testing.T) {
	beside(t)
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	writeRules(t, good, dayRule("g", "k", 1))
	bad := filepath.Join(dir, "bad.yaml")
	writeRules(t, bad, `domain: b
descriptors:
  - key: a
    rate_limit: {unit: fortnight, requests_per_unit: 1}
  - key: b
    rate_limit: {unit: second, requests_per_unit: -4}
`)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()

	for _, c := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"bad rules", []string{"--config", bad}, 1, []string{"2 problem(s)", "bad.yaml:4:", "fortnight", "bad.yaml:6:"}},
		{"missing rules", []string{"--config", filepath.Join(dir, "nope.yaml")}, 1, []string{"nope.yaml", "no such file"}},
		{"no config", nil, 2, []string{"--config (or SLUICE_CONFIG) is required"}},
		{"unknown store", []string{"--config", good, "--store", "memcache"}, 1, []string{`unknown store "memcache" (supported: memory, redis)`}},
		{"redis without url", []string{"--config", good, "--store", "redis"}, 1, []string{"--store redis needs --redis-url"}},
		{"port taken", []string{"--config", good, "--http-addr", taken.Addr().String()}, 1, []string{"http listener", "address already in use"}},
		{"state in a missing directory", []string{"--config", good, "--state-file", filepath.Join(dir, "no", "state")}, 1, []string{"--state-file"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := launch(t, nil, c.args...)
			if code := p.wait(); code != c.code {
				t.Errorf("exit %d, want %d", code, c.code)
			}
			log := p.log()
			for _, w := range c.want {
				if !strings.Contains(log, w) {
					t.Errorf("output lacks %q:\n%s", w, log)
				}
			}
		})
	}

	t.Run("corrupt state", func(t *testing.T) {
		state := filepath.Join(t.TempDir(), "state")
		if err := os.WriteFile(state, bytes.Repeat([]byte("not a snapshot "), 10), 0o644); err != nil {
			t.Fatal(err)
		}
		p := startSluice(t, nil, "--config", good, "--state-file", state)
		p.waitLog("state file is corrupt", state+".corrupt")
		if _, err := os.Stat(state + ".corrupt"); err != nil {
			t.Errorf("not moved aside: %v", err)
		}
		if got := codesOf(p.must("g", desc("k", "v"))); got != "OK:OK" {
			t.Errorf("empty start: %s", got)
		}
		if code := p.stop(syscall.SIGTERM); code != 0 {
			t.Errorf("exit %d", code)
		}
		if _, err := os.Stat(state); err != nil {
			t.Errorf("no fresh state written: %v", err)
		}
	})
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// TestServeE2EMaxBytesLimitsTheProcess: --max-bytes bounds the process,
// not only the store's estimate: the Go runtime's soft memory limit is set
// from it and the cap of the RLQS buckets (docs/operations.md has the
// formula and the RSS measured), and GOMEMLIMIT, when set, wins.
func TestServeE2EMaxBytesLimitsTheProcess(t *testing.T) {
	beside(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, dayRule("m", "k", 10))
	limit := func(p *proc) float64 {
		v, err := strconv.ParseFloat(p.metric("go_gc_gomemlimit_bytes"), 64)
		if err != nil {
			t.Fatalf("go_gc_gomemlimit_bytes: %v", err)
		}
		return v
	}
	p := startSluice(t, nil, "--config", rules, "--max-bytes", "32MiB")
	if got, want := limit(p), float64(32<<20+4<<20+memLimitBase+rlqs.DefaultMaxBytes); got != want {
		t.Errorf("--max-bytes 32MiB: go_gc_gomemlimit_bytes %v, want %v (with --rlqs-max-bytes' default)", got, want)
	}
	p = startSluice(t, []string{"GOMEMLIMIT=200MiB"}, "--config", rules, "--max-bytes", "32MiB")
	if got, want := limit(p), float64(200<<20); got != want {
		t.Errorf("GOMEMLIMIT=200MiB: go_gc_gomemlimit_bytes %v, want %v", got, want)
	}
	p = startSluice(t, nil, "--config", rules)
	if got, want := limit(p), float64(math.MaxInt64); got != want {
		t.Errorf("no --max-bytes: go_gc_gomemlimit_bytes %v, want %v", got, want)
	}
}

// TestServeE2EHitters: the debug listener's /hitters lists, after known
// traffic, the key that asked most and was denied most on top of its
// rule, over the minute and the hour.
func TestServeE2EHitters(t *testing.T) {
	beside(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, `domain: api
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
`)
	p := startSluice(t, nil, "--config", rules)
	for i := range 200 {
		user := "mallory"
		if i%4 == 0 {
			user = fmt.Sprint("user", i)
		}
		p.must("api", desc("user", user))
	}
	for _, window := range []string{"minute", "hour"} {
		code, body, _ := httpDo(t, "GET", "http://"+p.dbg+"/hitters?window="+window+"&k=3", "")
		if code != 200 {
			t.Fatalf("/hitters: %d %s", code, body)
		}
		var reports []struct {
			Rule, Kind, Window string
			Hits               uint64
			Top                []struct {
				Key   string
				Count uint64
			}
		}
		if err := json.Unmarshal([]byte(body), &reports); err != nil {
			t.Fatalf("/hitters: %v\n%s", err, body)
		}
		if len(reports) != 2 {
			t.Fatalf("/hitters: %d reports, want requests and denials of api.user:\n%s", len(reports), body)
		}
		for _, r := range reports {
			want := map[string]uint64{"requests": 150, "denials": 140}[r.Kind]
			if r.Rule != "api.user" || r.Window != window || len(r.Top) == 0 || r.Top[0].Key != "user=mallory" || r.Top[0].Count != want {
				t.Errorf("%s %s: %+v, want user=mallory on top with %d", window, r.Kind, r, want)
			}
		}
	}
	if code, _, _ := httpDo(t, "GET", "http://"+p.dbg+"/hitters?window=week", ""); code != 400 {
		t.Errorf("/hitters?window=week: %d, want 400", code)
	}
	// The alert's metric: mallory made 140 of the minute's 140 denials.
	if got := p.metric(`sluice_top_key_share{kind="denials",rule="api.user"}`); got != "1" {
		t.Errorf("sluice_top_key_share of the denials: %q, want 1", got)
	}
	if got := p.metric(`sluice_top_key_window_hits{kind="requests",rule="api.user"}`); got != "200" {
		t.Errorf("sluice_top_key_window_hits of the requests: %q, want 200", got)
	}
}
