package simulate_test

import (
	"bytes"
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/edges/simulate"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
)

// TestPlot: a minute of one request a second against 10 a minute, and a
// rule that lets everything through, drawn: the bars of each rule add up
// to its summary, the denials start where the limit ran out, and the
// image is well-formed XML.
func TestPlot(t *testing.T) {
	cfg := rulestest.Config(t, `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: free
    rate_limit: {unit: minute, requests_per_unit: 1000}
`)
	var trace strings.Builder
	start := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	for i := range 60 {
		fmt.Fprintf(&trace, `{"at":%d,"domain":"api","descriptors":[{"entries":[{"key":"user","value":"a"}]},{"entries":[{"key":"free","value":"b"}]}]}`+"\n", start.Add(time.Duration(i)*time.Second).UnixMilli())
	}
	sum, err := simulate.Run(context.Background(), cfg, strings.NewReader(trace.String()), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Step != time.Second || sum.Steps != 60 || !sum.Start.Equal(start) {
		t.Fatalf("series: start %v, step %v, %d steps; want %v, 1s, 60", sum.Start, sum.Step, sum.Steps, start)
	}
	var svg bytes.Buffer
	if err := simulate.WriteSVG(&svg, sum); err != nil {
		t.Fatal(err)
	}
	// Sum the bars per rule and kind, reading the SVG as XML.
	bars := map[string]int64{}
	firstDenied := -1
	dec := xml.NewDecoder(&svg)
	rule := ""
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the SVG is not well-formed: %v", err)
		}
		se, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		attr := map[string]string{}
		for _, a := range se.Attr {
			attr[a.Name.Local] = a.Value
		}
		switch se.Name.Local {
		case "g":
			if r, ok := attr["data-rule"]; ok {
				rule = r
			}
		case "rect":
			if n, ok := attr["data-n"]; ok {
				v, _ := strconv.ParseInt(n, 10, 64)
				bars[rule+" "+attr["class"]] += v
				if rule == "api.user" && attr["class"] == "denied" && firstDenied < 0 {
					x, _ := strconv.ParseFloat(attr["x"], 64)
					firstDenied = int((x - 60) / (820.0 / 60))
				}
			}
		}
	}
	want := map[string]int64{"api.user allowed": 10, "api.user denied": 50, "api.free allowed": 60}
	for k, v := range want {
		if bars[k] != v {
			t.Errorf("%s: bars add up to %d, want %d (all: %v)", k, bars[k], v, bars)
		}
	}
	if firstDenied != 10 {
		t.Errorf("the first denied bar is at second %d, want 10", firstDenied)
	}
}

// TestPlotSchedule: two hours of traffic against a rule whose schedule
// tightens it from 01:00 to 01:30 UTC: the summary and the plot mark the
// window in the steps it covers, on the trace's clock, and the limit that
// applied changes with it.
func TestPlotSchedule(t *testing.T) {
	cfg := rulestest.Config(t, `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
    schedules:
      - {name: night, from: "01:00", to: "01:30", tz: UTC, rate_limit: {unit: minute, requests_per_unit: 1}}
`)
	var trace strings.Builder
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 120 {
		for range 3 {
			fmt.Fprintf(&trace, `{"at":%d,"domain":"api","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}`+"\n", start.Add(time.Duration(i)*time.Minute).UnixMilli())
		}
	}
	sum, err := simulate.Run(context.Background(), cfg, strings.NewReader(trace.String()), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	r := sum.Rules[0]
	if len(r.WindowOver) != sum.Steps {
		t.Fatalf("%d window marks for %d steps", len(r.WindowOver), sum.Steps)
	}
	for i, w := range r.WindowOver {
		mid := start.Add(time.Duration(i)*sum.Step + sum.Step/2)
		in := !mid.Before(start.Add(time.Hour)) && mid.Before(start.Add(90*time.Minute))
		if (w == "night") != in || (w != "" && w != "night") {
			t.Errorf("step %d (%v): window %q", i, mid.Format("15:04"), w)
		}
	}
	// 3 requests a minute: all admitted outside the window, 1 in 3 inside.
	if r.Allowed != 90*3+30 || r.Denied != 60 {
		t.Errorf("allowed %d denied %d, want %d and 60", r.Allowed, r.Denied, 90*3+30)
	}
	var svg bytes.Buffer
	if err := simulate.WriteSVG(&svg, sum); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(svg.String(), `class="window"`); n != 1 || !strings.Contains(svg.String(), `data-window="night"`) {
		t.Errorf("%d window marks in the plot, want one run named night", n)
	}
	// The window's name is above every bar, not under one: its baseline
	// is at or above the top of the highest bar.
	attr := func(tag, name string) float64 {
		m := regexp.MustCompile(` ` + name + `="([0-9.]+)"`).FindStringSubmatch(tag)
		if m == nil {
			t.Fatalf("no %s in %s", name, tag)
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		return v
	}
	labels := regexp.MustCompile(`<text class="window-name"[^>]*>`).FindAllString(svg.String(), -1)
	bars := regexp.MustCompile(`<rect class="(allowed|denied|shadow-denied)"[^>]*>`).FindAllString(svg.String(), -1)
	if len(labels) != 1 || len(bars) == 0 {
		t.Fatalf("%d window names, %d bars", len(labels), len(bars))
	}
	for _, b := range bars {
		if top, base := attr(b, "y"), attr(labels[0], "y"); base > top {
			t.Errorf("the window's name (baseline %.1f) is under a bar (top %.1f): %s", base, top, b)
			break
		}
	}
}
