// Command sluice is the one binary of the sluice rate limiter: "sluice help"
// lists its commands, each in a file of its own.
//
// It wires the packages together and is the only place that reads flags and
// the environment.
package main

//go:generate go test -run ^TestReference$ -update

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".

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

// helpError is a request for help (-h, --help) and the usage that answers
// it, which run prints on stdout. It is errHelp.
type helpError struct{ usage string }

func (e *helpError) Error() string        { return "help" }
func (e *helpError) Is(target error) bool { return target == errHelp }

// command is one subcommand. Each lives in its own file and registers
// itself in commands from an init function.
type command struct {
	summary string // one line for the usage
	run     func(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error

	// help builds the command's flags, bound to settings of their own,
	// and its help, with the defaults env gives (where the command takes
	// any from the environment): what its --help, --help-all and its page
	// of docs/reference show. run parses with a help built the same way.
	help func(env lookupEnv) *help
	// subs, when not nil, builds the helps of its subcommands.
	subs func(env lookupEnv) []*help
}

var commands = map[string]command{
	"version": {
		summary: "print the version",
		run: func(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
			h := versionHelp()
			if err := h.parse(args, false, stderr); err != nil {
				return err
			}
			fmt.Fprintln(stdout, "sluice", versionString())
			return nil
		},
		help: func(lookupEnv) *help { return versionHelp() },
	},
}

func versionHelp() *help {
	return newHelp("version", "version", `Prints the version of sluice, and the source it was built from: the
revision, its time, and "modified" when the tree had changes.`)
}

// usage lists the commands.
func usage() string {
	names := make([]string, 0, len(commands))
	for name := range commands {
		names = append(names, name)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("sluice: a rate limiter\n\nUsage:\n")
	for _, name := range names {
		fmt.Fprintf(&b, "  sluice %-11s %s\n", name, commands[name].summary)
	}
	b.WriteString("\nRun \"sluice help COMMAND\" (or \"sluice COMMAND --help\") for a command's flags.\n")
	return b.String()
}

// run executes one command and returns the exit status: 0 on success, 1 when
// the command failed, 2 for a usage error.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return 2
	}
	var err error
	name := args[0]
	if name == "--version" || name == "-version" {
		name = "version"
	}
	switch name {
	case "help", "--help", "-help", "-h":
		if len(args) > 1 && args[0] == "help" { // sluice help COMMAND
			return run(ctx, []string{args[1], "--help"}, stdin, stdout, stderr)
		}
		fmt.Fprint(stdout, usage())
	default:
		cmd, ok := commands[name]
		if !ok {
			fmt.Fprintf(stderr, "sluice: unknown command %q\n\n%s", name, usage())
			return 2
		}
		err = cmd.run(ctx, args[1:], stdin, stdout, stderr)
	}
	var help *helpError
	switch {
	case errors.As(err, &help):
		fmt.Fprint(stdout, help.usage)
		return 0
	case err == nil, errors.Is(err, errHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	default:
		fmt.Fprintf(stderr, "sluice %s: %v\n", args[0], err)
		return 1
	}
}
