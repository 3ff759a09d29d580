package httplimit_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/httplimit"
)

// TestFeatureCombinations: the features are stages of one pipeline, and
// the combinations in which two would own the same slot (the decision,
// the response) are refused when the middleware is built, naming both;
// the others are built.
func TestFeatureCombinations(t *testing.T) {
	d := decider(t, tokenRules)
	shaping := &httplimit.Shaping{MaxDelay: time.Second}
	failures := &httplimit.Failures{Descriptors: []httplimit.Descriptor{{{Key: "k", Source: httplimit.Header("X-K")}}}, Statuses: []int{401}}
	conc := &httplimit.Concurrency{Max: 2}
	for name, tc := range map[string]struct {
		cfg  httplimit.Config
		want string // the error's words; empty: built
	}{
		"tokens and shaping":           {httplimit.Config{Tokens: ptr(tokenBudget()), Shaping: shaping}, "Tokens cannot be combined with Shaping"},
		"tokens and failures":          {httplimit.Config{Tokens: ptr(tokenBudget()), Failures: failures}, "Tokens cannot be combined with Failures"},
		"tokens, shaping and failures": {httplimit.Config{Tokens: ptr(tokenBudget()), Shaping: shaping, Failures: failures}, "Tokens cannot be combined with Shaping"},
		"tokens and concurrency":       {httplimit.Config{Tokens: ptr(tokenBudget()), Concurrency: conc}, ""},
		"shaping and failures":         {httplimit.Config{Shaping: shaping, Failures: failures, Concurrency: conc}, ""},
		"each alone":                   {httplimit.Config{}, ""},
	} {
		cfg := tc.cfg
		cfg.Decider, cfg.Domain = d, "llm"
		_, err := httplimit.New(cfg)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want it built", name, err)
		case tc.want != "" && (!errors.Is(err, httplimit.ErrConfig) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want ErrConfig saying %q", name, err, tc.want)
		}
	}
}
