package deploy

// The Kubernetes manifests (deploy/kubernetes) and the Helm chart
// (deploy/helm/sluice): every object decoded strictly into the Kubernetes
// API's own types (an unknown or misspelled field fails), the chart
// linted and rendered by Helm (pinned in tools/go.mod), the pods'
// security settings and secrets checked, and the probes requested of the
// binary started with the rendered arguments and environment.

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/sluicehq/sluice/internal/edges/httpconf"
	"github.com/sluicehq/sluice/rules"
)

var update = flag.Bool("update", false, "rewrite the chart's values table in deploy/helm/sluice/README.md")

// kustomization is what the manifests' kustomization.yaml files use of
// kustomize's Kustomization.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
}

// kinds maps apiVersion/kind to a new object of the API's type.
var kinds = map[string]func() any{
	"v1/ServiceAccount":                             func() any { return &corev1.ServiceAccount{} },
	"v1/ConfigMap":                                  func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                                     func() any { return &corev1.Secret{} },
	"v1/Service":                                    func() any { return &corev1.Service{} },
	"apps/v1/Deployment":                            func() any { return &appsv1.Deployment{} },
	"policy/v1/PodDisruptionBudget":                 func() any { return &policyv1.PodDisruptionBudget{} },
	"autoscaling/v2/HorizontalPodAutoscaler":        func() any { return &autoscalingv2.HorizontalPodAutoscaler{} },
	"monitoring.coreos.com/v1/ServiceMonitor":       func() any { return &monitoringv1.ServiceMonitor{} },
	"monitoring.coreos.com/v1/PrometheusRule":       func() any { return &monitoringv1.PrometheusRule{} },
	"kustomize.config.k8s.io/v1beta1/Kustomization": func() any { return &kustomization{} },
}

// object is one decoded document.
type object struct {
	kind, name string // Kind, metadata.name
	v          any
}

// decodeStrict decodes every YAML document of data into its API type,
// refusing unknown and duplicate fields and unknown kinds.
func decodeStrict(data []byte) ([]object, error) {
	var out []object
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return nil, fmt.Errorf("document %d: %v", i+1, err)
		}
		newObj, ok := kinds[meta.APIVersion+"/"+meta.Kind]
		if !ok {
			return nil, fmt.Errorf("document %d: unknown kind %s/%s", i+1, meta.APIVersion, meta.Kind)
		}
		v := newObj()
		if err := unmarshalStrict([]byte(doc), v); err != nil {
			return nil, fmt.Errorf("document %d (%s %s): %v", i+1, meta.Kind, meta.Metadata.Name, err)
		}
		out = append(out, object{meta.Kind, meta.Metadata.Name, v})
	}
	return out, nil
}

// unmarshalStrict decodes YAML as the API server decodes with
// fieldValidation=Strict: field names matched case-sensitively (plain
// encoding/json, and so sigs.k8s.io/yaml's UnmarshalStrict, takes
// targetport for targetPort), unknown and duplicate fields refused.
func unmarshalStrict(doc []byte, v any) error {
	data, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(data, v, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// TestDecodeStrictRefuses: the strict decoding the tests rely on refuses a
// misspelled field, a field in the wrong place and an unknown kind.
func TestDecodeStrictRefuses(t *testing.T) {
	for _, doc := range []string{
		"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  template:\n    spec:\n      terminationGracePeriodSecond: 30\n",
		"apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  ports: [{name: http, port: 80, targetport: http}]\n",
		"apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {}\nreplicas: 1\n",
		"apiVersion: v1\nkind: Servise\nmetadata: {name: x}\n",
	} {
		if _, err := decodeStrict([]byte(doc)); err == nil {
			t.Errorf("decoded without error:\n%s", doc)
		}
	}
}

// manifestDirs are the kustomizations of deploy/kubernetes.
var manifestDirs = []string{"kubernetes", "kubernetes/proxy", "kubernetes/monitoring"}

// manifests decodes the files of the kustomization in dir.
func manifests(t *testing.T, dir string) []object {
	t.Helper()
	k := readObjects(t, filepath.Join(dir, "kustomization.yaml"))
	kust := k[0].v.(*kustomization)
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	var listed []string
	var objs []object
	for _, r := range kust.Resources {
		listed = append(listed, filepath.Join(dir, r))
		objs = append(objs, readObjects(t, filepath.Join(dir, r))...)
	}
	for _, f := range files {
		if filepath.Base(f) != "kustomization.yaml" && !slices.Contains(listed, f) {
			t.Errorf("%s is not among the resources of %s/kustomization.yaml", f, dir)
		}
	}
	return objs
}

func readObjects(t *testing.T, path string) []object {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeStrict(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return objs
}

// TestManifests: every manifest decodes strictly, each kustomization lists
// every file beside it, and every Deployment passes checkPod.
func TestManifests(t *testing.T) {
	for _, dir := range manifestDirs {
		for _, o := range manifests(t, dir) {
			if d, ok := o.v.(*appsv1.Deployment); ok {
				checkPod(t, dir+": Deployment "+o.name, d)
			}
		}
	}
}

// checkPod checks a Deployment's pod: the restricted security context,
// the three probes on a named port of the container, a grace period that
// covers the drain, and no secret on the command line.
func checkPod(t *testing.T, what string, d *appsv1.Deployment) {
	t.Helper()
	spec := d.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("%s: %d containers, want 1", what, len(spec.Containers))
	}
	c := spec.Containers[0]
	checkSecurity(t, what, spec)
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s: no HTTP %s probe", what, name)
		} else if containerPort(c, p.HTTPGet.Port.String()) == 0 {
			t.Errorf("%s: the %s probe's port %s is none of the container's", what, name, p.HTTPGet.Port.String())
		}
	}
	drain, shutdown := flagSeconds(c.Args, "drain-delay", 0), flagSeconds(c.Args, "shutdown-timeout", 10)
	if spec.TerminationGracePeriodSeconds == nil || float64(*spec.TerminationGracePeriodSeconds) < drain+shutdown+1 {
		t.Errorf("%s: terminationGracePeriodSeconds %v does not cover --drain-delay %vs and --shutdown-timeout %vs", what, spec.TerminationGracePeriodSeconds, drain, shutdown)
	}
	checkSecrets(t, what, c)
}

// checkSecurity checks the pod's and its container's security context:
// non-root 65534, seccomp RuntimeDefault, no service account token, a
// read-only root, no privilege escalation, every capability dropped.
func checkSecurity(t *testing.T, what string, spec corev1.PodSpec) {
	t.Helper()
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != nobody ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: the pod's security context is not runAsNonRoot, runAsUser 65534, seccomp RuntimeDefault: %+v", what, psc)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("%s: mounts a service account token it does not need", what)
	}
	sc := spec.Containers[0].SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Errorf("%s: the container's security context is not read-only, without privilege escalation, all capabilities dropped: %+v", what, sc)
	}
}

// checkSecrets fails t for a secret on the container's command line, or
// a secret variable not taken from a Secret.
func checkSecrets(t *testing.T, what string, c corev1.Container) {
	t.Helper()
	for _, a := range c.Args {
		if regexp.MustCompile(`(?i)password|redis-url|token=|://[^/]*@`).MatchString(strings.TrimPrefix(a, "--admin-token-file")) {
			t.Errorf("%s: a secret on the command line: %q", what, a)
		}
	}
	for _, e := range c.Env {
		secret := strings.Contains(e.Name, "REDIS_URL") || strings.Contains(e.Name, "PASSWORD") || strings.Contains(e.Name, "TOKEN")
		if secret && (e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
			t.Errorf("%s: %s is not taken from a Secret", what, e.Name)
		}
	}
}

// containerPort is the number of the container's port name (or number).
func containerPort(c corev1.Container, port string) int32 {
	for _, p := range c.Ports {
		if p.Name == port || strconv.Itoa(int(p.ContainerPort)) == port {
			return p.ContainerPort
		}
	}
	return 0
}

// flagSeconds reads --name=Ns from args, def when absent.
func flagSeconds(args []string, name string, def float64) float64 {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			n, err := strconv.ParseFloat(strings.TrimSuffix(v, "s"), 64)
			if err == nil {
				return n
			}
		}
	}
	return def
}

// TestAlertRulesEverywhere: the PrometheusRule of the manifests and the
// chart's copy hold exactly the rules of deploy/prometheus/sluice-alerts.yml,
// which promtool tests.
func TestAlertRulesEverywhere(t *testing.T) {
	want := alertRules(t)
	data, err := os.ReadFile("prometheus/sluice-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range manifests(t, "kubernetes/monitoring") {
		if r, ok := o.v.(*monitoringv1.PrometheusRule); ok && !reflect.DeepEqual(r.Spec, want) {
			t.Errorf("kubernetes/monitoring: the PrometheusRule differs from prometheus/sluice-alerts.yml")
		}
	}
	chart, err := os.ReadFile("helm/sluice/files/sluice-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(chart, data) {
		t.Errorf("helm/sluice/files/sluice-alerts.yml differs from prometheus/sluice-alerts.yml: copy it")
	}
}

// alertRules are the rules of prometheus/sluice-alerts.yml.
func alertRules(t *testing.T) monitoringv1.PrometheusRuleSpec {
	t.Helper()
	var rules monitoringv1.PrometheusRuleSpec
	data, err := os.ReadFile("prometheus/sluice-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := unmarshalStrict(data, &rules); err != nil {
		t.Fatal(err)
	}
	return rules
}

var helmBuild struct {
	once sync.Once
	path string
	err  error
}

// helm builds Helm from its Go module, pinned in tools/go.mod, once.
func helm(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds Helm")
	}
	helmBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "sluice-helm-")
		if err != nil {
			helmBuild.err = err
			return
		}
		helmBuild.path = filepath.Join(dir, "helm")
		cmd := exec.Command("go", "build", "-modfile=tools/go.mod", "-o", helmBuild.path, "helm.sh/helm/v3/cmd/helm")
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			helmBuild.err = fmt.Errorf("building helm: %v\n%s", err, out)
		}
	})
	if helmBuild.err != nil {
		t.Fatal(helmBuild.err)
	}
	return helmBuild.path
}

// helmRun runs helm with a home of its own (Helm writes its cache and
// config there), and returns its output.
func helmRun(t *testing.T, args ...string) (string, error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(helm(t), args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

// chartCases are the value sets the chart is rendered with.
var chartCases = []struct {
	name string
	set  []string
}{
	{"serve", nil},
	{"serve-memory", []string{"store=memory"}},
	{"serve-all", []string{"admin.enabled=true", "autoscaling.enabled=true", "serviceMonitor.enabled=true", "prometheusRule.enabled=true"}},
	{"proxy", []string{"mode=proxy", "store=memory", "podDisruptionBudget.enabled=false"}},
}

// renderChart renders the chart with helm template and the --set values.
func renderChart(t *testing.T, set ...string) []object {
	t.Helper()
	args := []string{"template", "sluice", "helm/sluice"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := helmRun(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeStrict([]byte(out))
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", set, err, out)
	}
	return objs
}

// TestHelmChart: helm lint passes; each value set renders objects that
// decode strictly and whose Deployment passes checkPod; autoscaling leaves
// the replicas to the autoscaler; bad values are refused with a message.
func TestHelmChart(t *testing.T) {
	if out, err := helmRun(t, "lint", "--strict", "helm/sluice"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, c := range chartCases {
		objs := renderChart(t, c.set...)
		var list []string
		for _, o := range objs {
			list = append(list, o.kind+"/"+o.name)
			switch v := o.v.(type) {
			case *monitoringv1.PrometheusRule:
				if !reflect.DeepEqual(v.Spec, alertRules(t)) {
					t.Errorf("%s: the PrometheusRule differs from prometheus/sluice-alerts.yml", c.name)
				}
			case *appsv1.Deployment:
				checkPod(t, c.name, v)
				if slices.Contains(c.set, "autoscaling.enabled=true") != (v.Spec.Replicas == nil) {
					t.Errorf("%s: replicas %v with autoscaling %v", c.name, v.Spec.Replicas, slices.Contains(c.set, "autoscaling.enabled=true"))
				}
			}
		}
		t.Logf("%s: %s", c.name, strings.Join(list, " "))
	}
	for _, bad := range [][]string{{"mode=serv"}, {"store=memcache"}, {"mode=proxy", "admin.enabled=true"}} {
		args := []string{"template", "sluice", "helm/sluice"}
		for _, s := range bad {
			args = append(args, "--set", s)
		}
		if _, err := helmRun(t, args...); err == nil {
			t.Errorf("helm template --set %v: no error", bad)
		}
	}
}

// TestHelmValuesRefused: values.schema.json refuses, at helm template
// (and so at lint, install and upgrade), each value that rendered a pod
// that could not run or did what the user did not ask: replicas that are
// not a count, negative or textual durations (drainDelaySeconds "5s"
// rendered --drain-delay=5ss), a newline in a string that lands in the
// arguments (extra flags injected) or in the image, a password in
// proxy.upstream (it would show in the pod's spec), a rules file sluice
// would not read (hidden, or not *.yaml), a misspelled value.
func TestHelmValuesRefused(t *testing.T) {
	for _, c := range []struct{ values, want string }{
		{"replicaCount: -1", "/replicaCount"},
		{"replicaCount: abc", "/replicaCount"},
		{"drainDelaySeconds: -40", "/drainDelaySeconds"},
		{"shutdownTimeoutSeconds: -30", "/shutdownTimeoutSeconds"},
		{`drainDelaySeconds: "5s"`, "/drainDelaySeconds"},
		{"proxy: {upstream: \"http://api:8080\\n- --debug-addr=0.0.0.0:6060\"}", "/proxy/upstream"},
		{"proxy: {upstream: \"http://user:s3cret@api:8080\"}", "/proxy/upstream"},
		{"proxy: {upstream: \"api:8080\"}", "/proxy/upstream"},
		{"image: {tag: \"1.0\\n  imagePullPolicy: Always\"}", "/image/tag"},
		{"image: {repository: \"registry/sluice extra\"}", "/image/repository"},
		{"extraArgs: [\"--log-level=debug\\n- --debug-addr=0.0.0.0:6060\"]", "/extraArgs/0"},
		{"autoscaling: {enabled: true, minReplicas: 0}", "/autoscaling/minReplicas"},
		{"redis: {existingSecret: \"Bad Name\"}", "/redis/existingSecret"},
		{"rules: {rules.yaml: \"\"}", "/rules/rules.yaml"},
		{"rules: {\"../x.yaml\": \"domain: d\"}", "'../x.yaml' does not match"},
		{"rules: {\".hidden.yaml\": \"domain: d\"}", "'.hidden.yaml' does not match"},
		{"rules: {\"rules\": \"domain: d\"}", "'rules' does not match"},
		{"replicas: 3", "replicas"},
	} {
		file := filepath.Join(t.TempDir(), "values.yaml")
		if err := os.WriteFile(file, []byte(c.values+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := helmRun(t, "template", "sluice", "helm/sluice", "-f", file)
		if err == nil || !strings.Contains(err.Error(), "schema") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want the schema to refuse %s\n%s", c.values, err, c.want, out)
		}
	}
	// What the schema takes renders quoted: a string value cannot end a
	// YAML scalar early.
	file := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(file, []byte("mode: proxy\nproxy: {upstream: \"https://api.example:8443/v1/x#y\"}\nimage: {tag: \"1.2.3\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := helmRun(t, "template", "sluice", "helm/sluice", "-f", file)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`- "--upstream=https://api.example:8443/v1/x#y"`, `image: "localhost/sluice:1.2.3"`} {
		if !strings.Contains(out, want) {
			t.Errorf("rendered without %s:\n%s", want, out)
		}
	}
}

// TestHelmProxyRulesMatchRoutes: in mode proxy, the rules of the chart's
// ConfigMap (its first file, which the proxy reads) limit what each of
// the proxy's routes sends: with no http section, the default route's
// client address (remote_address). A rules file whose keys no route sends
// limits nothing.
func TestHelmProxyRulesMatchRoutes(t *testing.T) {
	for _, set := range [][]string{{"mode=proxy"}, {"mode=proxy", "store=memory"}} {
		objs := renderChart(t, set...)
		var args []string
		var data map[string]string
		for _, o := range objs {
			switch v := o.v.(type) {
			case *appsv1.Deployment:
				args = v.Spec.Template.Spec.Containers[0].Args
			case *corev1.ConfigMap:
				data = v.Data
			}
		}
		var config string
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--config=/etc/sluice/rules/"); ok {
				config = v
			}
		}
		if data[config] == "" {
			t.Fatalf("%v: --config names %q, not a file of the ConfigMap (%v)", set, config, slices.Collect(maps.Keys(data)))
		}
		if unlimited := proxyRoutesUnlimited(t, data[config]); len(unlimited) > 0 {
			t.Errorf("%v: the rules limit nothing the proxy's routes send: %v\n%s", set, unlimited, data[config])
		}
	}
	// The check sees a mismatch: the chart's old default, user alone.
	old := "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n"
	if got := proxyRoutesUnlimited(t, old); len(got) != 1 {
		t.Errorf("rules of user alone: unlimited routes %v, want the default route", got)
	}
}

// proxyRoutesUnlimited loads a proxy's rules file as sluice proxy does
// and returns the routes whose descriptors (the client's address for a
// route without any) match no limit of the rules.
func proxyRoutesUnlimited(t *testing.T, file string) []string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, sec, err := httpconf.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if sec == nil {
		sec = httpconf.Default()
	}
	domain := cfg.Domains()[0]
	var unlimited []string
	for _, r := range sec.Routes {
		descs := []rules.Descriptor{{Entries: []rules.Entry{{Key: "remote_address", Value: "203.0.113.7"}}, Cost: 1}}
		if len(r.Descriptors) > 0 {
			descs = descs[:0]
			for _, d := range r.Descriptors {
				var es []rules.Entry
				for _, e := range d {
					if e.Key == "" {
						t.Fatalf("route %s: an entry without a key, which this check cannot name", r.Name)
					}
					es = append(es, rules.Entry{Key: e.Key, Value: "v"})
				}
				descs = append(descs, rules.Descriptor{Entries: es, Cost: 1})
			}
		}
		var p rules.Plan
		if err := cfg.Plan(domain, descs, &p); err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(p.Matches, func(m rules.Match) bool { return m.Status == rules.Limited }) {
			unlimited = append(unlimited, r.Name)
		}
	}
	return unlimited
}

// TestHelmValuesTable: the chart's README documents every value, in a
// table made from the "# --" comments of values.yaml (go test -update
// writes it).
func TestHelmValuesTable(t *testing.T) {
	values, err := os.ReadFile("helm/sluice/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	table := valuesTable(t, string(values))
	const begin, end = "<!-- values: made from values.yaml by go test ./deploy -run TestHelmValuesTable -update -->\n", "<!-- end of values -->\n"
	readme, err := os.ReadFile("helm/sluice/README.md")
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok1 := strings.Cut(string(readme), begin)
	_, after, ok2 := strings.Cut(rest, end)
	if !ok1 || !ok2 {
		t.Fatalf("helm/sluice/README.md has no %q ... %q section", begin, end)
	}
	want := before + begin + table + end + after
	if want == string(readme) {
		return
	}
	if *update {
		if err := os.WriteFile("helm/sluice/README.md", []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("helm/sluice/README.md's values table is not values.yaml's: go test ./deploy -run TestHelmValuesTable -update")
}

// valuesTable makes the Markdown table of values.yaml: each key whose line
// follows a "# -- text" comment, with its full path, its default and the
// text. A key holding a map of values is a heading for those below it.
func valuesTable(t *testing.T, values string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("| value | default | what it does |\n|---|---|---|\n")
	var path []string
	doc := ""
	keyLine := regexp.MustCompile(`^( *)([A-Za-z0-9_]+):(.*)$`)
	lines := strings.Split(values, "\n")
	skip := -1 // the indent of a documented key whose block is its default
	for i, line := range lines {
		if indent := len(line) - len(strings.TrimLeft(line, " ")); skip >= 0 && strings.TrimSpace(line) != "" {
			if indent > skip {
				continue
			}
			skip = -1
		}
		if c, ok := strings.CutPrefix(strings.TrimSpace(line), "# -- "); ok {
			doc = c
			continue
		}
		m := keyLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		depth := len(m[1]) / 2
		path = append(path[:min(depth, len(path))], m[2])
		if doc == "" {
			if strings.TrimSpace(m[3]) != "" || i+1 < len(lines) && !strings.HasPrefix(lines[i+1], m[1]+"  ") {
				t.Errorf("values.yaml: %s has no \"# --\" comment", strings.Join(path, "."))
			}
			continue
		}
		def := strings.TrimSpace(m[3])
		if def == "|" || def == "" {
			def, skip = "(see values.yaml)", len(m[1])
		}
		fmt.Fprintf(&b, "| `%s` | `%s` | %s |\n", strings.Join(path, "."), def, strings.ReplaceAll(doc, "|", "\\|"))
		doc = ""
	}
	return b.String()
}
