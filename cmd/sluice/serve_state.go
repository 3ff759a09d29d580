package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/memstore"
)

// restoreState loads the state file into store. A missing file is a first
// start. A corrupt one is moved aside to FILE.corrupt and the store starts
// empty: a restart without state hands clients a fresh quota once, which
// is less harm than a rate limit service that cannot start. Any other
// failure (permissions, a directory where the file should be) would also
// break the save on shutdown, and is an error now.
func restoreState(store *memstore.Store, path string, log *slog.Logger) error {
	if path == "" {
		return nil
	}
	if err := checkWritable(path); err != nil {
		return fmt.Errorf("--state-file: %w", err)
	}
	start := time.Now()
	err := store.LoadFile(path)
	switch {
	case err == nil:
		log.Info("state restored", "file", path, "keys", store.Stats().Keys, "took", time.Since(start))
	case errors.Is(err, fs.ErrNotExist):
		log.Info("no state file yet; starting with empty counters", "file", path)
	case errors.Is(err, memstore.ErrSnapshot):
		aside := path + ".corrupt"
		if rerr := os.Rename(path, aside); rerr != nil {
			return fmt.Errorf("--state-file: %v; moving it aside: %w", err, rerr)
		}
		log.Error("state file is corrupt; starting with empty counters", "file", path, "moved_to", aside, "err", err)
	default:
		return fmt.Errorf("--state-file: %w", err)
	}
	return nil
}

// checkWritable reports whether a state file can be written at path, as
// the snapshot does: a temporary file in its directory.
func checkWritable(path string) error {
	if info, err := os.Stat(path); err == nil && info.IsDir() {
		return fmt.Errorf("%s is a directory", path)
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".probe-*")
	if err != nil {
		return err
	}
	f.Close()
	return os.Remove(f.Name())
}

type snapshotMetrics struct {
	success, failure prometheus.Counter
	last             prometheus.Gauge
}

// newSnapshotMetrics registers the metrics of the snapshots written to
// --state-file (the store's own are registered with the store's, by
// storeSet.register).
func newSnapshotMetrics(reg *prometheus.Registry) *snapshotMetrics {
	writes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_state_snapshots_total",
		Help: "Snapshots of the store written to --state-file, by result.",
	}, []string{"result"})
	m := &snapshotMetrics{
		success: writes.WithLabelValues("success"),
		failure: writes.WithLabelValues("failure"),
		last: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_state_snapshot_timestamp_seconds",
			Help: "Unix time of the last snapshot written to --state-file.",
		}),
	}
	reg.MustRegister(writes, m.last)
	return m
}

// defaultSnapshotInterval is the default of --snapshot-interval: what a
// crash may lose. A snapshot of 1M fixed-window keys takes 11 to 15 ms and
// writes 16 MB (memstore's BenchmarkSnapshot).
const defaultSnapshotInterval = 5 * time.Second

// snapshotLoop saves the store every interval until ctx is done.
func snapshotLoop(ctx context.Context, store *memstore.Store, path string, every time.Duration, m *snapshotMetrics, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			saveState(store, path, m, log, slog.LevelDebug)
		}
	}
}

// saveState writes a snapshot of store to path (atomically: memstore
// writes a temporary file and renames it), counts it, and logs success at
// level and failure as an error.
func saveState(store *memstore.Store, path string, m *snapshotMetrics, log *slog.Logger, level slog.Level) error {
	start := time.Now()
	if err := store.WriteFile(path); err != nil {
		m.failure.Inc()
		log.Error("saving state", "file", path, "err", err)
		return err
	}
	m.success.Inc()
	m.last.SetToCurrentTime()
	log.Log(context.Background(), level, "state saved", "file", path, "keys", store.Stats().Keys, "took", time.Since(start))
	return nil
}

// byteSize is a flag of bytes with an optional unit: KB, MB, GB, TB are
// powers of 1000, KiB, MiB, GiB, TiB (or Ki, Mi, Gi, Ti) of 1024.
type byteSize int64

var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12},
	{"B", 1},
}

func (b *byteSize) String() string { return fmt.Sprint(int64(*b)) }

func (b *byteSize) Set(s string) error {
	num, mult := strings.TrimSpace(s), int64(1)
	for _, u := range byteUnits {
		if strings.HasSuffix(num, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(num, u.suffix)), u.mult
			break
		}
	}
	var n int64
	if _, err := fmt.Sscan(num, &n); err != nil || n < 0 || fmt.Sprint(n) != num {
		return fmt.Errorf("not a size in bytes: %q (e.g. 536870912, 512MiB, 2GB)", s)
	}
	if n > (1<<62)/mult {
		return fmt.Errorf("size %q is too large", s)
	}
	*b = byteSize(n * mult)
	return nil
}
