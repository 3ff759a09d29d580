package docs

import (
	"bytes"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A walkthrough shows readable ports (127.0.0.1:8080, --listen :3000),
// and its sluice commands listen on their defaults where it names none.
// Its test runs it on free ports instead, so that it neither collides
// with nor talks to whatever the reader, or another test, runs on those
// ports: each port the script names is replaced by a free one in its
// commands and its files, and the defaults move with the variables of
// defaultPorts. The walkthrough the test runs is the one the reader
// pastes, one port for another.

// defaultPorts are the ports sluice's commands use when a walkthrough
// names none, with the variable that moves each and its value (%d: the
// free port).
var defaultPorts = []struct {
	port       int
	env, value string
}{
	{8080, "SLUICE_HTTP_ADDR", ":%d"},                 // serve --http-addr, and sluice ready --addr
	{8081, "SLUICE_GRPC_ADDR", ":%d"},                 // serve --grpc-addr
	{6070, "SLUICE_DEBUG_ADDR", "127.0.0.1:%d"},       // serve --debug-addr
	{8090, "SLUICE_LISTEN", ":%d"},                    // proxy --listen
	{9090, "SLUICE_ADMIN_LISTEN", ":%d"},              // proxy --admin-listen
	{9091, "SLUICE_ADMIN_URL", "http://127.0.0.1:%d"}, // override, explain --server
}

// scrubbedEnv are variables of the test's environment that would move a
// walkthrough's sluice elsewhere than the doc says: they are not passed.
var scrubbedEnv = []string{"HOST", "PORT", "GRPC_HOST", "GRPC_PORT", "GRPC_UDS", "DEBUG_HOST", "DEBUG_PORT"}

// namedPort finds a port a script names: a colon, then 4 or 5 digits
// (127.0.0.1:8080, :8082, http://h:3000/x), of the registered or dynamic
// ranges.
var namedPort = regexp.MustCompile(`:(\d{4,5})\b`)

// docPorts are the ports script s uses as its doc shows it: the ones it
// names and sluice's defaults, sorted.
func docPorts(s *script) []int {
	texts := []string{}
	for _, b := range s.sh {
		texts = append(texts, b.text)
	}
	for _, f := range s.files {
		texts = append(texts, f)
	}
	set := map[int]bool{}
	for _, d := range defaultPorts {
		set[d.port] = true
	}
	for _, text := range texts {
		for _, m := range namedPort.FindAllStringSubmatch(text, -1) {
			if p, _ := strconv.Atoi(m[1]); p >= 1024 && p <= 65535 {
				set[p] = true
			}
		}
	}
	ports := make([]int, 0, len(set))
	for p := range set {
		ports = append(ports, p)
	}
	slices.Sort(ports)
	return ports
}

// handedOut are the ports freePorts has returned in this process. A port
// is free when freePorts finds it, not when the script that got it binds
// it, and the scripts run side by side: none gets a port another got.
var handedOut struct {
	sync.Mutex
	ports map[int]bool
}

// freePorts returns n distinct loopback ports free for TCP and UDP now,
// none returned before in this process. They are above the kernel's
// ephemeral range when it leaves room (aboveEphemeral): the kernel gives
// ports of that range to every outgoing connection and every listener on
// port 0, of any program, so one handed out from it could be taken before
// the script that got it binds it (a loaded suite saw "address already in
// use" once). Below it are redistest's servers and their cluster buses
// (10000 to 32767), and the ports the docs name.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var held []func()
	defer func() {
		for _, c := range held {
			c()
		}
	}()
	lo, hi := aboveEphemeral()
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		addr := "127.0.0.1:0"
		if hi-lo >= 1000 && tries < 10_000 {
			addr = "127.0.0.1:" + strconv.Itoa(lo+rand.IntN(hi-lo))
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil && addr != "127.0.0.1:0" {
			continue // taken: another
		}
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, func() { ln.Close() })
		port := ln.Addr().(*net.TCPAddr).Port
		pc, err := net.ListenPacket("udp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue // its UDP twin is taken: another
		}
		held = append(held, func() { pc.Close() })
		handedOut.Lock()
		taken := handedOut.ports[port]
		if !taken {
			if handedOut.ports == nil {
				handedOut.ports = map[int]bool{}
			}
			handedOut.ports[port] = true
		}
		handedOut.Unlock()
		if !taken {
			ports = append(ports, port)
		}
	}
	return ports
}

// aboveEphemeral returns the ports [lo, hi) that freePorts picks from:
// from the end of the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range) to 65535; empty when that is
// unknown.
func aboveEphemeral() (lo, hi int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0
	}
	end, err := strconv.Atoi(f[1])
	if err != nil || end >= 65535 {
		return 0, 0
	}
	return end + 1, 65536
}

// onFreePorts is script s as its test runs it: every port of docPorts
// replaced by a free one in its commands and files, and the environment
// that moves sluice's defaults to theirs.
type onFreePorts struct {
	sh    []block
	files map[string]string
	env   []string
	ports map[int]int // the doc's port -> the test's
}

func moveToFreePorts(t *testing.T, s *script) *onFreePorts {
	t.Helper()
	doc := docPorts(s)
	free := freePorts(t, len(doc))
	r := &onFreePorts{files: map[string]string{}, ports: map[int]int{}}
	alts := make([]string, len(doc))
	for i, p := range doc {
		r.ports[p] = free[i]
		alts[i] = strconv.Itoa(p)
	}
	// A port is replaced where it stands alone: 8080 in :8080 and in
	// "ask 8080", not in 18080.
	re := regexp.MustCompile(`\b(` + strings.Join(alts, "|") + `)\b`)
	replace := func(text string) string {
		return re.ReplaceAllStringFunc(text, func(m string) string {
			p, _ := strconv.Atoi(m)
			return strconv.Itoa(r.ports[p])
		})
	}
	for _, b := range s.sh {
		b.text = replace(b.text)
		r.sh = append(r.sh, b)
	}
	for name, text := range s.files {
		r.files[name] = replace(text)
	}
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "SLUICE_") && !slices.Contains(scrubbedEnv, name) {
			r.env = append(r.env, kv)
		}
	}
	for _, d := range defaultPorts {
		r.env = append(r.env, d.env+"="+fmt.Sprintf(d.value, r.ports[d.port]))
	}
	return r
}

// holder is another program on a port: a plain HTTP server on its TCP
// side, a socket on its UDP side, that answers every request with the
// same status and notes who came.
type holder struct {
	port     int
	srv      *http.Server
	udp      net.PacketConn
	mu       sync.Mutex
	requests []string // "METHOD /path", and "UDP packet"
}

// holdPort holds port on the loopback, TCP and UDP, answering status, or
// returns nil when either is taken already (by the reader's server, say:
// held all the same).
func holdPort(t *testing.T, port, status int) *holder {
	t.Helper()
	addr := "127.0.0.1:" + strconv.Itoa(port)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil
	}
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		ln.Close()
		return nil
	}
	h := &holder{port: port, udp: pc}
	h.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.note(r.Method + " " + r.URL.Path)
		w.WriteHeader(status)
		fmt.Fprintln(w, "OK, says another program")
	}), ReadHeaderTimeout: 5 * time.Second}
	go h.srv.Serve(ln)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			h.note("UDP packet")
		}
	}()
	t.Cleanup(h.close)
	return h
}

// close frees the port.
func (h *holder) close() {
	h.srv.Close()
	h.udp.Close()
}

func (h *holder) note(what string) {
	h.mu.Lock()
	h.requests = append(h.requests, what)
	h.mu.Unlock()
}

// asked returns what the holder was asked since the first n requests.
func (h *holder) asked(n int) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.requests[min(n, len(h.requests)):]...)
}

func (h *holder) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.requests)
}

// leftBehind waits, up to grace, until nothing the script started runs:
// no process of its process group pgid, and nothing listening on the
// script's ports. It returns what is still there then.
func leftBehind(pgid int, ports map[int]int, grace time.Duration) []string {
	deadline := time.Now().Add(grace)
	for {
		var left []string
		for _, p := range groupProcesses(pgid) {
			left = append(left, "a process: "+p)
		}
		for _, doc := range slices.Sorted(maps.Keys(ports)) {
			c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(ports[doc]), time.Second)
			if err == nil {
				c.Close()
				left = append(left, fmt.Sprintf("a listener on the port %d (here %d)", doc, ports[doc]))
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// groupProcesses lists the processes of the process group pgid that
// still run ("PID (command)"), zombies left out: their parent is gone,
// and the reaper may be slow. Without /proc, it says whether the group
// has any process.
func groupProcesses(pgid int) []string {
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		if syscall.Kill(-pgid, 0) == nil {
			return []string{"process group " + strconv.Itoa(pgid)}
		}
		return nil
	}
	var out []string
	for _, d := range dirs {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 3 || f[0] == "Z" || f[2] != strconv.Itoa(pgid) {
			continue
		}
		out = append(out, string(b[:i+1]))
	}
	return out
}

// errPortTaken is what a walkthrough says when a port it needs is taken.
var errPortTaken = regexp.MustCompile(`the port is taken|[Aa]ddress already in use`)

// TestShellPortTaken: with another server on its ports, each walkthrough
// that starts a server fails, saying the port is taken, and asks that
// server nothing but whether it is ready (GET /readyz, which tells it is
// not the walkthrough's own).
func TestShellPortTaken(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the docs' commands")
	}
	t.Parallel()
	all := docScripts(t)
	bash, bin, repo := shellTools(t)
	n := 0
	for _, s := range all {
		if !startsServers(s) {
			continue
		}
		n++
		t.Run(strings.TrimSuffix(filepath.Base(s.doc), ".md")+"/"+s.name, func(t *testing.T) {
			t.Parallel()
			var r *onFreePorts
			var strangers []*holder
			// A free port can be taken by another test's process before
			// this one holds it: then on other free ports.
			for attempt := 1; strangers == nil; attempt++ {
				r = moveToFreePorts(t, s)
				for _, doc := range slices.Sorted(maps.Keys(r.ports)) {
					// It answers 200 OK, as any server's /readyz.
					h := holdPort(t, r.ports[doc], http.StatusOK)
					if h == nil {
						if attempt == 5 {
							t.Fatalf("the port %d (for %d) was taken before the test could hold it, five times", r.ports[doc], doc)
						}
						for _, h := range strangers {
							h.close()
						}
						strangers = nil
						break
					}
					strangers = append(strangers, h)
				}
			}
			err := runScript(t, bash, bin, repo, s, r, 0)
			if err == nil || !errPortTaken.MatchString(err.Error()) {
				t.Errorf("ran beside other servers on its ports: %v\nwant a failure that says the port is taken", err)
			} else {
				t.Log(tail(err.Error(), 3))
			}
			for _, h := range strangers {
				for _, what := range h.asked(0) {
					if what != "GET /readyz" {
						t.Errorf("asked the server on the port %d %q", h.port, what)
					}
				}
			}
		})
	}
	if n == 0 {
		t.Fatal("no walkthrough starts a server")
	}
}

// startsServers reports whether s sends a command to the background.
func startsServers(s *script) bool {
	for _, b := range s.sh {
		for _, line := range strings.Split(b.text, "\n") {
			if background.MatchString(line) {
				return true
			}
		}
	}
	return false
}

// TestShellStop: the runner fails a script that leaves a process running
// once it has ended (here a sleep whose parent the script killed, as
// kill $! kills go run and leaves its server), or a listener on one of
// its ports; not one that stopped what it started.
func TestShellStop(t *testing.T) {
	t.Parallel()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatalf("bash: %v", err)
	}
	doc := filepath.Join(t.TempDir(), "doc.md")
	md := "```sh run=stopped\nsleep 600 &\nkill $!\n```\n\n" +
		"```sh run=orphan\nbash -c 'sleep 600 & echo x > started; wait' &\nuntil test -s started; do sleep 0.1; done\nkill $!\n```\n\n" +
		"```sh run=listener\nsocat -d -d TCP-LISTEN:8080,fork,bind=127.0.0.1 /dev/null 2>s.log &\nuntil grep -q 'listening on' s.log; do sleep 0.1; done\n```\n"
	if err := os.WriteFile(doc, []byte(md), 0o644); err != nil {
		t.Fatal(err)
	}
	got := scripts(t, doc)
	for i, want := range []string{"", "a process: ", "a listener on the port 8080"} {
		if i == 2 {
			if _, err := exec.LookPath("socat"); err != nil {
				t.Skip("no socat")
			}
		}
		r := moveToFreePorts(t, got[i])
		err := runScript(t, bash, t.TempDir(), "/", got[i], r, 2*time.Second)
		switch {
		case want == "" && err != nil:
			t.Errorf("run=%s: %v", got[i].name, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("run=%s: %v, want a failure with %q", got[i].name, err, want)
		}
	}
}

// TestShellFreePorts: the ports a script names, and sluice's defaults,
// move to free ones, in its commands and its files alike, the same port
// to the same one; numbers in words or longer numbers do not.
func TestShellFreePorts(t *testing.T) {
	t.Setenv("SLUICE_CONFIG", "from the test's environment")
	t.Setenv("PORT", "1")
	s := &script{
		sh:    []block{{text: "sluice nullapi --listen 127.0.0.1:3000 &\nask 3000; curl :8080 18080 x8080\n"}},
		files: map[string]string{"p.yaml": "upstream: http://127.0.0.1:3000\nlimit: 8080\n"},
	}
	if got, want := docPorts(s), []int{3000, 6070, 8080, 8081, 8090, 9090, 9091}; !slices.Equal(got, want) {
		t.Fatalf("docPorts: %v, want %v", got, want)
	}
	r := moveToFreePorts(t, s)
	p := func(doc int) string { return strconv.Itoa(r.ports[doc]) }
	if want := "sluice nullapi --listen 127.0.0.1:" + p(3000) + " &\nask " + p(3000) + "; curl :" + p(8080) + " 18080 x8080\n"; r.sh[0].text != want {
		t.Errorf("commands:\n%s\nwant\n%s", r.sh[0].text, want)
	}
	if want := "upstream: http://127.0.0.1:" + p(3000) + "\nlimit: " + p(8080) + "\n"; r.files["p.yaml"] != want {
		t.Errorf("file:\n%s\nwant\n%s", r.files["p.yaml"], want)
	}
	env := strings.Join(r.env, "\n")
	for _, want := range []string{"SLUICE_HTTP_ADDR=:" + p(8080), "SLUICE_ADMIN_URL=http://127.0.0.1:" + p(9091), "SLUICE_ADMIN_LISTEN=:" + p(9090)} {
		if !strings.Contains(env, want+"\n") && !strings.HasSuffix(env, want) {
			t.Errorf("environment without %s", want)
		}
	}
	for _, gone := range []string{"SLUICE_CONFIG=", "\nPORT="} {
		if strings.Contains("\n"+env, gone) {
			t.Errorf("environment with %s", gone)
		}
	}
	seen := map[int]bool{}
	for doc, free := range r.ports {
		if free == doc || seen[free] {
			t.Errorf("%d moved to %d, not a port of its own", doc, free)
		}
		seen[free] = true
	}
}

// TestShellNotWaited: a command sent to the background must be followed
// by sluice ready.
func TestShellNotWaited(t *testing.T) {
	s := &script{doc: "d.md", sh: []block{{line: 10, text: "sluice serve --config r.yaml &\ncurl x\n" +
		"sluice serve --config r.yaml &   # a comment\nserve=$!\n\nsluice ready $!\n" +
		"true && false\nredis-server --port 0 \\\n  --unixsocket s &\nbin/sluice ready --log l --line x $!\n" +
		"sluice nullapi &\n"}}}
	got := notWaited(s)
	if len(got) != 2 || !strings.Contains(got[0], `d.md:11: "sluice serve --config r.yaml &" runs in the background, and the next command, "curl x", is not sluice ready`) ||
		!strings.Contains(got[1], `d.md:21: "sluice nullapi &"`) {
		t.Errorf("notWaited:\n%s", strings.Join(got, "\n"))
	}
}
