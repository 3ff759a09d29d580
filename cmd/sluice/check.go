package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sluicehq/sluice/internal/httpconf"
	"github.com/sluicehq/sluice/internal/reload"
	"github.com/sluicehq/sluice/rules"
)

func init() {
	commands["check"] = command{
		summary: "validate rules and list every problem with its line",
		run: func(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
			return cmdCheck(args, stdout, stderr)
		},
	}
}

func cmdCheck(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config := fs.String("config", "", "rules `path`: a file, or a directory of files (one domain each)")
	merge := fs.Bool("merge-domains", false, "let several rules files define one domain, as sluice serve --merge-domains (envoy-rl's MERGE_DOMAIN_CONFIG)")
	setUsage(fs, `Usage: sluice check --config PATH [--merge-domains]

Validates rules (and a file's http section, for sluice proxy) as sluice
serve and sluice proxy read them, and prints every problem with its line,
then every warning. Exits 1 on any problem.`, "")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *config == "" {
		fmt.Fprintln(stderr, "sluice check: --config is required")
		usageHint(fs)
		return errUsage
	}
	load := func(path string) (*rules.Config, error) { // as sluice serve and its reloads load rules
		return reload.LoadWith(path, rules.LoadOptions{MergeDomains: *merge})
	}
	if info, err := os.Stat(*config); err == nil && !info.IsDir() {
		// One file may also hold the http section of sluice proxy.
		load = func(path string) (*rules.Config, error) {
			c, _, err := httpconf.LoadFile(path)
			return c, err
		}
	}
	cfg, err := load(*config)
	if err != nil {
		var re *rules.Error
		if errors.As(err, &re) {
			fmt.Fprintln(stderr, re.Error())
			printWarnings(stderr, re.Warnings)
			return fmt.Errorf("%d problem(s) in %s", len(re.Problems), *config)
		}
		return err
	}
	printWarnings(stderr, cfg.Warnings())
	fmt.Fprintf(stdout, "%s: OK (%d domain(s): %v)\n", *config, len(cfg.Domains()), cfg.Domains())
	return nil
}

// printWarnings prints the warnings of rules, one a line.
func printWarnings(w io.Writer, warns []rules.Problem) {
	for _, p := range warns {
		fmt.Fprintf(w, "warning: %s\n", p)
	}
}

// parseFlags parses args, rejecting positional arguments, and maps -help to
// a clean exit.
func parseFlags(fs *flag.FlagSet, args []string) error { return parseFlagsArgs(fs, args, false) }

// parseFlagsArgs is parseFlags, taking arguments after the flags when
// positional is true.
func parseFlagsArgs(fs *flag.FlagSet, args []string, positional bool) error {
	// The flag package prints the whole usage after a bad flag: a hundred
	// lines in which the one that matters scrolls away. Print the usage
	// only when asked (-h), and otherwise the error and a hint.
	out, usage := fs.Output(), fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.SetOutput(out)
	fs.Usage = usage
	switch {
	case errors.Is(err, flag.ErrHelp):
		var b strings.Builder
		fs.SetOutput(&b)
		fs.Usage()
		fs.SetOutput(out)
		return &helpError{usage: b.String()}
	case err != nil:
		fmt.Fprintf(out, "sluice %s: %v\n", fs.Name(), err)
		usageHint(fs)
		return errUsage
	case fs.NArg() > 0 && !positional:
		fmt.Fprintf(out, "sluice %s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		usageHint(fs)
		return errUsage
	}
	return nil
}

// setUsage gives fs the usage of every sluice command: head (the line
// "Usage: sluice COMMAND ..." and what the command does), then its flags
// as writeFlags prints them, then tail. It prints to fs.Output(), which
// is stdout when asked for with -h.
func setUsage(fs *flag.FlagSet, head, tail string) {
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprint(w, strings.TrimRight(head, "\n")+"\n\nFlags:\n")
		writeFlags(w, fs, nil)
		fmt.Fprint(w, tail)
	}
}

// writeFlags prints every flag of fs, in the one style of sluice's usages:
// --name and its value's name on one line; on the next, its usage, its
// default, and what more(f) says (the environment variables of serve and
// proxy; nil: nothing).
func writeFlags(w io.Writer, fs *flag.FlagSet, more func(f *flag.Flag) string) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		fmt.Fprintf(w, "  --%s", f.Name)
		if name != "" {
			fmt.Fprintf(w, " %s", name)
		}
		fmt.Fprintf(w, "\n      %s", usage)
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" {
			fmt.Fprintf(w, " (default %q)", f.DefValue)
		}
		if more != nil {
			fmt.Fprint(w, more(f))
		}
		fmt.Fprintln(w)
	})
}

// usageHint prints, after a usage error, where the usage is.
func usageHint(fs *flag.FlagSet) {
	fmt.Fprintf(fs.Output(), "Run 'sluice %s -h' for its flags.\n", fs.Name())
}
