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
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/go-logr/stdr"
	"go.opentelemetry.io/otel"
	"google.golang.org/grpc/grpclog"

	"github.com/sluicehq/sluice/internal/base/redact"
)

// version is set at build time with -ldflags "-X main.version=...".

func main() {
	scrub = redact.NewScrubber(redact.Secrets(os.Args[1:], readEnv(os.Environ())))
	stderr := scrub.Writer(os.Stderr)
	logThrough(stderr)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, commandLine(os.Args[0], os.Args[1:]), os.Stdin, os.Stdout, stderr)
	stop()
	os.Exit(code)
}

// commandLine is the command run for a process started as argv0 with
// args. Started under envoyproxy/ratelimit's name (the image's
// /bin/ratelimit, which Envoy Gateway runs with no arguments), the binary
// is sluice serve, reading envoy-rl's environment; its arguments are
// serve's flags.
func commandLine(argv0 string, args []string) []string {
	if filepath.Base(argv0) == "ratelimit" {
		return append([]string{"serve"}, args...)
	}
	return args
}

// scrub takes the secrets the process was started with (its command
// line's and environment's, redact.Secrets) out of what it writes to
// stderr and of the store errors its listeners show (/readyz, the
// dashboard): the safety net under the masking done where a URL or a
// flag is shown, for the errors of libraries, which may quote what they
// were given. main sets it; nil (in tests that call run) scrubs nothing.
var scrub *redact.Scrubber

// readEnv keeps, of the environment, the variables sluice reads, whose
// secrets scrub looks for: SLUICE_*, envoyproxy/ratelimit's, the
// OpenTelemetry exporter's and DogStatsD's mogrifiers. Another
// variable whose name sounds secret (SSH_AUTH_SOCK, a CI's job token) is
// not sluice's: looking for its value would blot that text out of every
// log line and answer that happens to hold it.
func readEnv(environ []string) []string {
	envoy := map[string]bool{}
	for _, v := range envoyVars {
		for _, n := range v.names {
			envoy[n] = true
		}
	}
	for _, u := range envoyUnmapped {
		envoy[u.name] = true
	}
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case envoy[name], strings.HasPrefix(name, "SLUICE_"), strings.HasPrefix(name, "OTEL_"), strings.HasPrefix(name, "DOG_STATSD_"):
			out = append(out, kv)
		}
	}
	return out
}

// logThrough sends the logs of the libraries that write to stderr on
// their own through w: the standard logger (net/http's, OpenTelemetry's
// error handler), gRPC's (at GRPC_GO_LOG_SEVERITY_LEVEL, errors by
// default, as its own) and OpenTelemetry's.
func logThrough(w io.Writer) {
	log.SetOutput(w)
	info, warning, errs := io.Discard, io.Discard, io.Discard
	switch strings.ToLower(os.Getenv("GRPC_GO_LOG_SEVERITY_LEVEL")) {
	case "", "error":
		errs = w
	case "warning":
		warning = w
	case "info":
		info = w
	}
	v, _ := strconv.Atoi(os.Getenv("GRPC_GO_LOG_VERBOSITY_LEVEL"))
	grpclog.SetLoggerV2(grpclog.NewLoggerV2WithVerbosity(info, warning, errs, v))
	otel.SetLogger(stdr.New(log.New(w, "", log.LstdFlags|log.Lshortfile)))
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
