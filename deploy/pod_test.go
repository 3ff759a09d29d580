package deploy

// The Deployments run as a kubelet would run them, short of a cluster: the
// image's binary (extracted) started as 65534 with the container's
// arguments and environment, Secrets resolved from secretKeyRef, ConfigMap
// and Secret volumes laid out as the kubelet lays them out (files behind a
// ..data symlink, swapped atomically on a change), the emptyDir volume the
// only place it may write; then each probe requested, a ConfigMap change
// and a broken one, and SIGTERM within the grace period.

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

// kubeletVolume writes files into dir as the kubelet writes a ConfigMap
// or Secret volume: in a timestamped directory, behind the symlink ..data,
// each file a symlink through it. Called again, it swaps the new files in
// the kubelet's way: a new directory, ..data_tmp pointing to it, renamed
// over ..data, the old directory removed.
func kubeletVolume(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	ts := "..2026_12_01_10_00_00." + strconv.FormatInt(time.Now().UnixNano(), 10)
	for name, content := range files {
		writeFile(t, filepath.Join(dir, ts, name), content)
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}

// pod is a Deployment's container running from the image.
type pod struct {
	*imageProc
	c     corev1.Container
	spec  corev1.PodSpec
	ports map[int32]string // container port -> the address it listens on here
	mount map[string]string
}

// runPod starts d's container as the kubelet would (see the file's
// comment), with configMaps and secrets (name -> key -> value) for its
// volumes and secretKeyRefs.
func runPod(t *testing.T, img *builtImage, d *appsv1.Deployment, configMaps map[string]*corev1.ConfigMap, secrets map[string]map[string]string) *pod {
	t.Helper()
	spec := d.Spec.Template.Spec
	c := spec.Containers[0]
	dir := worldReadableDir(t)
	p := &pod{c: c, spec: spec, ports: map[int32]string{}, mount: map[string]string{}}
	for _, m := range c.VolumeMounts {
		local := filepath.Join(dir, "volumes", m.Name)
		for _, v := range spec.Volumes {
			switch {
			case v.Name != m.Name:
			case v.ConfigMap != nil:
				cm := configMaps[v.ConfigMap.Name]
				if cm == nil {
					t.Fatalf("no ConfigMap %s", v.ConfigMap.Name)
				}
				kubeletVolume(t, local, cm.Data)
			case v.Secret != nil:
				kubeletVolume(t, local, secrets[v.Secret.SecretName])
			case v.EmptyDir != nil:
				if err := os.MkdirAll(filepath.Dir(local), 0o755); err != nil {
					t.Fatal(err)
				}
				local = stateVolume(t, filepath.Dir(local))
			default:
				t.Fatalf("volume %s: a kind this test does not lay out", v.Name)
			}
		}
		p.mount[m.MountPath] = local
	}
	// Ports: the container's, on free loopback ports here.
	addr := regexp.MustCompile(`^(--[a-z-]+=)(127\.0\.0\.1)?:(\d+)$`)
	var args []string
	for _, a := range c.Args {
		if m := addr.FindStringSubmatch(a); m != nil {
			n, _ := strconv.Atoi(m[3])
			here := "127.0.0.1:" + strconv.Itoa(freePort(t))
			p.ports[int32(n)] = here
			a = m[1] + here
		}
		for mount, local := range p.mount {
			a = strings.Replace(a, "="+mount, "="+local, 1)
		}
		args = append(args, a)
	}
	env := podEnv(t, c, secrets)
	if !strings.HasPrefix(c.Image, "localhost/sluice:") && !strings.Contains(c.Image, "sluice") {
		t.Fatalf("image %s is not sluice's", c.Image)
	}
	p.imageProc = startImage(t, img, "bin/sluice", env, args...)
	return p
}

// podEnv is the container's environment, secretKeyRefs resolved from
// secrets and the memory limit's resourceFieldRef from its resources.
func podEnv(t *testing.T, c corev1.Container, secrets map[string]map[string]string) []string {
	t.Helper()
	var env []string
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+e.Value)
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			v, ok := secrets[ref.Name][ref.Key]
			if !ok && (ref.Optional == nil || !*ref.Optional) {
				t.Fatalf("%s: no key %s in Secret %s", e.Name, ref.Key, ref.Name)
			}
			if ok {
				env = append(env, e.Name+"="+v)
			}
		case e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory":
			env = append(env, e.Name+"="+strconv.FormatInt(c.Resources.Limits.Memory().Value(), 10))
		default:
			t.Fatalf("%s: a value this test does not resolve", e.Name)
		}
	}
	return env
}

// probeURL is the URL of probe here.
func (p *pod) probeURL(t *testing.T, probe *corev1.Probe) string {
	t.Helper()
	port := containerPort(p.c, probe.HTTPGet.Port.String())
	here, ok := p.ports[port]
	if !ok {
		t.Fatalf("the probe's port %s (%d) is none the binary was given", probe.HTTPGet.Port.String(), port)
	}
	return "http://" + here + probe.HTTPGet.Path
}

// await polls url until it answers want, within d.
func await(t *testing.T, what, url string, want int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		code, body := httpDo(t, "GET", url, "")
		if code == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s answered %d %q, not %d, within %v", what, url, code, body, want, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// quotedPassword is a Redis password with both quotes, a backslash and a
// space: it goes through the Secret, the environment and the Redis
// client, and shows nowhere.
const quotedPassword = `pa"ss'w\ord 9`

// TestPodsRun: each Deployment of the manifests and of the chart, run as
// the kubelet would (runPod): the startup probe passes within its
// failureThreshold × periodSeconds, then the liveness and readiness
// probes (with the Redis of the Secret, whose password holds quotes);
// the password is in no log line and on no command line. On SIGTERM
// readiness fails while the process drains, and it exits 0 within
// terminationGracePeriodSeconds. For sluice serve of the manifests, a
// ConfigMap change is put in force without a restart, and a broken one
// is refused while the last good rules stay in force.
func TestPodsRun(t *testing.T) {
	img := sluiceImage(t)
	type deployment struct {
		name string
		objs []object
	}
	cases := []deployment{
		{"kubernetes", manifests(t, "kubernetes")},
		{"kubernetes/proxy", manifests(t, "kubernetes/proxy")},
	}
	for _, c := range chartCases {
		if c.name == "serve" || c.name == "proxy" {
			cases = append(cases, deployment{"chart " + c.name, renderChart(t, c.set...)})
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var d *appsv1.Deployment
			cms := map[string]*corev1.ConfigMap{}
			for _, o := range c.objs {
				switch v := o.v.(type) {
				case *appsv1.Deployment:
					d = v
				case *corev1.ConfigMap:
					cms[v.Name] = v
				}
			}
			secrets := map[string]map[string]string{"sluice-admin": {"tokens": "ops:" + strings.Repeat("t0k3n", 8) + "\n"}}
			for _, e := range d.Spec.Template.Spec.Containers[0].Env {
				if e.Name == "SLUICE_REDIS_URL" {
					r := redistest.Standalone(t, redistest.WithPassword(quotedPassword))
					secrets["sluice-redis"] = map[string]string{
						"url":      (&url.URL{Scheme: "redis", Host: r.Addr()}).String(),
						"password": quotedPassword,
					}
				}
			}
			p := runPod(t, img, d, cms, secrets)
			runProbes(t, p)
			if c.name == "kubernetes" {
				swapRules(t, p, cms["sluice-rules"])
			}
			drain(t, p)
			for _, s := range []string{quotedPassword, `pa"ss`, `w\ord`} {
				if strings.Contains(p.log(), s) {
					t.Errorf("the Redis password shows in the log")
				}
			}
		})
	}
}

// runProbes requests the startup probe until it passes, within its
// bound, then the liveness and readiness probes; and checks that no
// secret is on the command line the process runs with.
func runProbes(t *testing.T, p *pod) {
	t.Helper()
	c := p.c
	s := c.StartupProbe
	bound := time.Duration(s.FailureThreshold*max(s.PeriodSeconds, 1)) * time.Second
	await(t, "the startup probe", p.probeURL(t, s), 200, bound)
	await(t, "the liveness probe", p.probeURL(t, c.LivenessProbe), 200, time.Second)
	await(t, "the readiness probe", p.probeURL(t, c.ReadinessProbe), 200, waitFor)
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(cmdline), "pa\"ss") || strings.Contains(string(cmdline), "t0k3n") {
		t.Errorf("a secret on the command line: %q", cmdline)
	}
}

// swapRules changes the rules ConfigMap as the kubelet does: a limit of
// 1 a minute is in force without a restart; then a broken file is
// refused, and that limit stays.
func swapRules(t *testing.T, p *pod, cm *corev1.ConfigMap) {
	t.Helper()
	dir := p.mount["/etc/sluice/rules"]
	name := ""
	for n := range cm.Data {
		name = n
	}
	http := p.ports[8080]
	body := `{"domain":"swap","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}`
	kubeletVolume(t, dir, map[string]string{name: "domain: swap\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"})
	deadline := time.Now().Add(waitFor)
	for {
		code, out := httpDo(t, "POST", "http://"+http+"/json", body)
		if code == 429 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new rules are not in force within %v: %d %s", waitFor, code, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	kubeletVolume(t, dir, map[string]string{name: "domain: swap\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: one}\n"})
	deadline = time.Now().Add(waitFor)
	for !strings.Contains(p.log(), "requests_per_unit") {
		if time.Now().After(deadline) {
			t.Fatalf("the broken rules are not refused within %v (no log line names the problem)", waitFor)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, out := httpDo(t, "POST", "http://"+http+"/json", body); code != 429 {
		t.Errorf("after a broken ConfigMap: %d %s, want 429 from the last good rules", code, out)
	}
	if code, out := httpDo(t, "GET", "http://"+http+"/readyz", ""); code != 200 {
		t.Errorf("after a broken ConfigMap: /readyz %d %s, want 200 (the last good rules serve)", code, out)
	}
}

// drain sends SIGTERM: readiness fails at once (within a second) while
// the process still lives, and it exits 0 within the pod's
// terminationGracePeriodSeconds.
func drain(t *testing.T, p *pod) {
	t.Helper()
	grace := time.Duration(*p.spec.TerminationGracePeriodSeconds) * time.Second
	ready := p.probeURL(t, p.c.ReadinessProbe)
	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if drain := flagSeconds(p.c.Args, "drain-delay", 0); drain >= 2 {
		await(t, "readiness while draining", ready, 503, time.Second)
	}
	if code := p.wait(t, grace); code != 0 {
		t.Errorf("exit %d on SIGTERM, want 0", code)
	}
	t.Logf("stopped %v after SIGTERM (grace %v)", time.Since(start).Round(100*time.Millisecond), grace)
}
