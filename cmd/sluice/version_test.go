package main

import (
	"os/exec"
	"runtime/debug"
	"strings"
	"testing"
)

func TestDescribeBuild(t *testing.T) {
	settings := func(kv ...string) []debug.BuildSetting {
		var s []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			s = append(s, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return s
	}
	for _, tc := range []struct {
		linked string
		bi     debug.BuildInfo
		want   string
	}{
		{"v1.2.3", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "v1.2.3"},
		{"dev", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "dev"},
		{"dev", debug.BuildInfo{Main: debug.Module{Version: "v1.4.0"}}, "v1.4.0"},
		{"dev", debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261201231000-0123456789ab+dirty"},
			Settings: settings("vcs.revision", "0123456789abcdef0123", "vcs.time", "2026-12-01T23:10:00Z", "vcs.modified", "true")},
			"v0.0.0-20261201231000-0123456789ab+dirty (revision 0123456789ab, 2026-12-01T23:10:00Z, modified)"},
		{"v2.0.0", debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
			Settings: settings("vcs.revision", "0123456789abcdef0123", "vcs.modified", "false")},
			"v2.0.0 (revision 0123456789ab)"},
	} {
		if got := describeBuild(tc.linked, &tc.bi); got != tc.want {
			t.Errorf("describeBuild(%q, %v) = %q, want %q", tc.linked, tc.bi.Main.Version, got, tc.want)
		}
	}
}

// TestVersionE2E: a binary built from a git clone says which commit.
func TestVersionE2E(t *testing.T) {
	beside(t)
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skip("not in a git clone: the build embeds no revision")
	}
	out, err := exec.Command(sluiceBinary(t), "version").CombinedOutput()
	if err != nil {
		t.Fatalf("sluice version: %v\n%s", err, out)
	}
	want := "revision " + string(head[:12])
	if !strings.HasPrefix(string(out), "sluice v") || !strings.Contains(string(out), want) {
		t.Errorf("sluice version = %q, want a version and %q", out, want)
	}
}
