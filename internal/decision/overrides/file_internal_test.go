package overrides

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rules"
)

func put(t *testing.T, s *FileStore, path, limit string, expires *time.Time) {
	t.Helper()
	p, err := ParsePath(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(&Override{Domain: "api", Path: p, Limit: json.RawMessage(limit), Expires: expires}, "test"); err != nil {
		t.Fatal(err)
	}
}

func ids(s *FileStore) []string {
	var out []string
	for _, o := range s.List() {
		out = append(out, o.ID())
	}
	return out
}

// copyDir copies every file of dir into a new directory: what a crash at
// this moment leaves on disk (every write here was synced).
func copyDir(t *testing.T, dir string) string {
	t.Helper()
	out := t.TempDir()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(out, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestFileStore: changes survive a reopen; a crash in the middle of a
// compaction (the new file written, not yet renamed) loses nothing; a
// torn last line is dropped; expired overrides are swept.
func TestFileStore(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "overrides.jsonl")
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	s, err := OpenFile(file, NewIndex(clock), clock)
	if err != nil {
		t.Fatal(err)
	}
	lim := `{"unit":"minute","requests_per_unit":10}`
	for i := range 600 {
		put(t, s, fmt.Sprintf("tenant=t%d", i), lim, nil)
	}
	for i := range 500 {
		if _, err := s.Delete("api", []Entry{{"tenant", fmt.Sprintf("t%d", i)}}, "test"); err != nil {
			t.Fatal(err)
		}
	}
	// 1,100 lines for 100 live: the log was compacted on the way.
	if s.entries >= 1100 {
		t.Errorf("%d lines in the log for %d live overrides: never compacted", s.entries, len(s.live))
	}
	soon := now.Add(time.Minute)
	put(t, s, "tenant=temp", lim, &soon)
	want := ids(s)

	// A crash between the compaction's write and its rename.
	var crash string
	if err := s.compact(func() { crash = copyDir(t, dir) }); err != nil {
		t.Fatal(err)
	}
	for name, d := range map[string]string{"after the compaction": dir, "crashed before the rename": crash} {
		r, err := OpenFile(filepath.Join(d, "overrides.jsonl"), NewIndex(clock), clock)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := ids(r); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: %d overrides, want %d", name, len(got), len(want))
		}
		if _, err := os.Stat(filepath.Join(d, "overrides.jsonl.tmp")); err == nil {
			t.Errorf("%s: the compaction's temporary file is still there", name)
		}
		if r.idx.Lookup("api", entries("tenant=t599")) == nil {
			t.Errorf("%s: tenant=t599 not in the index", name)
		}
		r.Close()
	}

	// A torn last line: dropped, and appends go on.
	s.Close()
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"op":"put","after":{"domain":"api","pa`)
	f.Close()
	s, err = OpenFile(file, NewIndex(clock), clock)
	if err != nil {
		t.Fatalf("a torn last line: %v", err)
	}
	put(t, s, "tenant=after", lim, nil)
	s.Close()
	s, err = OpenFile(file, NewIndex(clock), clock)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.List()) != len(want)+1 {
		t.Errorf("after a torn line and one more put: %d overrides, want %d", len(s.List()), len(want)+1)
	}

	// A bad line that is not the last is an error, not a silent loss.
	os.WriteFile(filepath.Join(dir, "bad.jsonl"), []byte("{\"op\":\"put\"}\n{}\n"), 0o600)
	if _, err := OpenFile(filepath.Join(dir, "bad.jsonl"), NewIndex(clock), clock); err == nil {
		t.Error("a corrupt line in the middle was accepted")
	}

	// Expiry.
	now = soon
	changes, err := s.Sweep()
	if err != nil || len(changes) != 1 || changes[0].Before.Path[0].Value != "temp" || changes[0].By != "expiry" {
		t.Fatalf("sweep: %v, %+v; want tenant=temp deleted by expiry", err, changes)
	}
	s.Close()
}

func entries(path string) []rules.Entry {
	p, _ := ParsePath(path)
	out := make([]rules.Entry, len(p))
	for i, e := range p {
		out[i] = rules.Entry{Key: e.Key, Value: e.Value}
	}
	return out
}
