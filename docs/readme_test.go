package docs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestReadmeGo runs every Go block of README.md as the whole program it
// must be (a reader pastes it into a main.go): each builds against this
// module, runs, and prints what its // Output: comment says.
func TestReadmeGo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds programs")
	}
	t.Parallel()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command: %v", err)
	}
	n := 0
	for _, b := range blocks(t, filepath.Join("..", "README.md")) {
		if b.lang != "go" {
			continue
		}
		n++
		t.Run("line"+strconv.Itoa(b.line), func(t *testing.T) {
			want, ok := expectedOutput(b.text)
			if !ok {
				t.Fatalf("README.md:%d: a Go block without // Output:", b.line)
			}
			// A directory of the module (so that it builds against this
			// tree) that ./... ignores (its name starts with _).
			dir, err := os.MkdirTemp(".", "_readme")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(b.text), 0o644); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, goCmd, "run", "./"+filepath.Base(dir))
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("README.md:%d: go run: %v\n%s", b.line, err, out)
			}
			if got := strings.TrimSpace(string(out)); got != want {
				t.Errorf("README.md:%d: printed\n%s\nwant\n%s", b.line, got, want)
			}
		})
	}
	if n == 0 {
		t.Fatal("README.md has no Go block")
	}
}

// expectedOutput returns the lines of the // Output: comment at the end
// of a program's main, as an Example's.
func expectedOutput(src string) (string, bool) {
	_, after, ok := strings.Cut(src, "// Output:\n")
	if !ok {
		return "", false
	}
	var lines []string
	for _, l := range strings.Split(after, "\n") {
		l = strings.TrimSpace(l)
		text, ok := strings.CutPrefix(l, "//")
		if !ok {
			break
		}
		lines = append(lines, strings.TrimSpace(text))
	}
	return strings.Join(lines, "\n"), true
}
