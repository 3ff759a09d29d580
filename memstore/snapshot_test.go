package memstore_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/storetest"
)

// snapLimits has one limit per algorithm plus one with block_for.
func snapLimits() []*sluice.Limit {
	var ls []*sluice.Limit
	for _, k := range algo.Kinds() {
		l := limitOf(k, 5, time.Second)
		if k == algo.Sketch {
			l.Sketch = sluice.SketchConfig{Width: 64, Depth: 2} // a small snapshot
		}
		ls = append(ls, l)
	}
	return append(ls, &sluice.Limit{Name: "block", Rate: 1, Period: time.Second, BlockFor: time.Minute})
}

// populate uses every kind of state: tables, logs, a sketch, a block.
func populate(t testing.TB, s *memstore.Store) {
	lim := sluice.NewLimiter(s)
	for i, l := range snapLimits() {
		for _, key := range []string{"a", "b", "c"} {
			for range i%3 + 2 {
				if _, err := lim.Allow(ctx, key, l); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// peeks returns what every key of populate looks like now.
func peeks(t testing.TB, s *memstore.Store) []sluice.Decision {
	lim := sluice.NewLimiter(s)
	var ds []sluice.Decision
	for _, l := range snapLimits() {
		for _, key := range []string{"a", "b", "c", "fresh"} {
			d, err := lim.AllowN(ctx, key, l, 0)
			if err != nil {
				t.Fatal(err)
			}
			ds = append(ds, d)
		}
	}
	return ds
}

func snapshotOf(t testing.TB, s *memstore.Store) []byte {
	var buf bytes.Buffer
	if err := s.Snapshot(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestSnapshotRoundTrip(t *testing.T) {
	for _, downtime := range []time.Duration{0, 400 * time.Millisecond, 1500 * time.Millisecond, 2 * time.Minute} {
		t.Run(downtime.String(), func(t *testing.T) {
			clock := storetest.NewClock(storetest.Start.Add(300 * time.Millisecond))
			a := memstore.New(memstore.Config{Now: clock.Now, SweepInterval: -1, Shards: 8})
			populate(t, a)
			path := filepath.Join(t.TempDir(), "sluice.snap")
			if err := a.WriteFile(path); err != nil {
				t.Fatal(err)
			}
			// Writing again replaces the file atomically and leaves no
			// temporary file behind.
			if err := a.WriteFile(path); err != nil {
				t.Fatal(err)
			}
			if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
				t.Fatalf("%d files beside the snapshot", len(ents)-1)
			}

			clock.Advance(downtime)
			b := memstore.New(memstore.Config{Now: clock.Now, SweepInterval: -1, Shards: 2})
			sluice.NewLimiter(b).Allow(ctx, "overwritten", snapLimits()[0])
			if err := b.LoadFile(path); err != nil {
				t.Fatal(err)
			}
			want, got := peeks(t, a), peeks(t, b)
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("peek %d after restore: %+v, want %+v", i, got[i], want[i])
				}
			}
			a.Sweep()
			if a.Stats().Keys != b.Stats().Keys {
				t.Fatalf("restored store holds %d keys, the original %d", b.Stats().Keys, a.Stats().Keys)
			}
		})
	}
}

func TestRestoreRejectsDamage(t *testing.T) {
	clock := storetest.NewClock(storetest.Start)
	src := memstore.New(memstore.Config{Now: clock.Now, SweepInterval: -1})
	populate(t, src)
	good := snapshotOf(t, src)

	dst := memstore.New(memstore.Config{Now: clock.Now, SweepInterval: -1})
	keep := &sluice.Limit{Rate: 10, Period: time.Hour}
	sluice.NewLimiter(dst).AllowN(ctx, "keep", keep, 3)
	unchanged := func(what string) {
		t.Helper()
		d, _ := sluice.NewLimiter(dst).AllowN(ctx, "keep", keep, 0)
		if d.Remaining != 7 || dst.Stats().Keys != 1 {
			t.Fatalf("%s changed the store: remaining %d, Len %d", what, d.Remaining, dst.Stats().Keys)
		}
	}

	for n := range len(good) {
		err := dst.Restore(bytes.NewReader(good[:n]))
		if !errors.Is(err, memstore.ErrSnapshot) {
			t.Fatalf("truncated to %d of %d bytes: %v", n, len(good), err)
		}
	}
	unchanged("a truncated snapshot")
	for i := range good {
		bad := bytes.Clone(good)
		bad[i] ^= 1 << (i % 8)
		if err := dst.Restore(bytes.NewReader(bad)); !errors.Is(err, memstore.ErrSnapshot) {
			t.Fatalf("byte %d flipped: %v", i, err)
		}
	}
	unchanged("a corrupted snapshot")
	if err := dst.Restore(bytes.NewReader(append(bytes.Clone(good), 0))); err == nil {
		t.Fatalf("trailing byte accepted")
	}
	unchanged("a snapshot with a trailing byte")
	if err := dst.LoadFile(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	if err := dst.Restore(bytes.NewReader(good)); err != nil {
		t.Fatalf("the good snapshot: %v", err)
	}
}

func FuzzRestore(f *testing.F) {
	clock := storetest.NewClock(storetest.Start)
	src := memstore.New(memstore.Config{Now: clock.Now, SweepInterval: -1})
	populate(f, src)
	f.Add(snapshotOf(f, src))
	f.Add([]byte("SLUICEMS"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s := memstore.New(memstore.Config{Now: clock.Now, SweepInterval: -1, Shards: 2})
		if err := s.Restore(bytes.NewReader(data)); err != nil {
			return
		}
		peeks(t, s)
		populate(t, s)
		s.Sweep()
	})
}
