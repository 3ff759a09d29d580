package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/sluicehq/sluice/internal/decision/ratelimitheaders"
	"github.com/sluicehq/sluice/internal/edges/reload"
	"github.com/sluicehq/sluice/internal/edges/simulate"
)

func init() {
	commands["simulate"] = command{
		summary: "replay a trace of requests through rules on a virtual clock",
		run:     cmdSimulate,
		help:    func(lookupEnv) *help { return new(simulateFlags).help() },
	}
}

// simulateFlags are the flags of sluice simulate.
type simulateFlags struct {
	config, tracePath, plot, headers string
	quiet, allOrNothing, shadow      bool
}

func (f *simulateFlags) help() *help {
	h := newHelp("simulate", "simulate --config FILE --trace FILE", `Replays a trace through the rules on a virtual clock and the embedded store.
Each trace line is an Envoy RLS v3 RateLimitRequest in protobuf JSON plus "at"
(RFC 3339 or Unix milliseconds):

  {"at":"2017-07-12T03:00:00Z","domain":"auth","descriptors":[{"entries":[{"key":"user","value":"kristie"}]}]}

Writes one RateLimitResponse (protobuf JSON, plus "at") per request to stdout,
and a summary per rule (allowed, denied, shadow-denied) to stderr; with
--plot, an SVG of each rule's allowed and denied over time. A malformed
line fails the run, with its line number, before any decision is printed.`)
	fs := h.fs
	fs.StringVar(&f.config, "config", "", "rules `file`, or directory of rules files (one domain each)")
	fs.StringVar(&f.tracePath, "trace", "", "`trace` of requests, one JSON object per line (\"-\" for stdin)")
	fs.BoolVar(&f.quiet, "quiet", false, "do not print the summary")
	fs.StringVar(&f.plot, "plot", "", "also draw what each rule allowed and denied over time, as an SVG image in this `file`")
	fs.BoolVar(&f.allOrNothing, "all-or-nothing", false, "decide every limit of a request together, as sluice serve --all-or-nothing (default: each on its own, as sluice serve and envoyproxy/ratelimit)")
	fs.BoolVar(&f.shadow, "shadow-mode", false, "answer as sluice serve --shadow-mode: decide and count every limit, but never answer OVER_LIMIT")
	fs.StringVar(&f.headers, "response-headers", "off", "`modes` of rate limit response headers in each response, as sluice serve --response-headers: off, ietf, x-ratelimit, retry-after, all, or a comma list")
	return h
}

func cmdSimulate(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	var o simulateFlags
	h := o.help()
	fs := h.fs
	if err := h.parse(args, false, stderr); err != nil {
		return err
	}
	if o.config == "" || o.tracePath == "" {
		fmt.Fprintln(stderr, "sluice simulate: --config and --trace are required")
		usageHint(fs)
		return errUsage
	}
	mode, err := ratelimitheaders.ParseHeaderMode(o.headers)
	if err != nil {
		return fmt.Errorf("--response-headers: %w", err)
	}
	cfg, err := reload.Load(o.config)
	if err != nil {
		return err
	}
	in := stdin
	if o.tracePath != "-" {
		f, err := os.Open(o.tracePath)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	sum, err := simulate.RunOptions(ctx, cfg, in, stdout, simulate.Options{AllOrNothing: o.allOrNothing, ShadowMode: o.shadow, Headers: mode})
	if err != nil {
		return fmt.Errorf("%s: %w", o.tracePath, err)
	}
	if o.plot != "" {
		if err := writePlot(o.plot, sum); err != nil {
			return err
		}
	}
	if !o.quiet {
		return simulate.WriteSummary(stderr, sum)
	}
	return nil
}

// writePlot writes sum's SVG to path, whole or not at all.
func writePlot(path string, sum *simulate.Summary) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := simulate.WriteSVG(f, sum); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}
