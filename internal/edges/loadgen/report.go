package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// Report is a Result in the form that "sluice bench --json" prints: plain
// numbers, latencies in microseconds, for scripts.
type Report struct {
	Target      string  `json:"target"`
	Mode        Mode    `json:"mode"`
	Path        string  `json:"path,omitempty"`   // HTTP mode
	Header      string  `json:"header,omitempty"` // HTTP mode
	Connections int     `json:"connections"`
	Concurrency int     `json:"concurrency"`
	Keys        int     `json:"keys"`
	Hot         float64 `json:"hot"`
	Rate        float64 `json:"rate,omitempty"` // open loop; absent for closed loop

	Seconds   float64 `json:"seconds"`
	Requests  int64   `json:"requests"`
	RPS       float64 `json:"rps"`
	OK        int64   `json:"ok"`
	OverLimit int64   `json:"over_limit"`
	Unknown   int64   `json:"unknown"`
	Errors    int64   `json:"errors"`
	HotShare  float64 `json:"hot_share"`
	Filled    int64   `json:"filled,omitempty"`
	Warmup    int64   `json:"warmup_requests"`

	MinUS  float64 `json:"min_us"`
	MeanUS float64 `json:"mean_us"`
	P50US  float64 `json:"p50_us"`
	P90US  float64 `json:"p90_us"`
	P99US  float64 `json:"p99_us"`
	P999US float64 `json:"p999_us"`
	MaxUS  float64 `json:"max_us"`

	ErrorKinds   map[string]int64  `json:"error_kinds,omitempty"`
	ErrorSamples map[string]string `json:"error_samples,omitempty"`
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// Report returns r for printing as JSON.
func (r *Result) Report() Report {
	rep := Report{
		Target: r.Config.Target, Mode: r.Config.Mode,
		Connections: r.Config.Connections, Concurrency: r.Config.Concurrency,
		Keys: r.Config.Keys, Hot: r.Config.Hot, Rate: r.Config.Rate,
		Seconds: r.Elapsed.Seconds(), Requests: r.Requests, RPS: r.RPS(),
		OK: r.OK, OverLimit: r.OverLimit, Unknown: r.Unknown, Errors: r.Errors,
		Filled: r.Filled, Warmup: r.Warmup,
		MinUS: us(r.Latency.Min), MeanUS: us(r.Latency.Mean),
		P50US: us(r.Latency.P50), P90US: us(r.Latency.P90), P99US: us(r.Latency.P99),
		P999US: us(r.Latency.P999), MaxUS: us(r.Latency.Max),
	}
	if r.Config.Mode == HTTP {
		rep.Path, rep.Header = r.Config.Path, r.Config.Header
	}
	if r.Requests > 0 {
		rep.HotShare = float64(r.Hot) / float64(r.Requests)
	}
	if len(r.ErrorKinds) > 0 {
		rep.ErrorKinds, rep.ErrorSamples = r.ErrorKinds, r.ErrorSamples
	}
	return rep
}

// WriteJSON writes r as one line of JSON.
func (r *Result) WriteJSON(w io.Writer) error {
	return json.NewEncoder(w).Encode(r.Report())
}

// WriteText writes r for a person.
func (r *Result) WriteText(w io.Writer) error {
	c := r.Config
	loop := "closed loop"
	if c.Rate > 0 {
		loop = fmt.Sprintf("open loop at %.0f/s", c.Rate)
	}
	target := c.Target
	if c.Mode == HTTP {
		target += c.Path
		if c.Header != "" {
			target += " (key in " + c.Header + ")"
		}
	}
	fmt.Fprintf(w, "target %s  %s  %d connection(s)  %d in flight  %d keys  hot %.3g  %s\n",
		target, c.Mode, c.Connections, c.Concurrency, c.Keys, c.Hot, loop)
	if r.Filled > 0 {
		fmt.Fprintf(w, "filled   %d keys\n", r.Filled)
	}
	fmt.Fprintf(w, "requests %d in %.2fs: %.0f/s\n", r.Requests, r.Elapsed.Seconds(), r.RPS())
	hotShare := 0.0
	if r.Requests > 0 {
		hotShare = 100 * float64(r.Hot) / float64(r.Requests)
	}
	fmt.Fprintf(w, "answers  ok %d  over_limit %d  unknown %d  errors %d  (hot key %.1f%%)\n",
		r.OK, r.OverLimit, r.Unknown, r.Errors, hotShare)
	l := r.Latency
	fmt.Fprintf(w, "latency  min %v  mean %v  p50 %v  p90 %v  p99 %v  p99.9 %v  max %v\n",
		round(l.Min), round(l.Mean), round(l.P50), round(l.P90), round(l.P99), round(l.P999), round(l.Max))
	for _, k := range r.ErrorKindsSorted() {
		fmt.Fprintf(w, "error    %s: %d (%s)\n", k, r.ErrorKinds[k], r.ErrorSamples[k])
	}
	return nil
}

// round keeps three significant digits or so: 1.23ms, 456µs.
func round(d time.Duration) time.Duration {
	for unit := time.Duration(1); unit < time.Hour; unit *= 10 {
		if d < 1000*unit {
			return d.Round(unit)
		}
	}
	return d
}
