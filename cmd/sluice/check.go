package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/sluicehq/sluice/internal/edges/httpconf"
	"github.com/sluicehq/sluice/internal/edges/reload"
	"github.com/sluicehq/sluice/rules"
)

func init() {
	commands["check"] = command{
		summary: "validate rules and list every problem with its line",
		run: func(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
			return cmdCheck(args, stdout, stderr)
		},
		help: func(lookupEnv) *help { return new(checkFlags).help() },
	}
}

// checkFlags are the flags of sluice check.
type checkFlags struct {
	config string
	merge  bool
}

func (c *checkFlags) help() *help {
	h := newHelp("check", "check --config PATH [--merge-domains]", `Validates rules (and a file's http section, for sluice proxy) as sluice
serve and sluice proxy read them, and prints every problem with its line,
then every warning: among them each concurrency limit, which sluice proxy
takes and sluice serve only with --stream-done-release. Exits 1 on any
problem; warnings alone exit 0.`)
	h.fs.StringVar(&c.config, "config", "", "rules `path`: a file, or a directory of files (one domain each)")
	h.fs.BoolVar(&c.merge, "merge-domains", false, "let several rules files define one domain, as sluice serve --merge-domains (envoy-rl's MERGE_DOMAIN_CONFIG)")
	return h
}

func cmdCheck(args []string, stdout, stderr io.Writer) error {
	var c checkFlags
	h := c.help()
	if err := h.parse(args, false, stderr); err != nil {
		return err
	}
	if c.config == "" {
		fmt.Fprintln(stderr, "sluice check: --config is required")
		usageHint(h.fs)
		return errUsage
	}
	load := func(path string) (*rules.Config, error) { // as sluice serve and its reloads load rules
		return reload.LoadWith(path, rules.LoadOptions{MergeDomains: c.merge})
	}
	if info, err := os.Stat(c.config); err == nil && !info.IsDir() {
		// One file may also hold the http section of sluice proxy.
		load = func(path string) (*rules.Config, error) {
			c, _, err := httpconf.LoadFile(path)
			return c, err
		}
	}
	cfg, err := load(c.config)
	if err != nil {
		var re *rules.Error
		if errors.As(err, &re) {
			fmt.Fprintln(stderr, re.Error())
			printWarnings(stderr, re.Warnings)
			return fmt.Errorf("%d problem(s) in %s", len(re.Problems), c.config)
		}
		return err
	}
	printWarnings(stderr, append(cfg.Warnings(), concurrencyWarnings(cfg)...))
	fmt.Fprintf(stdout, "%s: OK (%d domain(s): %v)\n", c.config, len(cfg.Domains()), cfg.Domains())
	return nil
}

// concurrencyWarnings are the warnings of the rules of c with a
// concurrency limit: sluice proxy and httplimit enforce them, but sluice
// serve refuses them unless Envoy gives each request's permits back
// (--stream-done-release), so that rules that check cleanly may not
// serve.
func concurrencyWarnings(c *rules.Config) []rules.Problem {
	var out []rules.Problem
	for _, r := range concurrencyRules(c) {
		out = append(out, rules.Problem{File: r.File, Line: r.Line, Column: r.Column, Msg: fmt.Sprintf(
			"rule %s has a concurrency limit: sluice serve refuses it unless started with --stream-done-release, with Envoy releasing each request's permits when its stream is done (docs/envoy-apis.md); sluice proxy and httplimit enforce it as it is", r.StatKey)})
	}
	return out
}

// printWarnings prints the warnings of rules, one a line.
func printWarnings(w io.Writer, warns []rules.Problem) {
	for _, p := range warns {
		fmt.Fprintf(w, "warning: %s\n", p)
	}
}
