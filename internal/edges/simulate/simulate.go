// Package simulate replays a trace of timestamped Envoy RLS requests through
// rules on a virtual clock and the embedded store, and reports every
// decision: for tuning limits before a rollout, and as the precise way to
// test semantics.
//
// It owns the trace format and the summary; it must not import any
// transport.
package simulate

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/decision/ratelimitheaders"
	"github.com/sluicehq/sluice/internal/edges/rls"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

// RuleStats counts the decisions of one rule (by stats key).
type RuleStats struct {
	StatKey      string
	Allowed      int64 // descriptors within the limit
	Denied       int64 // descriptors over the limit
	ShadowDenied int64 // over a shadow-mode limit, let through

	// The same over time: one element per Summary.Step from
	// Summary.Start, for plots.
	AllowedOver, DeniedOver, ShadowDeniedOver []int64

	// WindowOver names, per step, the window of the rule's schedules
	// whose limits apply at the middle of the step ("" for the rule's own
	// limits), on the trace's clock: a plot shows a schedule before it is
	// rolled out. Nil for a rule without schedules.
	WindowOver []string

	windows []*rules.Schedule
}

// Summary is the result of a run.
type Summary struct {
	Requests int64
	Allowed  int64 // requests with overall code OK
	Denied   int64 // requests with overall code OVER_LIMIT
	Rules    []RuleStats

	// The time series of the rules: Steps slices of Step from Start (the
	// first request), about a hundred over the trace, a second at least.
	Start time.Time
	Step  time.Duration
	Steps int
}

// maxSteps is about how many slices of time a run's series have.
const maxSteps = 100

// Options are how a run decides, as the flags of sluice serve set it.
type Options struct {
	// AllOrNothing is the default of the domains that set no
	// all_or_nothing: (sluice serve's --all-or-nothing): false counts each
	// limit on its own, as envoyproxy/ratelimit and sluice serve do.
	AllOrNothing bool

	// ShadowMode is the global shadow mode (sluice serve's
	// --shadow-mode): no request is denied overall.
	ShadowMode bool

	// Headers are the rate limit response headers each response carries
	// (sluice serve's --response-headers); zero adds none.
	Headers ratelimitheaders.HeaderMode
}

// Run is RunOptions with the default Options: the answers of sluice serve
// run with its defaults.
func Run(ctx context.Context, cfg *rules.Config, in io.Reader, out io.Writer) (*Summary, error) {
	return RunOptions(ctx, cfg, in, out, Options{})
}

// RunOptions reads the whole trace from in (nothing is decided if any line
// is malformed), replays it through cfg on a fresh memstore whose clock is
// the trace's "at", and writes one RateLimitResponse in protobuf JSON plus
// "at" per request to out.
func RunOptions(ctx context.Context, cfg *rules.Config, in io.Reader, out io.Writer, opt Options) (*Summary, error) {
	var now time.Time
	clock := func() time.Time { return now }
	store := memstore.New(memstore.Config{Now: clock, SweepInterval: -1})
	defer store.Close()
	dec, err := newDecider(sluice.NewLimiter(store), clock, cfg, opt)
	if err != nil {
		return nil, err
	}
	var r decide.Request
	events, err := ReadTrace(in, func(req *rlsv3.RateLimitRequest) error {
		if err := rls.Request(req, &r); err != nil {
			return err
		}
		return dec.Check(&r)
	})
	if err != nil {
		return nil, err
	}
	w := bufio.NewWriter(out)
	sum := newSummary(events)
	stats := map[string]*RuleStats{}
	var o decide.Outcome
	for _, ev := range events {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		now = ev.At
		err := rls.Request(ev.Request, &r)
		if err == nil {
			err = dec.Decide(ctx, &r, &o)
		}
		if err != nil {
			return nil, &LineError{Line: ev.Line, Err: err}
		}
		resp := rls.Response(&o, false)
		sum.count(resp, &o, ev.At, stats)
		if err := writeLine(w, ev.RawAt, resp); err != nil {
			return nil, err
		}
	}
	if err := w.Flush(); err != nil {
		return nil, err
	}
	for _, rs := range stats {
		rs.windowsOver(sum)
		sum.Rules = append(sum.Rules, *rs)
	}
	sort.Slice(sum.Rules, func(i, j int) bool { return sum.Rules[i].StatKey < sum.Rules[j].StatKey })
	return sum, nil
}

// newDecider is the decision core of a run: the same door and hooks as
// sluice serve's with the flags of opt, on the trace's clock (which
// chooses the windows of schedules, as the store's clock does in serve).
func newDecider(lim *sluice.Limiter, clock func() time.Time, cfg *rules.Config, opt Options) (*decide.Decider, error) {
	var hooks []decide.Hook
	if opt.ShadowMode {
		hooks = append(hooks, decide.GlobalShadow)
	}
	if opt.Headers != 0 {
		hooks = append(hooks, ratelimitheaders.Hook(opt.Headers))
	}
	return decide.New(decide.Config{Limiter: lim, Rules: cfg, CountEach: !opt.AllOrNothing, Hooks: hooks, Now: clock})
}

// newSummary is the empty summary of a run of events: its time series
// start at the first and run in slices of a hundredth of the span,
// rounded up to whole seconds.
func newSummary(events []Event) *Summary {
	sum := &Summary{Step: time.Second, Steps: 1}
	if len(events) == 0 {
		return sum
	}
	first, last := events[0].At, events[0].At
	for _, ev := range events {
		first, last = minTime(first, ev.At), maxTime(last, ev.At)
	}
	span := last.Sub(first)
	sum.Start = first
	step := (span + maxSteps - 1) / maxSteps
	sum.Step = max(time.Second, (step+time.Second-1)/time.Second*time.Second)
	sum.Steps = int(span/sum.Step) + 1
	return sum
}

// count adds a request answered resp, with outcome o, at at.
func (sum *Summary) count(resp *rlsv3.RateLimitResponse, o *decide.Outcome, at time.Time, stats map[string]*RuleStats) {
	sum.Requests++
	if resp.OverallCode == rlsv3.RateLimitResponse_OK {
		sum.Allowed++
	} else {
		sum.Denied++
	}
	i := min(max(int(at.Sub(sum.Start)/sum.Step), 0), sum.Steps-1)
	for _, d := range o.Descriptors {
		if !d.Limited {
			continue
		}
		rs := stats[d.StatKey]
		if rs == nil {
			rs = &RuleStats{StatKey: d.StatKey, AllowedOver: make([]int64, sum.Steps),
				DeniedOver: make([]int64, sum.Steps), ShadowDeniedOver: make([]int64, sum.Steps)}
			stats[d.StatKey] = rs
		}
		if d.Rule != nil && len(d.Rule.Schedules) > 0 && rs.windows == nil {
			rs.windows = d.Rule.Schedules
		}
		switch {
		case d.ShadowOver:
			rs.ShadowDenied++
			rs.ShadowDeniedOver[i]++
		case d.Over:
			rs.Denied++
			rs.DeniedOver[i]++
		default:
			rs.Allowed++
			rs.AllowedOver[i]++
		}
	}
}

// windowsOver fills rs.WindowOver from the schedules of its rule: the
// first window that holds at the middle of each step of sum.
func (rs *RuleStats) windowsOver(sum *Summary) {
	if rs.windows == nil {
		return
	}
	rs.WindowOver = make([]string, sum.Steps)
	for i := range rs.WindowOver {
		at := sum.Start.Add(time.Duration(i)*sum.Step + sum.Step/2)
		for _, w := range rs.windows {
			if in, _ := w.In(at); in {
				rs.WindowOver[i] = w.Name
				break
			}
		}
	}
}

// writeLine writes resp in protobuf JSON with the request's "at" first:
// {"at":...,<the response's fields>}.
func writeLine(w *bufio.Writer, at []byte, resp *rlsv3.RateLimitResponse) error {
	body, err := protojson.MarshalOptions{}.Marshal(resp)
	if err != nil {
		return err
	}
	w.WriteString(`{"at":`)
	w.Write(at)
	if len(body) > 2 {
		w.WriteByte(',')
	}
	w.Write(body[1:])
	return w.WriteByte('\n')
}

// WriteSummary prints s as a table.
func WriteSummary(w io.Writer, s *Summary) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "%d requests: %d allowed, %d denied\n", s.Requests, s.Allowed, s.Denied)
	if len(s.Rules) > 0 {
		width := len("rule")
		for _, r := range s.Rules {
			width = max(width, len(r.StatKey))
		}
		fmt.Fprintf(bw, "%-*s %9s %9s %14s\n", width, "rule", "allowed", "denied", "shadow-denied")
		for _, r := range s.Rules {
			fmt.Fprintf(bw, "%-*s %9d %9d %14d\n", width, r.StatKey, r.Allowed, r.Denied, r.ShadowDenied)
		}
	}
	return bw.Flush()
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
