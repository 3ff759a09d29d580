package simulate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/decision/ratelimitheaders"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
)

type line struct {
	At          json.RawMessage `json:"at"`
	OverallCode string          `json:"overallCode"`
	Statuses    []struct {
		Code           string `json:"code"`
		LimitRemaining int    `json:"limitRemaining"`
	} `json:"statuses"`
}

func decode(t *testing.T, out string) []line {
	t.Helper()
	var lines []line
	for _, s := range strings.Split(strings.TrimSpace(out), "\n") {
		var l line
		if err := json.Unmarshal([]byte(s), &l); err != nil {
			t.Fatalf("output line %q: %v", s, err)
		}
		lines = append(lines, l)
	}
	return lines
}

// The classic worked example: 3 per minute with a discrete refill of 3 every
// minute. Requests at 10:00:00, :10, :35 pass, :45 is denied, 10:01:00 passes.
func TestDiscreteRefillWorkedExample(t *testing.T) {
	cfg := rulestest.Config(t, `
domain: auth
descriptors:
  - key: login
    rate_limit: {algorithm: token_bucket, unit: minute, requests_per_unit: 3, burst: 3, refill_interval: 1m}
`)
	var trace strings.Builder
	for _, at := range []string{"10:00:00", "10:00:10", "10:00:35", "10:00:45", "10:01:00"} {
		trace.WriteString(`{"at":"2026-03-01T` + at + `Z","domain":"auth","descriptors":[{"entries":[{"key":"login","value":"kristie"}]}]}` + "\n")
	}
	var out bytes.Buffer
	sum, err := Run(context.Background(), cfg, strings.NewReader(trace.String()), &out)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"OK", "OK", "OK", "OVER_LIMIT", "OK"}
	got := decode(t, out.String())
	if len(got) != len(want) {
		t.Fatalf("%d output lines, want %d", len(got), len(want))
	}
	for i, l := range got {
		if l.OverallCode != want[i] || l.Statuses[0].Code != want[i] {
			t.Errorf("request %d at %s: %s/%s, want %s", i, l.At, l.OverallCode, l.Statuses[0].Code, want[i])
		}
	}
	if sum.Requests != 5 || sum.Allowed != 4 || sum.Denied != 1 {
		t.Errorf("summary %+v", sum)
	}
	if len(sum.Rules) != 1 || sum.Rules[0].StatKey != "auth.login" || sum.Rules[0].Allowed != 4 || sum.Rules[0].Denied != 1 {
		t.Errorf("rule summary %+v", sum.Rules)
	}
	if string(got[0].At) != `"2026-03-01T10:00:00Z"` {
		t.Errorf("at echoed as %s", got[0].At)
	}
}

// A post rejected by the per-second limit does not burn the per-day quota,
// and shadow-mode denials are counted apart and let through.
func TestAllOrNothingAndShadow(t *testing.T) {
	cfg := rulestest.Config(t, `
domain: d
descriptors:
  - key: post
    rate_limits:
      - {unit: second, requests_per_unit: 1}
      - {unit: day, requests_per_unit: 2}
  - key: probe
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
`)
	trace := `{"at":0,"domain":"d","descriptors":[{"entries":[{"key":"post","value":"a"}]}]}
{"at":100,"domain":"d","descriptors":[{"entries":[{"key":"post","value":"a"}]}]}
{"at":200,"domain":"d","descriptors":[{"entries":[{"key":"post","value":"a"}]}]}
{"at":1000,"domain":"d","descriptors":[{"entries":[{"key":"post","value":"a"}]}]}
{"at":2000,"domain":"d","descriptors":[{"entries":[{"key":"post","value":"a"}]}]}
{"at":3000,"domain":"d","descriptors":[{"entries":[{"key":"probe","value":"x"}]}]}
{"at":3001,"domain":"d","descriptors":[{"entries":[{"key":"probe","value":"x"}]}]}
`
	var out bytes.Buffer
	sum, err := RunOptions(context.Background(), cfg, strings.NewReader(trace), &out, Options{AllOrNothing: true})
	if err != nil {
		t.Fatal(err)
	}
	// Two denials within the first second consume nothing, so the day
	// quota of 2 admits the request at 1s and denies the one at 2s.
	want := []string{"OK", "OVER_LIMIT", "OVER_LIMIT", "OK", "OVER_LIMIT", "OK", "OK"}
	for i, l := range decode(t, out.String()) {
		if l.OverallCode != want[i] {
			t.Errorf("request %d: %s, want %s", i, l.OverallCode, want[i])
		}
	}
	byKey := map[string]RuleStats{}
	for _, r := range sum.Rules {
		byKey[r.StatKey] = r
	}
	if r := byKey["d.probe"]; r.Allowed != 1 || r.ShadowDenied != 1 || r.Denied != 0 {
		t.Errorf("shadow rule stats %+v", r)
	}
	if r := byKey["d.post"]; r.Allowed != 2 || r.Denied != 3 {
		t.Errorf("post rule stats %+v", r)
	}
}

func TestMalformedLinesFailBeforeAnyOutput(t *testing.T) {
	cfg := rulestest.Config(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	good := `{"at":0,"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`
	for _, tc := range []struct {
		name, trace, want string
	}{
		{"garbage", good + "\nnot json\n", "line 2: not a JSON object"},
		{"no at", good + "\n\n" + `{"domain":"d","descriptors":[{"entries":[{"key":"k"}]}]}`, `line 3: missing "at"`},
		{"bad at", `{"at":"yesterday","domain":"d","descriptors":[{"entries":[{"key":"k"}]}]}`, "line 1: \"at\""},
		{"negative at", `{"at":-5,"domain":"d","descriptors":[{"entries":[{"key":"k"}]}]}`, "line 1: \"at\""},
		{"unknown field", `{"at":0,"domain":"d","descriptorz":[]}`, "line 1: not a RateLimitRequest"},
		{"no domain", good + "\n" + `{"at":0,"descriptors":[{"entries":[{"key":"k"}]}]}`, "line 2:"},
		{"no descriptors", `{"at":0,"domain":"d"}`, "line 1:"},
		{"empty key", `{"at":0,"domain":"d","descriptors":[{"entries":[{"key":""}]}]}`, "line 1:"},
		{"huge value", `{"at":0,"domain":"d","descriptors":[{"entries":[{"key":"k","value":"` + strings.Repeat("x", 10<<10) + `"}]}]}`, "line 1:"},
		{"huge cost", `{"at":0,"domain":"d","descriptors":[{"entries":[{"key":"k"}],"hitsAddend":"99999999999999999"}]}`, "line 1:"},
		{"negative hits", `{"at":0,"domain":"d","descriptors":[{"entries":[{"key":"k"}],"isNegativeHits":true}]}`, "line 1:"},
		{"two bad lines", "x\n" + good + "\ny\n", "line 3:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			_, err := Run(context.Background(), cfg, strings.NewReader(tc.trace), &out)
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
			var le *LineError
			if !errors.As(err, &le) {
				t.Errorf("error %v is not a *LineError", err)
			}
			if out.Len() != 0 {
				t.Errorf("partial output: %q", out.String())
			}
		})
	}
}

func TestHitsAddendAndPeek(t *testing.T) {
	cfg := rulestest.Config(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 10}\n")
	trace := `{"at":0,"domain":"d","descriptors":[{"entries":[{"key":"k"}]}],"hitsAddend":7}
{"at":1,"domain":"d","descriptors":[{"entries":[{"key":"k"}],"hitsAddend":"0"}]}
{"at":2,"domain":"d","descriptors":[{"entries":[{"key":"k"}],"hitsAddend":"4"}]}
{"at":3,"domain":"d","descriptors":[{"entries":[{"key":"k"}],"hitsAddend":"3"}]}
`
	for _, mode := range []struct {
		opt           Options
		wantCode      []string
		wantRemaining []int
	}{
		// All-or-nothing: the charge of 4 with 3 left is denied and
		// consumes nothing, so 3 more fit.
		{Options{AllOrNothing: true}, []string{"OK", "OK", "OVER_LIMIT", "OK"}, []int{3, 3, 3, 0}},
		// As envoyproxy/ratelimit (INCRBY): the charge of 4 counts, past
		// the limit, and the request after it is over the limit too.
		{Options{}, []string{"OK", "OK", "OVER_LIMIT", "OVER_LIMIT"}, []int{3, 3, 0, 0}},
	} {
		var out bytes.Buffer
		if _, err := RunOptions(context.Background(), cfg, strings.NewReader(trace), &out, mode.opt); err != nil {
			t.Fatal(err)
		}
		got := decode(t, out.String())
		for i, l := range got {
			if l.OverallCode != mode.wantCode[i] || l.Statuses[0].LimitRemaining != mode.wantRemaining[i] {
				t.Errorf("%+v, request %d: %s remaining %d, want %s remaining %d", mode.opt, i, l.OverallCode, l.Statuses[0].LimitRemaining, mode.wantCode[i], mode.wantRemaining[i])
			}
		}
	}
}

func FuzzReadTrace(f *testing.F) {
	f.Add([]byte(`{"at":"2017-07-12T03:00:00Z","domain":"auth","descriptors":[{"entries":[{"key":"user","value":"kristie"}]}],"hitsAddend":1}`))
	f.Add([]byte("{\"at\":1}\n\n{}"))
	f.Add([]byte(`{"at":1e3,"domain":"x"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		events, err := ReadTrace(bytes.NewReader(data), nil)
		if err != nil {
			var le *LineError
			if !errors.As(err, &le) {
				t.Fatalf("error without a line: %v", err)
			}
			if events != nil {
				t.Fatal("events returned with an error")
			}
			return
		}
		for _, ev := range events {
			if ev.Request == nil || ev.Line < 1 || len(ev.RawAt) == 0 {
				t.Fatalf("bad event %+v", ev)
			}
		}
	})
}

// The serve hooks apply: with global shadow mode the third request is OK
// overall, its descriptor still OVER_LIMIT; with the response headers each
// response carries them, and the let-through one no Retry-After.
func TestShadowModeAndHeaders(t *testing.T) {
	cfg := rulestest.Config(t, `
domain: auth
descriptors:
  - key: login
    rate_limit: {unit: minute, requests_per_unit: 2}
`)
	var trace strings.Builder
	for _, at := range []string{"10:00:00", "10:00:10", "10:00:20"} {
		trace.WriteString(`{"at":"2026-03-01T` + at + `Z","domain":"auth","descriptors":[{"entries":[{"key":"login","value":"kristie"}]}]}` + "\n")
	}
	for _, shadow := range []bool{false, true} {
		var out bytes.Buffer
		if _, err := RunOptions(context.Background(), cfg, strings.NewReader(trace.String()), &out, Options{ShadowMode: shadow, Headers: ratelimitheaders.HeadersAll}); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, s := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			var l struct {
				OverallCode string `json:"overallCode"`
				Statuses    []struct {
					Code string `json:"code"`
				} `json:"statuses"`
				Headers []struct {
					Key   string `json:"key"`
					Value string `json:"value"`
				} `json:"responseHeadersToAdd"`
			}
			if err := json.Unmarshal([]byte(s), &l); err != nil {
				t.Fatal(err)
			}
			h := map[string]string{}
			for _, kv := range l.Headers {
				h[kv.Key] = kv.Value
			}
			got = append(got, l.OverallCode+" "+l.Statuses[0].Code+" remaining="+h["X-RateLimit-Remaining"]+" retry="+h["Retry-After"])
		}
		want := []string{"OK OK remaining=1 retry=", "OK OK remaining=0 retry=", "OVER_LIMIT OVER_LIMIT remaining=0 retry=40"}
		if shadow {
			want[2] = "OK OVER_LIMIT remaining=0 retry="
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("shadow %v:\n%s\nwant\n%s", shadow, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
}
