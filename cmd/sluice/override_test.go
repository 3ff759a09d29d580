package main

import (
	"os"
	"strings"
	"testing"
)

// TestOverrideSetFlagErrors: sluice override set checks the override
// before it asks the server (none listens here), and each error names
// the flag at fault and says what is wrong in words: a --limit that is
// missing, not JSON, not an object, without requests_per_unit, or with
// a setting that has no effect; a --path with a misplaced wildcard.
//
// The errors docs/overrides.md shows (doc) are there word for word.
func TestOverrideSetFlagErrors(t *testing.T) {
	tokens := writeFile(t, "tokens", "ops:0123456789abcdef0123456789abcdef\n")
	doc, err := os.ReadFile("../../docs/overrides.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path, limit string
		want        []string
		doc         bool
	}{
		{"user=a", "", []string{"--limit is required"}, false},
		{"user=a", "{unit:minute}", []string{"--limit is not valid JSON", "double quotes"}, true},
		{"user=a", `[1]`, []string{"--limit is [1], not a JSON object"}, false},
		{"user=a", `{"unit":"minute"}`, []string{"--limit", "requests_per_unit is missing", `{"blocked": true}`}, true},
		{"user=a", `{"unit":"minute","requests_per_unit":5,"burst":3}`, []string{"--limit", "burst has no effect"}, false},
		{"user=a", `{"unit":"fortnight","requests_per_unit":5}`, []string{"--limit", "fortnight"}, false},
		{"user=a*b", `{"unit":"minute","requests_per_unit":5}`, []string{"--path (path[0].value)", "wildcard"}, true},
		{"user", `{"unit":"minute","requests_per_unit":5}`, []string{"--path", "not key=value"}, false},
	} {
		code, _, errOut := runCmd(t, "", "override", "set", "--server", "http://127.0.0.1:1", "--token-file", tokens, "--domain", "api", "--path", c.path, "--limit", c.limit)
		if code != 1 || strings.Contains(errOut, "127.0.0.1:1") {
			t.Errorf("--path %s --limit %s: exit %d, %q; want exit 1 before asking the server", c.path, c.limit, code, errOut)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("--path %s --limit %s: %q, want it to say %q", c.path, c.limit, errOut, w)
			}
		}
		if line := strings.TrimSpace(errOut); c.doc && !strings.Contains(string(doc), "\n"+line+"\n") {
			t.Errorf("docs/overrides.md does not show the error of --path %s --limit %s:\n%s", c.path, c.limit, line)
		}
	}
}
