package main

// The flag reference, docs/reference: a page per command, generated from
// the FlagSets the commands parse with (command.help), and the test that
// keeps it in step with them.

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/reference from the flag definitions")

// referenceDir is docs/reference, from this package's directory.
const referenceDir = "../../docs/reference"

// regenerate is the one command that rewrites the reference.
const regenerate = "go generate ./cmd/sluice"

// noEnv is an environment with nothing set: the reference shows the
// defaults of the flags, not of the environment it is generated in.
func noEnv(string) (string, bool) { return "", false }

// TestReference: docs/reference is what the flag definitions generate;
// with -update, it is rewritten.
func TestReference(t *testing.T) {
	pages := referencePages()
	if *update {
		if err := os.MkdirAll(referenceDir, 0o755); err != nil {
			t.Fatal(err)
		}
		old, _ := filepath.Glob(filepath.Join(referenceDir, "*.md"))
		for _, path := range old {
			if _, ok := pages[filepath.Base(path)]; !ok {
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
			}
		}
		for name, text := range pages {
			if err := os.WriteFile(filepath.Join(referenceDir, name), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
	for _, name := range slices.Sorted(maps.Keys(pages)) {
		got, err := os.ReadFile(filepath.Join(referenceDir, name))
		if err != nil || string(got) != pages[name] {
			t.Errorf("docs/reference/%s is not what the flag definitions generate (%v): run %s", name, err, regenerate)
		}
	}
	files, _ := filepath.Glob(filepath.Join(referenceDir, "*.md"))
	for _, path := range files {
		if _, ok := pages[filepath.Base(path)]; !ok {
			t.Errorf("docs/reference/%s is no command's page: run %s", filepath.Base(path), regenerate)
		}
	}
}

// TestReferenceListsEveryFlag: each command's page names every flag of
// its FlagSet, with the variables that set it, and the index every page.
func TestReferenceListsEveryFlag(t *testing.T) {
	pages := referencePages()
	for _, name := range slices.Sorted(maps.Keys(commands)) {
		page, ok := pages[name+".md"]
		if !ok {
			t.Errorf("no page for %s", name)
			continue
		}
		if !strings.Contains(pages["README.md"], "("+name+".md)") {
			t.Errorf("the index does not link %s.md", name)
		}
		for _, h := range commandHelps(name) {
			h.fs.VisitAll(func(f *flag.Flag) {
				if !strings.Contains(page, "| `--"+f.Name) {
					t.Errorf("docs/reference/%s.md lacks --%s", name, f.Name)
				}
				if v := h.env.variable(f.Name); v != "" && !strings.Contains(page, "`"+v+"`") {
					t.Errorf("docs/reference/%s.md lacks %s, the variable of --%s", name, v, f.Name)
				}
				if ev, ok := h.env.envoy[f.Name]; ok {
					for _, n := range ev.names {
						if !strings.Contains(page, "`"+n+"`") {
							t.Errorf("docs/reference/%s.md lacks %s, a variable of --%s", name, n, f.Name)
						}
					}
				}
			})
		}
	}
}

// commandHelps are the helps of a command: its own, then its
// subcommands'.
func commandHelps(name string) []*help {
	c := commands[name]
	hs := []*help{c.help(noEnv)}
	if c.subs != nil {
		hs = append(hs, c.subs(noEnv)...)
	}
	return hs
}

// referencePages are the pages of docs/reference by file name: README.md,
// the index, and one per command.
func referencePages() map[string]string {
	pages := map[string]string{}
	var index strings.Builder
	index.WriteString("# Command reference\n\n" + generatedNote + "\n\n")
	index.WriteString("Every command of `sluice`, each flag with its default and the environment\nvariables that set it. `sluice COMMAND --help` shows the flags to start\nwith; `sluice COMMAND --help-all` shows them all.\n\n")
	index.WriteString("| Command | What it does | Environment |\n| --- | --- | --- |\n")
	for _, name := range slices.Sorted(maps.Keys(commands)) {
		hs := commandHelps(name)
		var b strings.Builder
		fmt.Fprintf(&b, "# sluice %s\n\n%s\n", name, generatedNote)
		writeHelpRef(&b, hs[0], "##")
		for _, h := range hs[1:] {
			fmt.Fprintf(&b, "\n## sluice %s\n", h.fs.Name())
			writeHelpRef(&b, h, "###")
		}
		pages[name+".md"] = b.String()
		fmt.Fprintf(&index, "| [`sluice %s`](%s.md) | %s | %s |\n", name, name, mdEscape(commands[name].summary), envSummary(hs))
	}
	pages["README.md"] = index.String()
	return pages
}

// generatedNote heads every page of the reference.
const generatedNote = "Generated from the flag definitions in `cmd/sluice`; do not edit. After\nchanging a flag, run `" + regenerate + "`."

// envSummary says in a few words which variables a command reads.
func envSummary(hs []*help) string {
	env := hs[len(hs)-1].env
	switch {
	case env.all && env.envoy != nil:
		return fmt.Sprintf("every flag, as `SLUICE_` and its name; %d flags also from envoyproxy/ratelimit's variables", len(env.envoy))
	case env.all:
		return "every flag, as `SLUICE_` and its name"
	case len(env.vars) > 0:
		var vs []string
		for _, v := range slices.Sorted(maps.Values(env.vars)) {
			vs = append(vs, "`"+v+"`")
		}
		return strings.Join(vs, ", ")
	}
	return "none"
}

// writeHelpRef writes the reference of one help: its synopsis, what the
// command does, its environment, and a table of the flags of each group
// under a heading of level.
func writeHelpRef(b *strings.Builder, h *help, level string) {
	fmt.Fprintf(b, "\nUsage: `sluice %s`\n", h.synopsis)
	for _, p := range []string{h.about, h.more} {
		writeParagraphs(b, p)
	}
	if h.subsList() != "" {
		b.WriteString("\n" + h.subsList())
	}
	if h.env.note != "" && level == "##" { // a subcommand's is its command's
		fmt.Fprintf(b, "\n%s Environment\n", level)
		writeParagraphs(b, h.env.note)
	}
	groups := h.flagGroups()
	for _, g := range groups {
		if len(g.names) == 0 {
			continue
		}
		fmt.Fprintf(b, "\n%s %s\n", level, g.title)
		b.WriteString("\n| Flag | Default | Description |")
		envCol := h.env.all || len(h.env.vars) > 0
		if envCol {
			b.WriteString(" Environment |")
		}
		b.WriteString("\n| --- | --- | --- |")
		if envCol {
			b.WriteString(" --- |")
		}
		b.WriteString("\n")
		for _, name := range g.names {
			f := h.fs.Lookup(name)
			arg, usage := flag.UnquoteUsage(f)
			flagCell := "`--" + name
			if arg != "" {
				flagCell += " " + arg
			}
			def := ""
			if f.DefValue != "" {
				def = "`" + f.DefValue + "`"
			}
			fmt.Fprintf(b, "| %s` | %s | %s |", flagCell, def, mdEscape(usage))
			if envCol {
				fmt.Fprintf(b, " %s |", envCell(h.env, name))
			}
			b.WriteString("\n")
		}
	}
}

// subsList is, for sluice override, the list of its subcommands.
func (h *help) subsList() string {
	if h.fs.Name() != "override" {
		return ""
	}
	var b strings.Builder
	b.WriteString("Subcommands:\n\n")
	for _, s := range overrideSubcommands {
		fmt.Fprintf(&b, "- [`sluice override %s`](#sluice-override-%s): `sluice override %s %s`\n", s.name, s.name, s.name, s.synopsis)
	}
	return b.String()
}

// envCell says which variables set the flag name, and how.
func envCell(env envReading, name string) string {
	v := env.variable(name)
	if v == "" {
		return ""
	}
	cell := "`" + v + "`"
	if ev, ok := env.envoy[name]; ok {
		var names []string
		for _, n := range ev.names {
			names = append(names, "`"+n+"`")
		}
		cell += "; then envoyproxy/ratelimit's " + strings.Join(names, ", ")
		if ev.note != "" {
			cell += ": " + mdEscape(ev.note)
		}
	}
	return cell
}

// writeParagraphs writes text, hard-wrapped, as Markdown paragraphs; a
// paragraph of lines indented by two spaces is code.
func writeParagraphs(b *strings.Builder, text string) {
	for _, p := range strings.Split(strings.TrimSpace(text), "\n\n") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		if strings.HasPrefix(p, "{") { // an indented example, its indent trimmed
			fmt.Fprintf(b, "\n`%s`\n", p)
			continue
		}
		fmt.Fprintf(b, "\n%s\n", mdEscape(strings.Join(strings.Fields(p), " ")))
	}
}

// mdEscape escapes what Markdown would read as markup in plain text:
// emphasis, tags, table cells, code; an underscore only where it does not
// join two word characters (SLUICE_CONFIG stays as it is).
func mdEscape(s string) string {
	word := func(i int) bool {
		if i < 0 || i >= len(s) {
			return false
		}
		c := s[i]
		return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '<':
			b.WriteString("&lt;")
		case c == '>':
			b.WriteString("&gt;")
		case strings.IndexByte("*|`\\", c) >= 0, c == '_' && !(word(i-1) && word(i+1)):
			b.WriteByte('\\')
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}
