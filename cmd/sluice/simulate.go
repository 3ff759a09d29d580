package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/sluicehq/sluice/internal/ratelimitheaders"
	"github.com/sluicehq/sluice/internal/reload"
	"github.com/sluicehq/sluice/internal/simulate"
)

func init() {
	commands["simulate"] = command{
		summary: "replay a trace of requests through rules on a virtual clock",
		run:     cmdSimulate,
	}
}

func cmdSimulate(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config := fs.String("config", "", "rules file, or directory of rules files (one domain each)")
	tracePath := fs.String("trace", "", `trace of requests, one JSON object per line ("-" for stdin)`)
	quiet := fs.Bool("quiet", false, "do not print the summary")
	plot := fs.String("plot", "", "also draw what each rule allowed and denied over time, as an SVG image in this `file`")
	allOrNothing := fs.Bool("all-or-nothing", false, "decide every limit of a request together, as sluice serve --all-or-nothing (default: each on its own, as sluice serve and envoyproxy/ratelimit)")
	shadow := fs.Bool("shadow-mode", false, "answer as sluice serve --shadow-mode: decide and count every limit, but never answer OVER_LIMIT")
	headers := fs.String("response-headers", "off", "`modes` of rate limit response headers in each response, as sluice serve --response-headers: off, ietf, x-ratelimit, retry-after, all, or a comma list")
	setUsage(fs, `Usage: sluice simulate --config FILE --trace FILE

Replays a trace through the rules on a virtual clock and the embedded store.
Each trace line is an Envoy RLS v3 RateLimitRequest in protobuf JSON plus "at"
(RFC 3339 or Unix milliseconds):

  {"at":"2017-07-12T03:00:00Z","domain":"auth","descriptors":[{"entries":[{"key":"user","value":"kristie"}]}]}

Writes one RateLimitResponse (protobuf JSON, plus "at") per request to stdout,
and a summary per rule (allowed, denied, shadow-denied) to stderr; with
--plot, an SVG of each rule's allowed and denied over time. A malformed
line fails the run, with its line number, before any decision is printed.

`, "")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *config == "" || *tracePath == "" {
		fmt.Fprintln(stderr, "sluice simulate: --config and --trace are required")
		usageHint(fs)
		return errUsage
	}
	mode, err := ratelimitheaders.ParseHeaderMode(*headers)
	if err != nil {
		return fmt.Errorf("--response-headers: %w", err)
	}
	cfg, err := reload.Load(*config)
	if err != nil {
		return err
	}
	in := stdin
	if *tracePath != "-" {
		f, err := os.Open(*tracePath)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	sum, err := simulate.RunOptions(ctx, cfg, in, stdout, simulate.Options{AllOrNothing: *allOrNothing, ShadowMode: *shadow, Headers: mode})
	if err != nil {
		return fmt.Errorf("%s: %w", *tracePath, err)
	}
	if *plot != "" {
		if err := writePlot(*plot, sum); err != nil {
			return err
		}
	}
	if !*quiet {
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
