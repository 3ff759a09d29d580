package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/base/redact"
	"github.com/sluicehq/sluice/internal/decision/overrides"
)

func init() {
	commands["override"] = command{
		summary: "set, get, list, rm, import or export runtime overrides",
		run:     cmdOverride,
		help: func(lookupEnv) *help {
			h := newHelp("override", "override SUBCOMMAND [flags]", overrideAbout)
			h.env = adminEnv
			return h
		},
		subs: func(env lookupEnv) []*help {
			var hs []*help
			for i := range overrideSubcommands {
				h, _ := overrideHelp(&overrideSubcommands[i], env)
				hs = append(hs, h)
			}
			return hs
		},
	}
}

// adminClient talks to a server's admin API.
type adminClient struct {
	server string
	token  string
	http   *http.Client
}

// adminFlags adds --server and --token-file to fs, their defaults from
// the variables of adminEnv when set in env.
func adminFlags(fs *flag.FlagSet, env lookupEnv) (server, tokenFile *string) {
	server = fs.String("server", envOr(env, adminEnv.vars["server"], "http://127.0.0.1:9091"), "`URL` of the server's admin API (--admin-addr)")
	tokenFile = fs.String("token-file", envOr(env, adminEnv.vars["token-file"], ""), "`file` holding the bearer token (the first of an --admin-token-file)")
	return server, tokenFile
}

// adminEnv is how the clients of the admin API read the environment.
var adminEnv = envReading{
	brief: "--server and --token-file default to SLUICE_ADMIN_URL and SLUICE_ADMIN_TOKEN_FILE.",
	note:  "--server and --token-file default to SLUICE_ADMIN_URL and SLUICE_ADMIN_TOKEN_FILE when they are set; no other flag reads the environment.",
	vars:  map[string]string{"server": "SLUICE_ADMIN_URL", "token-file": "SLUICE_ADMIN_TOKEN_FILE"},
}

// envOr is the variable name of env, or def when it is unset or empty.
func envOr(env lookupEnv, name, def string) string {
	if v, _ := env(name); v != "" {
		return v
	}
	return def
}

func newAdminClient(server, tokenFile string) (*adminClient, error) {
	if err := checkServerURL(server); err != nil {
		return nil, err
	}
	if tokenFile == "" {
		return nil, errors.New("--token-file is required")
	}
	tokens, err := overrides.LoadTokens(tokenFile)
	if err != nil {
		return nil, err
	}
	return &adminClient{server: strings.TrimSuffix(server, "/"), token: string(tokens[0].Secret), http: &http.Client{Timeout: time.Minute}}, nil
}

// checkServerURL checks --server, and shows it with its userinfo masked
// (redact.Value), never what url.Parse quotes of it: the errors of the
// requests, which name the URL, come after.
func checkServerURL(server string) error {
	u, err := url.Parse(server)
	switch {
	case err != nil:
		return fmt.Errorf("--server %q: %s", redact.Value(server), redact.URLError(err))
	case strings.Contains(server, "@"):
		// Userinfo, or a password with a '/' (not percent-encoded) whose
		// first part url.Parse took for the host, to be dialled.
		return fmt.Errorf("--server %q: credentials in the URL are not used: the admin API takes the bearer token of --token-file", redact.Value(server))
	case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
		return fmt.Errorf("--server %q: want http:// or https:// and a host", server)
	}
	return nil
}

// do sends a request and returns the body of a 2xx answer; any other
// answer is an error with the server's message.
func (c *adminClient) do(ctx context.Context, method, path string, body io.Reader) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.server+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error    string   `json:"error"`
			Field    string   `json:"field"`
			Problems []string `json:"problems"`
		}
		if json.Unmarshal(out, &e) == nil && e.Error != "" {
			msg := e.Error
			if len(e.Problems) > 0 {
				msg += ":\n  " + strings.Join(e.Problems, "\n  ")
			}
			return nil, fmt.Errorf("%s (%d)", msg, resp.StatusCode)
		}
		return nil, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(out)))
	}
	return out, nil
}

func adminTarget(domain, path string) string {
	return "?domain=" + url.QueryEscape(domain) + "&path=" + url.QueryEscape(path)
}

// overrideSubcommand is a subcommand of sluice override, with the
// synopsis and the text of its usage.
type overrideSubcommand struct{ name, synopsis, about string }

// overrideSubcommands are the subcommands of sluice override, in the
// order of its usage.
var overrideSubcommands = []overrideSubcommand{
	{"set", "--domain D --path P --limit JSON [flags]",
		"Sets the override of a domain and descriptor path: its limit replaces the\nrules' for the descriptors the path matches, on every node, until it\nexpires or is removed. Prints the change."},
	{"get", "--domain D --path P [flags]", "Prints the override of a domain and descriptor path."},
	{"list", "[--domain D] [--prefix P] [flags]", "Prints the overrides, one a line: those of --domain (of every domain\nwhen empty) whose paths start with --prefix."},
	{"rm", "--domain D --path P [flags]", "Removes the override of a domain and descriptor path. Prints the change."},
	{"import", "[flags] [FILE]", "Puts the overrides of FILE (stdin when absent or -), one JSON object a\nline, as export writes them: all of them if every line is valid, else\nnone."},
	{"export", "[flags]", "Prints every override, one JSON object a line, as import reads them."},
}

// overrideAbout is what sluice override does.
const overrideAbout = `Sets, reads and removes the runtime overrides of a server through its admin
API (sluice serve --admin-addr), with a token of its --admin-token-file.
docs/overrides.md has the details.`

// overrideUsage is the usage of sluice override itself.
func overrideUsage() string {
	var b strings.Builder
	b.WriteString("Usage: sluice override SUBCOMMAND [flags]\n\n" + overrideAbout + "\n\nSubcommands:\n")
	for _, s := range overrideSubcommands {
		fmt.Fprintf(&b, "  sluice override %-7s %s\n", s.name, s.synopsis)
	}
	b.WriteString("\nRun \"sluice override SUBCOMMAND --help\" for the flags of one.\n")
	return b.String()
}

// cmdOverride runs one subcommand of sluice override: its flags, then the
// admin API's answer.
func cmdOverride(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) > 1 && args[0] == "help" { // sluice override help SUBCOMMAND
		return cmdOverride(ctx, []string{args[1], "--help"}, stdin, stdout, stderr)
	}
	sub, err := overrideSubcommandOf(args, stderr)
	if err != nil {
		return err
	}
	h, f := overrideHelp(sub, os.LookupEnv)
	fs := h.fs
	if err := h.parse(args[1:], sub.name == "import", stderr); err != nil {
		return err
	}
	c, err := newAdminClient(*f.server, *f.tokenFile)
	if err != nil {
		return err
	}
	switch sub.name {
	case "set":
		return f.set(ctx, c, stdout)
	case "get":
		return c.print(ctx, stdout, "GET", "/v1/override"+adminTarget(*f.domain, *f.path), nil)
	case "rm":
		return c.print(ctx, stdout, "DELETE", "/v1/override"+adminTarget(*f.domain, *f.path), nil)
	case "list":
		return f.list(ctx, c, stdout)
	case "import":
		return overrideImport(ctx, c, fs.Args(), stdin, stdout)
	case "export":
		out, err := c.do(ctx, "GET", "/v1/overrides/export", nil)
		if err != nil {
			return err
		}
		_, err = stdout.Write(out)
		return err
	}
	return nil
}

// overrideSubcommandOf is the subcommand args name; a *helpError for
// help, errUsage (its usage written to stderr) for none or an unknown one.
func overrideSubcommandOf(args []string, stderr io.Writer) (*overrideSubcommand, error) {
	if len(args) == 0 {
		fmt.Fprint(stderr, overrideUsage())
		return nil, errUsage
	}
	switch args[0] {
	case "help", "-h", "-help", "--help", "-help-all", "--help-all":
		return nil, &helpError{usage: overrideUsage()}
	}
	i := slices.IndexFunc(overrideSubcommands, func(s overrideSubcommand) bool { return s.name == args[0] })
	if i < 0 {
		fmt.Fprintf(stderr, "sluice override: unknown subcommand %q (set, get, list, rm, import, export)\n", args[0])
		fmt.Fprintln(stderr, "Run 'sluice override -h' for its usage.")
		return nil, errUsage
	}
	return &overrideSubcommands[i], nil
}

// overrideFlags are the flags of one override subcommand; those it does
// not take are nil.
type overrideFlags struct {
	server, tokenFile                          *string
	domain, path, limit, expires, note, prefix *string
	ttl                                        *time.Duration
	pageSize                                   *int
}

// overrideHelp builds the flags of the subcommand sub, with the defaults
// env gives.
func overrideHelp(sub *overrideSubcommand, env lookupEnv) (*help, *overrideFlags) {
	h := newHelp("override "+sub.name, "override "+sub.name+" "+sub.synopsis, sub.about)
	h.env = adminEnv
	return h, newOverrideFlags(h.fs, sub.name, env)
}

// newOverrideFlags defines on fs the flags of subcommand sub.
func newOverrideFlags(fs *flag.FlagSet, sub string, env lookupEnv) *overrideFlags {
	f := new(overrideFlags)
	f.server, f.tokenFile = adminFlags(fs, env)
	if sub != "import" && sub != "export" {
		f.domain = fs.String("domain", "", "the `domain`")
	}
	if sub == "set" || sub == "get" || sub == "rm" {
		f.path = fs.String("path", "", "the descriptor `path`: key=value pairs joined by /, values exact, * or a prefix ending in * (tenant=acme/user=*); in a key or value, write % as %25 and / as %2F")
	}
	switch sub {
	case "set":
		f.limit = fs.String("limit", "", `the limit as `+"`JSON`"+`, with a rules file's rate_limit keys: '{"unit":"minute","requests_per_unit":100}', '{"unlimited":true}' or '{"blocked":true}'`)
		f.expires = fs.String("expires", "", "when the override ends, RFC 3339 (2026-12-31T00:00:00Z); none when empty")
		f.ttl = fs.Duration("ttl", 0, "or how long from now the override lasts")
		f.note = fs.String("note", "", "a note kept with the override")
	case "list":
		f.prefix = fs.String("prefix", "", "only paths starting with this, written as --path is")
		f.pageSize = fs.Int("page", 1000, "overrides asked for per request")
	}
	return f
}

// set sends the override of the flags, checked first so that each error
// names its flag.
func (f *overrideFlags) set(ctx context.Context, c *adminClient, stdout io.Writer) error {
	p, err := overrides.ParsePath(*f.path)
	if err != nil {
		return flagErrors(err)
	}
	if err := checkLimitFlag(*f.limit); err != nil {
		return err
	}
	o := overrides.Override{Domain: *f.domain, Path: p, Limit: json.RawMessage(*f.limit), Note: *f.note}
	switch {
	case *f.expires != "" && *f.ttl != 0:
		return errors.New("--expires and --ttl exclude each other")
	case *f.expires != "":
		t, err := time.Parse(time.RFC3339, *f.expires)
		if err != nil {
			return fmt.Errorf("--expires: %w", err)
		}
		o.Expires = &t
	case *f.ttl != 0:
		t := time.Now().Add(*f.ttl).UTC()
		o.Expires = &t
	}
	// The server checks it too; here each error names its flag.
	if err := o.Compile(); err != nil {
		return flagErrors(err)
	}
	body, err := json.Marshal(&o)
	if err != nil {
		return err
	}
	return c.print(ctx, stdout, "PUT", "/v1/override", bytes.NewReader(body))
}

// list prints the overrides the flags select, one JSON object a line,
// asking for them a page at a time.
func (f *overrideFlags) list(ctx context.Context, c *adminClient, stdout io.Writer) error {
	after := ""
	for {
		q := url.Values{"domain": {*f.domain}, "prefix": {*f.prefix}, "limit": {fmt.Sprint(*f.pageSize)}, "after": {after}}
		out, err := c.do(ctx, "GET", "/v1/overrides?"+q.Encode(), nil)
		if err != nil {
			return err
		}
		var page struct {
			Overrides []json.RawMessage `json:"overrides"`
			Next      string            `json:"next"`
		}
		if err := json.Unmarshal(out, &page); err != nil {
			return err
		}
		for _, o := range page.Overrides {
			fmt.Fprintln(stdout, string(o))
		}
		if page.Next == "" {
			return nil
		}
		after = page.Next
	}
}

// overrideImport sends the overrides of the file args name (stdin for
// none or "-").
func overrideImport(ctx context.Context, c *adminClient, args []string, stdin io.Reader, stdout io.Writer) error {
	in := stdin
	if len(args) > 1 {
		return fmt.Errorf("import takes one file (or - for stdin), got %d", len(args))
	}
	if len(args) == 1 && args[0] != "-" {
		f, err := os.Open(args[0])
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	return c.print(ctx, stdout, "POST", "/v1/overrides/import", in)
}

// limitExample is a limit as --limit takes it.
const limitExample = `'{"unit":"minute","requests_per_unit":100}'`

// checkLimitFlag checks that --limit is given and is JSON, in words that
// name it.
func checkLimitFlag(limit string) error {
	if strings.TrimSpace(limit) == "" {
		return errors.New("--limit is required: the limit as JSON, such as " + limitExample + `, '{"unlimited":true}' or '{"blocked":true}'`)
	}
	var v any
	if err := json.Unmarshal([]byte(limit), &v); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return fmt.Errorf("--limit is not valid JSON (at character %d: %v): write it as %s, every key and word in double quotes, and quote the whole in single quotes for the shell", se.Offset, err, limitExample)
		}
		return fmt.Errorf("--limit is not valid JSON (%v): write it as %s", err, limitExample)
	}
	if _, ok := v.(map[string]any); !ok {
		return fmt.Errorf("--limit is %s, not a JSON object: write it as %s", strings.TrimSpace(limit), limitExample)
	}
	return nil
}

// flagErrors names the flag of each field an override's validation
// names: "limit: ..." is "--limit: ...".
func flagErrors(err error) error {
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{err}
	}
	out := make([]error, len(errs))
	for i, e := range errs {
		out[i] = e
		var fe *overrides.FieldError
		if !errors.As(e, &fe) {
			continue
		}
		root := fe.Field
		if n := strings.IndexAny(root, ".["); n >= 0 {
			root = root[:n]
		}
		switch root {
		case "domain", "path", "limit", "note":
			where := "--" + root
			if fe.Field != root {
				where += " (" + fe.Field + ")"
			}
			out[i] = errors.New(where + ": " + fe.Msg)
		}
	}
	return errors.Join(out...)
}

// print sends a request to the admin API and writes its JSON answer
// indented.
func (c *adminClient) print(ctx context.Context, w io.Writer, method, path string, body io.Reader) error {
	out, err := c.do(ctx, method, path, body)
	if err != nil {
		return err
	}
	return printJSON(w, out)
}

// printJSON writes a JSON answer indented.
func printJSON(w io.Writer, data []byte) error {
	var b bytes.Buffer
	if err := json.Indent(&b, bytes.TrimSpace(data), "", "  "); err != nil {
		_, err = w.Write(data)
		return err
	}
	b.WriteByte('\n')
	_, err := w.Write(b.Bytes())
	return err
}
