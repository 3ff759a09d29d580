package main

// The help of every command, in one style: --help shows what a newcomer
// needs first, --help-all every flag with its default and its environment
// variables, and docs/reference (reference.go) the same as Markdown, all
// from the command's own FlagSet.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// help is a command's FlagSet and what its --help, its --help-all and its
// page of docs/reference say about it. Each command builds it with its
// flags bound to its settings, so that the help, the reference and the
// parse share one FlagSet.
type help struct {
	fs       *flag.FlagSet
	synopsis string // after "Usage: sluice "
	about    string // what the command does, in a few lines
	more     string // the details, for --help-all and the reference
	env      envReading
	groups   []flagGroup  // in the order of the help; nil: one, "Flags"
	first    []briefGroup // what --help shows; nil: every flag, in groups
}

// flagGroup is a heading of a command's flags and the flags under it.
type flagGroup struct {
	title string
	names []string // sorted
}

// briefGroup is a heading of --help and the flags under it, each with
// the few words --help shows.
type briefGroup struct {
	title string
	flags []briefFlag
}

// briefFlag is a flag --help shows, with the few words it shows.
type briefFlag struct{ name, brief string }

// envReading is how a command reads the environment.
type envReading struct {
	brief string              // in a few words, for --help
	note  string              // in words, for --help-all and the reference
	all   bool                // every flag from envName, after the command line
	envoy map[string]envoyVar // then these variables of envoyproxy/ratelimit
	vars  map[string]string   // without all: the variable of each flag that has one
}

// variable is the environment variable of flag name; "" for none.
func (e envReading) variable(name string) string {
	if e.all {
		return envName(name)
	}
	return e.vars[name]
}

// newHelp starts the help of the command name ("serve", "override set").
func newHelp(name, synopsis, about string) *help {
	h := &help{fs: flag.NewFlagSet(name, flag.ContinueOnError), synopsis: synopsis, about: about}
	h.fs.Usage = func() { h.writeShort(h.fs.Output()) }
	return h
}

// group defines on h.fs the flags of define under the heading title.
func (h *help) group(title string, define func(fs *flag.FlagSet)) {
	had := map[string]bool{}
	h.fs.VisitAll(func(f *flag.Flag) { had[f.Name] = true })
	define(h.fs)
	g := flagGroup{title: title}
	h.fs.VisitAll(func(f *flag.Flag) {
		if !had[f.Name] {
			g.names = append(g.names, f.Name)
		}
	})
	h.groups = append(h.groups, g)
}

// flagGroups are the groups of h, or one group of every flag.
func (h *help) flagGroups() []flagGroup {
	if h.groups != nil {
		return h.groups
	}
	g := flagGroup{title: "Flags"}
	h.fs.VisitAll(func(f *flag.Flag) { g.names = append(g.names, f.Name) })
	if g.names == nil {
		return nil
	}
	return []flagGroup{g}
}

// parse parses args into h.fs as parseFlagsArgs does, writing errors
// and hints to stderr; --help-all is a request for the whole help.
func (h *help) parse(args []string, positional bool, stderr io.Writer) error {
	h.fs.SetOutput(stderr)
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "--help-all" || a == "-help-all" {
			var b strings.Builder
			h.writeAll(&b)
			return &helpError{usage: b.String()}
		}
	}
	return parseFlagsArgs(h.fs, args, positional)
}

// helpWidth is the width the help is wrapped to.
const helpWidth = 80

// writeShort writes --help: the synopsis, what the command does, the
// first flags (every flag when h.first is nil) in their groups, one line
// each, and where the rest are.
func (h *help) writeShort(w io.Writer) {
	fmt.Fprintf(w, "Usage: sluice %s\n", h.synopsis)
	if h.about != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(h.about))
	}
	first := h.first
	if first == nil {
		for _, g := range h.flagGroups() {
			b := briefGroup{title: g.title}
			for _, name := range g.names {
				b.flags = append(b.flags, briefFlag{name: name})
			}
			first = append(first, b)
		}
	}
	type row struct{ flag, text string }
	groups := make([][]row, len(first))
	shown, width := 0, 0
	for i, g := range first {
		for _, b := range g.flags {
			f := h.fs.Lookup(b.name)
			arg, usage := flag.UnquoteUsage(f)
			if b.brief != "" {
				usage = b.brief
			}
			if d := shortDefault(f); d != "" {
				usage += " (default " + d + ")"
			}
			r := row{flag: "--" + b.name, text: usage}
			if arg != "" {
				r.flag += " " + arg
			}
			width = max(width, len(r.flag))
			groups[i] = append(groups[i], r)
			shown++
		}
	}
	col := min(width, 24) + 4 // the column of the texts
	for i, rows := range groups {
		fmt.Fprintf(w, "\n%s:\n", first[i].title)
		for _, r := range rows {
			lines := wrap(r.text, helpWidth-col)
			if len(r.flag)+4 > col {
				fmt.Fprintf(w, "  %s\n%s%s\n", r.flag, strings.Repeat(" ", col), lines[0])
			} else {
				fmt.Fprintf(w, "  %-*s%s\n", col-2, r.flag, lines[0])
			}
			for _, l := range lines[1:] {
				fmt.Fprintf(w, "%s%s\n", strings.Repeat(" ", col), l)
			}
		}
	}
	if h.env.brief != "" {
		fmt.Fprintf(w, "\n%s\n", strings.Join(wrap(h.env.brief, helpWidth), "\n"))
	}
	name := h.fs.Name()
	page := strings.Fields(name)[0] // sluice override's subcommands share a page
	switch n := flagCount(h.fs); {
	case shown < n:
		fmt.Fprintf(w, "\n%d more flags, and the variables of each: \"sluice %s --help-all\",\nor docs/reference/%s.md.\n", n-shown, name, page)
	case h.more != "":
		fmt.Fprintf(w, "\nMore in \"sluice %s --help-all\", or docs/reference/%s.md.\n", name, page)
	}
}

// shortDefault is the default of f as --help shows it: bare unless it
// is empty or has spaces; "" when it is the zero of its type.
func shortDefault(f *flag.Flag) string {
	d := defaultNote(f)
	if d == "" {
		return ""
	}
	if v := shownValue(f.Name, f.DefValue); !strings.ContainsAny(v, " \t") {
		return v
	}
	return fmt.Sprintf("%q", shownValue(f.Name, f.DefValue))
}

// writeAll writes --help-all: the synopsis, what the command does in
// full, and every flag in its group with its default and its variables.
func (h *help) writeAll(w io.Writer) {
	fmt.Fprintf(w, "Usage: sluice %s\n", h.synopsis)
	for _, p := range []string{h.about, h.more, strings.Join(wrap(h.env.note, helpWidth), "\n")} {
		if p = strings.TrimSpace(p); p != "" {
			fmt.Fprintf(w, "\n%s\n", p)
		}
	}
	for _, g := range h.flagGroups() {
		fmt.Fprintf(w, "\n%s:\n", g.title)
		for _, name := range g.names {
			f := h.fs.Lookup(name)
			arg, usage := flag.UnquoteUsage(f)
			fmt.Fprintf(w, "  --%s", name)
			if arg != "" {
				fmt.Fprintf(w, " %s", arg)
			}
			fmt.Fprintln(w)
			lines := wrap(usage+defaultNote(f), helpWidth-6)
			if v := h.env.variable(name); v != "" {
				env := "env: " + v
				if ev, ok := h.env.envoy[name]; ok {
					env += ", then envoyproxy/ratelimit's " + strings.Join(ev.names, ", ")
				}
				lines = append(lines, wrap(env, helpWidth-6)...)
			}
			for _, l := range lines {
				fmt.Fprintf(w, "      %s\n", l)
			}
		}
	}
}

// defaultNote is " (default X)" for a flag whose default is not its zero,
// X masked as shownValue does: a default may come from the environment
// (sluice explain's --server from SLUICE_ADMIN_URL).
func defaultNote(f *flag.Flag) string {
	switch f.DefValue {
	case "", "false", "0", "0s":
		return ""
	}
	return fmt.Sprintf(" (default %q)", shownValue(f.Name, f.DefValue))
}

// flagCount is the number of flags of fs.
func flagCount(fs *flag.FlagSet) int {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n
}

// wrap breaks text into lines of at most width, between words; a word
// longer than width has a line of its own. It returns at least one line.
func wrap(text string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(text) {
		switch {
		case line == "":
			line = word
		case len(line)+1+len(word) <= width:
			line += " " + word
		default:
			lines = append(lines, line)
			line = word
		}
	}
	return append(lines, line)
}

// parseFlagsArgs parses args, rejecting positional arguments unless
// positional, and maps -h to a *helpError carrying the usage.
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

// usageHint prints, after a usage error, where the usage is.
func usageHint(fs *flag.FlagSet) {
	fmt.Fprintf(fs.Output(), "Run 'sluice %s -h' for its flags.\n", fs.Name())
}
