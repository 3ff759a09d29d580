package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/decision/overrides"
	"github.com/sluicehq/sluice/internal/edges/httpconf"
	"github.com/sluicehq/sluice/internal/edges/reload"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

func init() {
	commands["explain"] = command{
		summary: "say which rule or override applies to a request, and why",
		run: func(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
			return cmdExplain(ctx, args, os.LookupEnv, stdout, stderr)
		},
		help: func(env lookupEnv) *help { return newExplainFlags(env).h },
	}
}

// explainFlags are the flags of sluice explain.
type explainFlags struct {
	h                 *help
	server, tokenFile *string
	domain, config    string
	at                string
}

// newExplainFlags builds the flags of sluice explain, with the defaults
// env gives.
func newExplainFlags(env lookupEnv) *explainFlags {
	e := &explainFlags{h: newHelp("explain", "explain --domain D [--config PATH | --token-file F] DESCRIPTOR...", `Says which rule would apply to each DESCRIPTOR of a request, and why,
without deciding anything. With --config, from a rules file alone: the
rules and their schedules at --at (default now), no server needed. Without
it, asks a running server's admin API (sluice serve --admin-addr, or sluice
proxy --admin-listen with --admin-token-file), which adds the runtime
overrides in force and each counter's state: for a concurrency limit, the
permits held now on every node sharing the store. Each
DESCRIPTOR is key=value pairs joined by /, in order (tenant=acme/user=bob);
in a key or value, write % as %25 and / as %2F.`)}
	e.h.env = adminEnv
	e.server, e.tokenFile = adminFlags(e.h.fs, env)
	e.h.fs.StringVar(&e.domain, "domain", "", "the request's `domain`")
	e.h.fs.StringVar(&e.config, "config", "", "explain from this rules `path` (a file, or a directory of files) instead of asking a server")
	e.h.fs.StringVar(&e.at, "at", "", "with --config, the `time` to explain at (RFC 3339; default now): which schedule window applies")
	return e
}

func cmdExplain(ctx context.Context, args []string, env lookupEnv, stdout, stderr io.Writer) error {
	e := newExplainFlags(env)
	fs := e.h.fs
	if err := e.h.parse(args, true, stderr); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "sluice explain: name at least one descriptor")
		return errUsage
	}
	var paths [][]overrides.Entry
	for _, a := range fs.Args() {
		p, err := overrides.ParsePath(a)
		if err != nil {
			return fmt.Errorf("descriptor %q: %w", a, err)
		}
		paths = append(paths, p)
	}
	if e.config != "" {
		return e.fromRules(ctx, paths, stdout)
	}
	if e.at != "" {
		fmt.Fprintln(stderr, "sluice explain: --at needs --config (a server explains at its own time)")
		return errUsage
	}
	body := struct {
		Domain      string              `json:"domain"`
		Descriptors [][]overrides.Entry `json:"descriptors"`
	}{Domain: e.domain, Descriptors: paths}
	c, err := newAdminClient(*e.server, *e.tokenFile)
	if err != nil {
		return fmt.Errorf("%w (or explain from a rules file with --config)", err)
	}
	data, err := json.Marshal(body)
	if err != nil {
		return err
	}
	return c.print(ctx, stdout, "POST", "/v1/explain", bytes.NewReader(data))
}

// fromRules explains paths from the rules at e.config, as a server with
// those rules and no overrides would, without counters' states.
func (e *explainFlags) fromRules(ctx context.Context, paths [][]overrides.Entry, stdout io.Writer) error {
	now := time.Now
	if e.at != "" {
		at, err := time.Parse(time.RFC3339, e.at)
		if err != nil {
			return fmt.Errorf("--at: %w", err)
		}
		now = func() time.Time { return at }
	}
	cfg, err := loadRulesForExplain(e.config)
	if err != nil {
		return err
	}
	store := memstore.New(memstore.Config{SweepInterval: -1})
	defer store.Close()
	dec, err := decide.New(decide.Config{Limiter: sluice.NewLimiter(store), Rules: cfg, Now: now})
	if err != nil {
		return err
	}
	descs := make([]rules.Descriptor, len(paths))
	for i, p := range paths {
		for _, en := range p {
			descs[i].Entries = append(descs[i].Entries, rules.Entry{Key: en.Key, Value: en.Value})
		}
		descs[i].Cost = 1
	}
	out, err := dec.Explain(ctx, e.domain, descs)
	if err != nil {
		return err
	}
	// A fresh store's counters say nothing of a running node's: leave
	// them out rather than show every limit unused.
	for i := range out.Descriptors {
		for j := range out.Descriptors[i].Limits {
			out.Descriptors[i].Limits[j].State = nil
		}
	}
	if out.Capacity != nil {
		out.Capacity.State = nil
	}
	data, err := json.Marshal(out)
	if err != nil {
		return err
	}
	return printJSON(stdout, data)
}

// loadRulesForExplain loads rules as sluice check does: a directory as
// sluice serve reads it, a file with its http section if it has one.
func loadRulesForExplain(path string) (*rules.Config, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	var cfg *rules.Config
	if info.IsDir() {
		cfg, err = reload.LoadWith(path, rules.LoadOptions{})
	} else {
		cfg, _, err = httpconf.LoadFile(path)
	}
	var re *rules.Error
	if errors.As(err, &re) {
		return nil, fmt.Errorf("%s: %d problem(s); sluice check --config %s lists them", path, len(re.Problems), path)
	}
	return cfg, err
}
