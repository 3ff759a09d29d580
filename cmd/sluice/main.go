// Command sluice is the one binary of the sluice rate limiter.
//
//	sluice simulate --config FILE --trace FILE   replay a trace through rules
//	sluice check --config FILE                   validate rules
//	sluice version                               print the version
//
// It wires the packages together and is the only place that reads flags and
// the environment.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

const usage = `sluice: a rate limiter

Usage:
  sluice simulate --config FILE --trace FILE   replay a trace of requests through rules
  sluice check --config FILE                   validate rules and list every problem
  sluice version                               print the version

Run "sluice COMMAND --help" for the flags of a command.
`

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// errUsage marks an error whose message has been printed with the usage;
// errHelp a request for help, which is not an error.
var (
	errUsage = errors.New("usage")
	errHelp  = errors.New("help")
)

// run executes one command and returns the exit status: 0 on success, 1 when
// the command failed, 2 for a usage error.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "simulate":
		err = cmdSimulate(ctx, args[1:], stdin, stdout, stderr)
	case "check":
		err = cmdCheck(args[1:], stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, "sluice", version)
	case "help", "--help", "-help", "-h":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "sluice: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	switch {
	case err == nil, errors.Is(err, errHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	default:
		fmt.Fprintf(stderr, "sluice %s: %v\n", args[0], err)
		return 1
	}
}
