package rules_test

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/rules"
)

func TestAllOrNothingKey(t *testing.T) {
	for _, c := range []struct {
		src  string
		want string // "nil", "true", "false", or a problem
	}{
		{"domain: a\n", "nil"},
		{"domain: a\nall_or_nothing: true\n", "true"},
		{"domain: a\nall_or_nothing: no\n", "false"},
		{"domain: a\nall_or_nothing: sometimes\n", `2:17: all_or_nothing must be true or false, got the string "sometimes"`},
	} {
		d, err := rules.Parse("f.yaml", []byte(c.src))
		got := "nil"
		switch {
		case err != nil:
			got = err.Error()
		case d.AllOrNothing != nil && *d.AllOrNothing:
			got = "true"
		case d.AllOrNothing != nil:
			got = "false"
		}
		if !strings.Contains(got, c.want) {
			t.Errorf("%q: %s, want %s", c.src, got, c.want)
		}
	}
}
