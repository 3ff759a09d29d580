// Package deploy holds the files to run sluice with the tools people
// already have and their tests: the image (image/, built by
// scripts/image; image_test.go), Kubernetes manifests and a Helm chart
// (kubernetes/, helm/; kube_test.go and pod_test.go), Prometheus alerting
// rules and a Grafana dashboard (promtool checks and unit-tests the rules,
// and every query of the dashboard is valid PromQL over metrics sluice
// exports).
package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/testsupport/testpart"
)

// promtool returns promtool's path (testpart: missing, it fails the test
// in CI and skips it elsewhere).
func promtool(t *testing.T) string {
	return testpart.Program(t, "apt-get install prometheus", "promtool")
}

func run(t *testing.T, dir string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestAlertRules: the alert rules pass promtool check rules, and their
// unit tests (each alert fires on the series that should fire it, and not
// before) pass promtool test rules.
func TestAlertRules(t *testing.T) {
	p := promtool(t)
	dir := filepath.Join("prometheus")
	if out := run(t, dir, p, "check", "rules", "sluice-alerts.yml"); !strings.Contains(out, "SUCCESS: 8 rules found") {
		t.Errorf("promtool check rules: %s", out)
	}
	if out := run(t, dir, p, "test", "rules", "sluice-alerts_test.yml"); !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules: %s", out)
	}
	data, err := os.ReadFile(filepath.Join(dir, "sluice-alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	known := metricNames(t)
	for _, m := range regexp.MustCompile(`sluice_[a-z0-9_]+`).FindAllString(string(data), -1) {
		if !known[m] {
			t.Errorf("an alert reads %s, which no doc lists", m)
		}
	}
}

// metricNames are the sluice_ names the docs say sluice exports.
func metricNames(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	re := regexp.MustCompile(`sluice_[a-z0-9_]+`)
	for _, doc := range []string{"operations.md", "leases.md", "observability.md", "redis.md"} {
		data, err := os.ReadFile(filepath.Join("..", "docs", doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllString(string(data), -1) {
			names[m] = true
		}
	}
	return names
}

// TestGrafanaDashboard: the dashboard is JSON with panels, every query is
// valid PromQL (promtool checks them as recording rules), and every
// metric it reads is one the docs list.
func TestGrafanaDashboard(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("grafana", "sluice-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string
		Panels []struct {
			Type    string
			Title   string
			GridPos struct{ X, Y, W, H int }
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	if dash.Title == "" || len(dash.Panels) < 10 {
		t.Fatalf("dashboard %q with %d panels", dash.Title, len(dash.Panels))
	}
	known := metricNames(t)
	re := regexp.MustCompile(`sluice_[a-z0-9_]+`)
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	n := 0
	for i, p := range dash.Panels {
		// A row heads the panels below it and has no query of its own.
		if p.Type == "row" && len(p.Targets) != 0 {
			t.Errorf("row %q has queries", p.Title)
		}
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		// No panel covers another.
		a := p.GridPos
		if a.W <= 0 || a.H <= 0 || a.X < 0 || a.X+a.W > 24 {
			t.Errorf("panel %q at %+v, outside Grafana's 24 columns", p.Title, a)
		}
		for _, q := range dash.Panels[:i] {
			if b := q.GridPos; a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H {
				t.Errorf("panel %q at %+v overlaps %q at %+v", p.Title, a, q.Title, b)
			}
		}
		for _, tg := range p.Targets {
			for _, m := range re.FindAllString(tg.Expr, -1) {
				base := strings.TrimSuffix(m, "_bucket")
				if !known[m] && !known[base] {
					t.Errorf("panel %q reads %s, which no doc lists", p.Title, m)
				}
			}
			// Grafana's variables, as Prometheus would see them.
			expr := strings.ReplaceAll(tg.Expr, "$rule", ".*")
			q, _ := json.Marshal(expr)
			n++
			rules.WriteString("      - record: dashboard:query_" + strconv.Itoa(n) + "\n        expr: " + string(q) + "\n")
		}
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "dashboard-queries.yml")
	if err := os.WriteFile(file, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := run(t, dir, promtool(t), "check", "rules", file); !strings.Contains(out, "SUCCESS") {
		t.Errorf("the dashboard's queries: %s", out)
	}
}
