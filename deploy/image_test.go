package deploy

// The image: scripts/image builds it once per test run (with podman,
// offline, from a static binary built here); the tests read its config
// (podman image inspect), extract its filesystem (podman create + podman
// export) and run the extracted binary outside any container, as the
// image's user (65534), since podman run does not work everywhere the
// tests do.

import (
	"archive/tar"
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testsupport/testpart"
)

// imageBudget bounds the image's size, uncompressed (podman's Size): the
// static binary is most of it (some 38 MB), the CA bundle 220 kB.
const imageBudget = 40 << 20

// nobody is the image's user and group.
const nobody = 65534

// builtImage is the image scripts/image built for this test run.
type builtImage struct {
	tag     string
	inspect imageInspect
	root    string                 // its filesystem, extracted
	headers map[string]*tar.Header // its files, by path (no leading /)
	took    time.Duration
}

// imageInspect is what the tests read of podman image inspect.
type imageInspect struct {
	Size   int64
	Config struct {
		User         string
		Entrypoint   []string
		Cmd          []string
		Env          []string
		WorkingDir   string
		ExposedPorts map[string]struct{}
		Volumes      map[string]struct{}
		Labels       map[string]string
	}
}

var imageBuild struct {
	once sync.Once
	img  *builtImage
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if img := imageBuild.img; img != nil {
		exec.Command("podman", "rmi", "--force", img.tag).Run()
		os.RemoveAll(filepath.Dir(img.root))
	}
	os.Exit(code)
}

// sluiceImage builds the image once, with the one command the docs give
// (scripts/image), and extracts it.
func sluiceImage(t *testing.T) *builtImage {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the image")
	}
	podman := testpart.Program(t, "apt-get install podman", "podman")
	imageBuild.once.Do(func() {
		imageBuild.img, imageBuild.err = buildImage(podman)
	})
	if imageBuild.err != nil {
		t.Fatal(imageBuild.err)
	}
	return imageBuild.img
}

func buildImage(podman string) (*builtImage, error) {
	img := &builtImage{tag: fmt.Sprintf("localhost/sluice:test-%d", os.Getpid())}
	start := time.Now()
	build := exec.Command("../scripts/image", img.tag)
	var stderr bytes.Buffer
	build.Stderr = &stderr
	if _, err := build.Output(); err != nil {
		return nil, fmt.Errorf("scripts/image: %v\n%s", err, stderr.String())
	}
	img.took = time.Since(start)
	out, err := exec.Command(podman, "image", "inspect", img.tag).Output()
	if err != nil {
		return nil, fmt.Errorf("podman image inspect: %v", err)
	}
	var inspected []imageInspect
	if err := json.Unmarshal(out, &inspected); err != nil || len(inspected) != 1 {
		return nil, fmt.Errorf("podman image inspect: %v\n%s", err, out)
	}
	img.inspect = inspected[0]
	dir, err := os.MkdirTemp("", "sluice-image-")
	if err != nil {
		return nil, err
	}
	img.root = filepath.Join(dir, "root")
	cid, err := exec.Command(podman, "create", img.tag).Output()
	if err != nil {
		return nil, fmt.Errorf("podman create: %v", err)
	}
	id := strings.TrimSpace(string(cid))
	defer exec.Command(podman, "rm", id).Run()
	export := exec.Command(podman, "export", id)
	pipe, err := export.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := export.Start(); err != nil {
		return nil, err
	}
	img.headers, err = untar(pipe, img.root)
	if werr := export.Wait(); err == nil {
		err = werr
	}
	if err != nil {
		return nil, fmt.Errorf("podman export: %v", err)
	}
	// The extracted tree is root's, readable by all, writable by none but
	// root: the binary runs there as nobody, as in the container.
	for _, d := range []string{dir, img.root} {
		if err := os.Chmod(d, 0o755); err != nil {
			return nil, err
		}
	}
	return img, nil
}

// untar extracts the regular files, directories and symlinks of r into
// dir, owned by the caller, and returns every header by its path.
func untar(r io.Reader, dir string) (map[string]*tar.Header, error) {
	headers := map[string]*tar.Header{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return headers, nil
		}
		if err != nil {
			return nil, err
		}
		name := strings.TrimSuffix(strings.TrimPrefix(filepath.Clean("/"+h.Name), "/"), "/")
		if name == "" {
			continue
		}
		headers[name] = h
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, p)
		case tar.TypeReg:
			var f *os.File
			if f, err = os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o755); err == nil {
				_, err = io.Copy(f, tr)
				f.Close()
			}
		default:
			err = fmt.Errorf("%s: unexpected type %q in the image", name, h.Typeflag)
		}
		if err != nil {
			return nil, err
		}
	}
}

// TestImage: the image's config (user, entrypoint, ports, volume, labels),
// its size within the budget, and its files: the binary, /bin/ratelimit
// pointing to it, the CA bundle, passwd and group for 65534, the state
// volume owned by 65534, and nothing else (no shell).
func TestImage(t *testing.T) {
	img := sluiceImage(t)
	t.Logf("scripts/image took %v; the image is %d bytes (%.1f MiB), budget %d MiB",
		img.took.Round(100*time.Millisecond), img.inspect.Size, float64(img.inspect.Size)/(1<<20), imageBudget>>20)
	c := img.inspect.Config
	if c.User != "65534:65534" {
		t.Errorf("user %q, want 65534:65534", c.User)
	}
	if !slices.Equal(c.Entrypoint, []string{"/bin/sluice"}) {
		t.Errorf("entrypoint %q, want /bin/sluice", c.Entrypoint)
	}
	var ports []string
	for p := range c.ExposedPorts {
		ports = append(ports, p)
	}
	slices.Sort(ports)
	if !slices.Equal(ports, exposedPorts) {
		t.Errorf("exposed ports %q, want %q", ports, exposedPorts)
	}
	if _, ok := c.Volumes["/var/lib/sluice"]; !ok || len(c.Volumes) != 1 {
		t.Errorf("volumes %v, want /var/lib/sluice", c.Volumes)
	}
	rev, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Labels["org.opencontainers.image.revision"]; got != strings.TrimSpace(string(rev)) {
		t.Errorf("revision label %q, want %s", got, rev)
	}
	for _, l := range []string{"source", "version", "title"} {
		if c.Labels["org.opencontainers.image."+l] == "" {
			t.Errorf("no org.opencontainers.image.%s label: %v", l, c.Labels)
		}
	}
	if img.inspect.Size > imageBudget {
		t.Errorf("the image is %d bytes, over its budget of %d", img.inspect.Size, imageBudget)
	}
	checkImageFiles(t, img)
	out, err := exec.Command(filepath.Join(img.root, "bin/sluice"), "version").Output()
	if err != nil || !strings.Contains(string(out), c.Labels["org.opencontainers.image.version"]) {
		t.Errorf("sluice version: %q, %v; want the version label %q", out, err, c.Labels["org.opencontainers.image.version"])
	}
}

// checkImageFiles checks the image's files: exactly the binary, its
// ratelimit link, the CA bundle, passwd and group, and the volume; owned
// by root but the volume (65534), writable by none but their owner.
func checkImageFiles(t *testing.T, img *builtImage) {
	t.Helper()
	var names []string
	for n := range img.headers {
		names = append(names, n)
	}
	slices.Sort(names)
	want := []string{"bin", "bin/ratelimit", "bin/sluice", "etc", "etc/group", "etc/passwd", "etc/ssl", "etc/ssl/certs",
		"etc/ssl/certs/ca-certificates.crt", "var", "var/lib", "var/lib/sluice"}
	if !slices.Equal(names, want) {
		t.Errorf("the image's files:\n%q\nwant\n%q", names, want)
	}
	for _, n := range names {
		h := img.headers[n]
		owner := 0
		if n == "var/lib/sluice" {
			owner = nobody
		}
		if h.Uid != owner || h.Gid != owner {
			t.Errorf("%s is owned by %d:%d, want %d:%d", n, h.Uid, h.Gid, owner, owner)
		}
		if h.Typeflag != tar.TypeSymlink && h.Mode&0o022 != 0 {
			t.Errorf("%s has mode %o: writable by others than its owner", n, h.Mode)
		}
	}
	if h := img.headers["bin/ratelimit"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "sluice" {
		t.Errorf("bin/ratelimit: %+v, want a symlink to sluice", h)
	}
	passwd, _ := os.ReadFile(filepath.Join(img.root, "etc/passwd"))
	group, _ := os.ReadFile(filepath.Join(img.root, "etc/group"))
	if !strings.Contains(string(passwd), "nobody:x:65534:65534:") || !strings.Contains(string(group), "nogroup:x:65534:") {
		t.Errorf("passwd:\n%s\ngroup:\n%s\nwant nobody and nogroup as 65534", passwd, group)
	}
}

// TestImageServes: the extracted binary, run as 65534 with nothing
// writable but its state volume, no HOME and no TMPDIR, serves on free
// ports: ready, answers, and on SIGTERM saves its state into the volume
// and exits 0, having written nothing anywhere else. Started as
// /bin/ratelimit with envoyproxy/ratelimit's environment and no
// arguments, it is sluice serve reading that environment.
func TestImageServes(t *testing.T) {
	img := sluiceImage(t)
	dir := worldReadableDir(t)
	rules := filepath.Join(dir, "rules")
	writeFile(t, filepath.Join(rules, "rules.yaml"), "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
	state := stateVolume(t, dir)
	since := time.Now()
	p := startImage(t, img, "bin/sluice", nil, "serve", "--config", rules, "--state-file", filepath.Join(state, "state"),
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", "", "--log-format", "json")
	p.waitReady(t)
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}`
	for i, want := range []int{200, 429} {
		if code, out := httpDo(t, "POST", "http://"+p.addr("http")+"/json", body); code != want {
			t.Errorf("request %d: %d %s, want %d", i+1, code, out, want)
		}
	}
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit %d on SIGTERM, want 0:\n%s", code, p.log())
	}
	if _, err := os.Stat(filepath.Join(state, "state")); err != nil {
		t.Errorf("the state file in the volume: %v", err)
	}
	checkWroteNothingElse(t, since, state, dir)

	// As Envoy Gateway runs it: /bin/ratelimit, no arguments.
	runtime := filepath.Join(dir, "data")
	writeFile(t, filepath.Join(runtime, "ratelimit", "config", "rules.yaml"), "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
	rl := startImage(t, img, "bin/ratelimit", []string{"RUNTIME_ROOT=" + runtime, "RUNTIME_SUBDIRECTORY=ratelimit", "HOST=127.0.0.1", "PORT=0",
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "DEBUG_PORT=0", "LOG_FORMAT=json"})
	rl.waitReady(t)
	if code, out := httpDo(t, "GET", "http://"+rl.addr("http")+"/healthcheck", ""); code != 200 {
		t.Errorf("/bin/ratelimit: /healthcheck %d %s", code, out)
	}
	if code, out := httpDo(t, "POST", "http://"+rl.addr("http")+"/json", body); code != 200 {
		t.Errorf("/bin/ratelimit: /json %d %s", code, out)
	}
	if code := rl.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("/bin/ratelimit: exit %d on SIGTERM:\n%s", code, rl.log())
	}
	checkWroteNothingElse(t, since, state, dir)
}

// needRoot: running the binary as 65534, and giving 65534 its volume,
// take root (as in CI, which fails without it; elsewhere the test skips).
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testpart.Missing(t, "root, to run the image's binary as its user 65534")
	}
}

// worldReadableDir is a new directory that nobody (65534) can read but
// not write.
func worldReadableDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sluice-deploy-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// stateVolume is the one directory in dir that 65534 may write, as the
// image's /var/lib/sluice volume.
func stateVolume(t *testing.T, dir string) string {
	t.Helper()
	needRoot(t)
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(state, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	return state
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// checkWroteNothingElse fails t for a file owned by 65534 and changed
// since, under dir or the system's temporary directory, outside the
// volume: as nobody, with the root filesystem read-only, the binary
// could have written nowhere else.
func checkWroteNothingElse(t *testing.T, since time.Time, volume string, dirs ...string) {
	t.Helper()
	for _, d := range append(dirs, "/tmp", "/var/tmp") {
		filepath.Walk(d, func(path string, info os.FileInfo, err error) error {
			if err != nil || path == volume || strings.HasPrefix(path, volume+"/") {
				return nil
			}
			st, ok := info.Sys().(*syscall.Stat_t)
			if ok && st.Uid == nobody && !info.ModTime().Before(since) {
				t.Errorf("written as 65534 outside the volume: %s", path)
			}
			return nil
		})
	}
}

// imageProc is the extracted binary running.
type imageProc struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
	addrs map[string]string
	ready chan struct{}
	done  chan struct{}
	code  int
}

// startImage runs the extracted file name (bin/sluice, bin/ratelimit) as
// 65534:65534, in the image's root, with only env (no HOME, no TMPDIR)
// and args.
func startImage(t *testing.T, img *builtImage, name string, env []string, args ...string) *imageProc {
	t.Helper()
	needRoot(t)
	cmd := exec.Command(filepath.Join(img.root, name), args...)
	cmd.Dir = img.root
	cmd.Env = env
	if cmd.Env == nil {
		cmd.Env = []string{}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody, NoSetGroups: true}}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &imageProc{cmd: cmd, addrs: map[string]string{}, ready: make(chan struct{}), done: make(chan struct{})}
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
		if t.Failed() {
			t.Logf("%s %s log:\n%s", name, strings.Join(args, " "), p.log())
		}
	})
	return p
}

func (p *imageProc) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	readyClosed := false
	for sc.Scan() {
		var rec struct{ Msg, Listener, Addr string }
		json.Unmarshal(sc.Bytes(), &rec)
		p.mu.Lock()
		p.lines = append(p.lines, sc.Text())
		if rec.Msg == "listening" {
			p.addrs[rec.Listener] = rec.Addr
		}
		p.mu.Unlock()
		if rec.Msg == "ready" && !readyClosed {
			close(p.ready)
			readyClosed = true
		}
	}
	if err := p.cmd.Wait(); err != nil {
		p.code = -1
		if ee, ok := err.(*exec.ExitError); ok {
			p.code = ee.ExitCode()
		}
	}
	close(p.done)
}

func (p *imageProc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

func (p *imageProc) addr(listener string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addrs[listener]
}

// waitFor bounds every wait of these tests.
const waitFor = 15 * time.Second

func (p *imageProc) waitReady(t *testing.T) {
	t.Helper()
	select {
	case <-p.ready:
	case <-p.done:
		t.Fatalf("exited with %d before ready:\n%s", p.code, p.log())
	case <-time.After(waitFor):
		t.Fatalf("not ready within %v:\n%s", waitFor, p.log())
	}
}

// stop sends sig and waits for the exit status, within waitFor.
func (p *imageProc) stop(t *testing.T, sig os.Signal) int {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	return p.wait(t, waitFor)
}

func (p *imageProc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(d):
		t.Fatalf("did not exit within %v:\n%s", d, p.log())
		return -1
	}
}

func httpDo(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// freePort is a port free on the loopback now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// exposedPorts are the ports the image declares, sorted: sluice serve's
// HTTP (8080) and gRPC (8081), sluice proxy's listener (8090) and admin
// (9090, also envoy-rl's PROMETHEUS_ADDR default), and the metrics port
// Envoy Gateway's setup gives --metrics-addr (19001, docs/envoy-gateway.md).
var exposedPorts = []string{"19001/tcp", "8080/tcp", "8081/tcp", "8090/tcp", "9090/tcp"}

// TestContainerfilesExpose: both Containerfiles' EXPOSE lines declare
// exposedPorts (checked without building; TestImage checks the image).
func TestContainerfilesExpose(t *testing.T) {
	for _, path := range []string{"../Containerfile", "image/Containerfile.offline"} {
		var ports []string
		for _, l := range finalStage(t, path) {
			if rest, ok := strings.CutPrefix(l, "EXPOSE "); ok {
				ports = append(ports, strings.Fields(rest)...)
			}
		}
		slices.Sort(ports)
		if !slices.Equal(ports, exposedPorts) {
			t.Errorf("%s exposes %q, want %q", path, ports, exposedPorts)
		}
	}
	guide, err := os.ReadFile("../docs/envoy-gateway.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(guide), "`:19001`") {
		t.Error("docs/envoy-gateway.md no longer names :19001: update exposedPorts")
	}
}

// TestContainerfilesAgree: the Containerfile (a Go builder stage, for
// those with a registry) and the offline build's make the same image: their
// final stages are the same instructions but for where COPY takes the
// files, and both lay the files out with deploy/image/rootfs.
func TestContainerfilesAgree(t *testing.T) {
	registry := finalStage(t, "../Containerfile")
	offline := finalStage(t, "image/Containerfile.offline")
	norm := func(lines []string) []string {
		var out []string
		for _, l := range lines {
			l = strings.Replace(l, "--from=build ", "", 1)
			l = strings.Replace(l, " /out/rootfs/", " rootfs/", 1)
			out = append(out, l)
		}
		return out
	}
	if !reflect.DeepEqual(norm(registry), norm(offline)) {
		t.Errorf("the final stages differ:\nContainerfile:\n%s\nContainerfile.offline:\n%s", strings.Join(registry, "\n"), strings.Join(offline, "\n"))
	}
	if len(registry) == 0 || registry[0] != "FROM scratch" {
		t.Errorf("the final stage starts %q, want FROM scratch", registry)
	}
	src, err := os.ReadFile("../Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile("../scripts/image")
	if err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{"Containerfile": string(src), "scripts/image": string(script)} {
		if !strings.Contains(text, "deploy/image/rootfs ") || !strings.Contains(text, "CGO_ENABLED=0 go build -trimpath -buildvcs=false") {
			t.Errorf("%s does not build with CGO_ENABLED=0 go build -trimpath and lay out with deploy/image/rootfs", name)
		}
	}
}

// finalStage returns the instructions of the last stage of a
// Containerfile, comments dropped and continuation lines joined.
func finalStage(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	cur := ""
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") || line == "" && cur == "" {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cur += strings.TrimSuffix(line, "\\") + " "
			continue
		}
		if cur+line != "" {
			all = append(all, strings.Join(strings.Fields(cur+line), " "))
		}
		cur = ""
	}
	last := 0
	for i, l := range all {
		if strings.HasPrefix(l, "FROM ") {
			last = i
		}
	}
	return all[last:]
}
