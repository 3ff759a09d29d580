package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// The user docs' own rules (see userDocs): they stay short enough to read,
// they speak to users rather than to the people who built sluice, and
// their links lead somewhere.

// maxWords bounds README.md and docs/*.md together, counted as wc -w
// counts: runs of non-space characters.
const maxWords = 20000

func TestDocsWordCount(t *testing.T) {
	total := 0
	var counts []string
	for _, doc := range userDocs(t) {
		n := wordCount(readDoc(t, doc))
		total += n
		counts = append(counts, filepath.Base(doc)+" "+strconv.Itoa(n))
	}
	if total > maxWords {
		t.Errorf("the user docs hold %d words, more than %d:\n%s", total, maxWords, strings.Join(counts, "\n"))
	}
}

// TestDocsNoIssuesOrHashes: issue numbers of ours and commit hashes belong
// in docs/internals/, where contributors read them.
func TestDocsNoIssuesOrHashes(t *testing.T) {
	for _, doc := range userDocs(t) {
		for i, line := range strings.Split(readDoc(t, doc), "\n") {
			for _, m := range issueRefs(line) {
				t.Errorf("%s:%d: an issue number of ours, %q: move it to docs/internals/ or say what it means", doc, i+1, m)
			}
			for _, m := range commitHashes(line) {
				t.Errorf("%s:%d: a commit hash, %q: move it to docs/internals/", doc, i+1, m)
			}
		}
	}
}

// TestDocsLinks: every relative link of the user docs names a file that
// exists, and a heading of it when it names an anchor.
func TestDocsLinks(t *testing.T) {
	for _, doc := range userDocs(t) {
		for _, p := range brokenLinks(doc, readDoc(t, doc), exists, headingAnchors) {
			t.Error(p)
		}
	}
}

func readDoc(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func wordCount(text string) int { return len(strings.Fields(text)) }

var (
	// "issue 12", "Issues 3 and 4", "issue #12", unless a repository
	// (owner/name, or owner/name's) comes just before.
	issueWord = regexp.MustCompile(`(?i)(\S+\s+)?\bissues?\s+#?\d+`)
	// "#12" where the # starts a word: a peer's is written owner/name#12
	// or name#12, a link's anchor ](#...).
	hashNumber = regexp.MustCompile(`(^|[^\w/.\-\]])\(?#\d+\b`)
	// 7 to 40 hex digits standing alone (not in a word, a path, a UUID).
	hexWord   = regexp.MustCompile(`[0-9a-fA-F]{7,40}`)
	repoOwner = regexp.MustCompile(`^[\w.-]+/[\w.-]+('s)?\s+$`)
)

// issueRefs returns the references to issues of ours in line.
func issueRefs(line string) []string {
	var out []string
	for _, m := range issueWord.FindAllStringSubmatch(line, -1) {
		if m[1] != "" && repoOwner.MatchString(m[1]) {
			continue
		}
		out = append(out, strings.TrimSpace(strings.TrimPrefix(m[0], m[1])))
	}
	for _, m := range hashNumber.FindAllStringIndex(line, -1) {
		// A link's anchor, [text](#12-heading), is no issue.
		h := m[0] + strings.IndexByte(line[m[0]:m[1]], '#')
		if h >= 2 && line[h-2:h] == "](" {
			continue
		}
		// "issue #12" is found above.
		if before := strings.ToLower(strings.TrimRight(line[:h], " \t")); strings.HasSuffix(before, "issue") || strings.HasSuffix(before, "issues") {
			continue
		}
		out = append(out, line[h:m[1]])
	}
	return out
}

// commitHashes returns the words of line that look like commit hashes:
// 7 to 40 hex digits with at least one digit and one letter, not part of
// a longer word, path or identifier.
func commitHashes(line string) []string {
	var out []string
	for _, m := range hexWord.FindAllStringIndex(line, -1) {
		if m[0] > 0 && partOfWord(line[m[0]-1]) || m[1] < len(line) && partOfWord(line[m[1]]) {
			continue
		}
		w := line[m[0]:m[1]]
		if strings.ContainsAny(w, "0123456789") && strings.IndexFunc(w, unicode.IsLetter) >= 0 {
			out = append(out, w)
		}
	}
	return out
}

// partOfWord: a character that joins a hex run to a longer token.
func partOfWord(c byte) bool {
	return c == '_' || c == '-' || c == '/' ||
		'0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

var (
	mdLink     = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	inlineCode = regexp.MustCompile("`[^`]*`")
)

// brokenLinks returns a problem for each relative link of the Markdown
// text of path (outside code) whose file does not exist, or whose anchor
// is no heading of that file.
func brokenLinks(path, text string, exists func(string) bool, anchors func(string) []string) []string {
	var out []string
	inFence := false
	for i, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		line = inlineCode.ReplaceAllString(line, "")
		for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			where := path
			if file != "" {
				where = filepath.Join(filepath.Dir(path), file)
				if !exists(where) {
					out = append(out, path+":"+strconv.Itoa(i+1)+": "+target+": no such file")
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(where, ".md") && !slices.Contains(anchors(where), anchor) {
				out = append(out, path+":"+strconv.Itoa(i+1)+": "+target+": no such heading in "+where)
			}
		}
	}
	return out
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// headingAnchors returns the anchors GitHub gives the headings of the
// Markdown file path.
func headingAnchors(path string) []string {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	return anchorsOf(string(data))
}

// anchorsOf returns GitHub's anchors of the headings of a Markdown text:
// lower case, punctuation but - and _ dropped, spaces made -, and -1, -2,
// … added to repeats.
func anchorsOf(text string) []string {
	var out []string
	seen := map[string]int{}
	inFence := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteByte('-')
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out = append(out, a+"-"+strconv.Itoa(n))
		} else {
			out = append(out, a)
		}
		seen[a]++
	}
	return out
}

// TestDocsChecksCanFail feeds each check what it must find, and what it
// must let pass.
func TestDocsChecksCanFail(t *testing.T) {
	for _, tc := range []struct {
		line   string
		issues int
		hashes int
	}{
		{"as issue 12 asked", 1, 0},
		{"Issue 3 sets three targets", 1, 0},
		{"issues 11 and 12", 1, 0},
		{"see issue #7", 1, 0},
		{"fixed in #12.", 1, 0},
		{"(#12)", 1, 0},
		{"#12 first", 1, 0},
		{"envoyproxy/ratelimit#348", 0, 0},
		{"envoyproxy/ratelimit issue 348", 0, 0},
		{"envoyproxy/ratelimit's issue 348", 0, 0},
		{"ratelimit#427", 0, 0},
		{"[the section](#2-rules)", 0, 0},
		{"no issues here", 0, 0},
		{"measured at e940452 and 6ee3bda", 0, 2},
		{"commit 3a172c43e2b04aabb5730a7a2d67150001e37fd6", 0, 1},
		{"dates: 2026-11-28, 12345678", 0, 0},
		{"deadbeef", 0, 0},
		{"a 64-digit sha256 c78bc04f5ec75c74077247e0ac7741714e67e1192512398b0edb74af83f659e0", 0, 0},
		{"uuid 550e8400-e29b-41d4-a716-446655440000", 0, 0},
		{"a word: feedface12x, 0x1f2e3d4c", 0, 0},
	} {
		if got := issueRefs(tc.line); len(got) != tc.issues {
			t.Errorf("issueRefs(%q) = %q, want %d", tc.line, got, tc.issues)
		}
		if got := commitHashes(tc.line); len(got) != tc.hashes {
			t.Errorf("commitHashes(%q) = %q, want %d", tc.line, got, tc.hashes)
		}
	}

	if n := wordCount("two  words\n\tand three more "); n != 5 {
		t.Errorf("wordCount = %d, want 5", n)
	}

	files := map[string]string{
		"d/a.md":     "# Title\n\n## The Rate Limit Quota Service (RLQS)\n\n## Notes\n\n## Notes\n",
		"d/img.png":  "",
		"d/sub/b.md": "# B\n",
	}
	fileExists := func(p string) bool { _, ok := files[filepath.ToSlash(p)]; return ok }
	fileAnchors := func(p string) []string { return anchorsOf(files[filepath.ToSlash(p)]) }
	for _, tc := range []struct {
		text   string
		broken int
	}{
		{"[a](a.md) [b](sub/b.md) ![i](img.png) [web](https://example.com/x.md)", 0},
		{"[q](a.md#the-rate-limit-quota-service-rlqs) [n](a.md#notes-1) [t](#title)", 0},
		{"[gone](gone.md)", 1},
		{"[up](../a.md)", 1},
		{"[x](a.md#no-such-heading)", 1},
		{"[x](#nowhere)", 1},
		{"`[in code](gone.md)`", 0},
		{"```\n[in a fence](gone.md)\n```", 0},
	} {
		if got := brokenLinks("d/a.md", tc.text, fileExists, fileAnchors); len(got) != tc.broken {
			t.Errorf("brokenLinks(%q) = %q, want %d", tc.text, got, tc.broken)
		}
	}
}
