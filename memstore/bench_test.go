package memstore_test

import (
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
	"github.com/sluicehq/sluice/memstore"
)

var (
	benchKeysOnce sync.Once
	benchKeys     []string // 1M keys, built once so that no benchmark measures formatting
)

func keysN(n int) []string {
	benchKeysOnce.Do(func() {
		benchKeys = make([]string, 1_000_000)
		for i := range benchKeys {
			benchKeys[i] = fmt.Sprintf("user:%d", i)
		}
	})
	return benchKeys[:n]
}

// benchLimit is a realistic limit: 100 per second, so that a hot key is
// mostly denied and a cold one mostly admitted.
func benchLimit(k algo.Kind) *sluice.Limit {
	return &sluice.Limit{Name: "bench", Algorithm: sluice.Algorithm(k), Rate: 100, Period: time.Second}
}

// BenchmarkAllow measures keyed decisions through Limiter.Allow, in
// parallel, on a store pre-filled with every key.
func BenchmarkAllow(b *testing.B) {
	for _, k := range algo.Kinds() {
		for _, n := range []int{10_000, 1_000_000} {
			b.Run(fmt.Sprintf("%s/keys=%d", k, n), func(b *testing.B) {
				s := memstore.New(memstore.Config{SweepInterval: -1})
				defer s.Close()
				lim := sluice.NewLimiter(s)
				l := benchLimit(k)
				keys := keysN(n)
				for _, key := range keys {
					lim.Allow(ctx, key, l)
				}
				var start atomic.Uint64
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					i := int(start.Add(7919*7919) % uint64(n))
					for pb.Next() {
						lim.Allow(ctx, keys[i], l)
						if i += 7919; i >= n {
							i -= n
						}
					}
				})
			})
		}
	}
}

// BenchmarkTake measures the store alone: Store.Take on pre-built hits,
// without the Limiter's validation and its per-call arrays.
func BenchmarkTake(b *testing.B) {
	for _, k := range algo.Kinds() {
		for _, n := range []int{10_000, 1_000_000} {
			b.Run(fmt.Sprintf("%s/keys=%d", k, n), func(b *testing.B) {
				s := memstore.New(memstore.Config{SweepInterval: -1})
				defer s.Close()
				l := benchLimit(k)
				keys := keysN(n)
				for _, key := range keys {
					s.Take(ctx, []sluice.Hit{{Key: key, Limit: l, Cost: 1}}, make([]sluice.Decision, 1))
				}
				var start atomic.Uint64
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					hits := []sluice.Hit{{Limit: l, Cost: 1}}
					out := make([]sluice.Decision, 1)
					i := int(start.Add(7919*7919) % uint64(n))
					for pb.Next() {
						hits[0].Key = keys[i]
						s.Take(ctx, hits, out)
						if i += 7919; i >= n {
							i -= n
						}
					}
				})
			})
		}
	}
}

// BenchmarkTwoLimits measures an all-or-nothing request of a per-second
// and a per-day limit on 10k keys.
func BenchmarkTwoLimits(b *testing.B) {
	s := memstore.New(memstore.Config{SweepInterval: -1})
	defer s.Close()
	lim := sluice.NewLimiter(s)
	sec := &sluice.Limit{Name: "sec", Rate: 100, Period: time.Second}
	day := &sluice.Limit{Name: "day", Algorithm: sluice.GCRA, Rate: 1_000_000, Period: 24 * time.Hour}
	keys := keysN(10_000)
	var start atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		hits := []sluice.Hit{{Limit: sec, Cost: 1}, {Limit: day, Cost: 1}}
		out := make([]sluice.Decision, 2)
		i := int(start.Add(7919) % uint64(len(keys)))
		for pb.Next() {
			hits[0].Key, hits[1].Key = keys[i], keys[i]
			lim.Take(ctx, hits, out)
			if i++; i == len(keys) {
				i = 0
			}
		}
	})
}

// BenchmarkBytesPerKey reports the heap held per key after filling a store
// with 1M keys of one limit.
func BenchmarkBytesPerKey(b *testing.B) {
	const n = 1_000_000
	keys := keysN(n)
	for _, k := range algo.Kinds() {
		b.Run(k.String(), func(b *testing.B) {
			// A long period, so that no key goes idle while the store fills.
			l := &sluice.Limit{Name: "bench", Algorithm: sluice.Algorithm(k), Rate: 100, Period: time.Hour}
			var perKey, estimate float64
			for b.Loop() {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				s := memstore.New(memstore.Config{SweepInterval: -1})
				lim := sluice.NewLimiter(s)
				for _, key := range keys {
					lim.Allow(ctx, key, l)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perKey = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
				estimate = float64(s.Stats().Bytes) / n
				runtime.KeepAlive(s)
			}
			b.ReportMetric(perKey, "B/key")
			b.ReportMetric(estimate, "est-B/key")
		})
	}
}

// BenchmarkSlidingLogLong measures one key whose sliding log holds entries
// hits in its window, each at a time of its own: every request comes as
// the oldest entry leaves (admitted: one entry dropped, one appended), or
// twice as often (half of them denied). The work must not grow with the
// log.
func BenchmarkSlidingLogLong(b *testing.B) {
	for _, entries := range []int64{500, 10_000} {
		for _, c := range []struct {
			name string
			step int64 // clock step per request, in periods/entries
		}{{"admitted", 2}, {"half-denied", 1}} {
			b.Run(fmt.Sprintf("entries=%d/%s", entries, c.name), func(b *testing.B) {
				const period = int64(time.Hour)
				var now atomic.Int64
				now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
				s := memstore.New(memstore.Config{SweepInterval: -1, Now: func() time.Time { return time.Unix(0, now.Load()) }})
				defer s.Close()
				lim := sluice.NewLimiter(s)
				l := &sluice.Limit{Algorithm: sluice.SlidingLog, Rate: entries, Period: time.Duration(period)}
				gap := period / entries
				for range entries {
					if d, _ := lim.Allow(ctx, "k", l); !d.Allowed {
						b.Fatal("filling: denied")
					}
					now.Add(gap)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					now.Add(gap * c.step / 2)
					lim.Allow(ctx, "k", l)
				}
			})
		}
	}
}

// BenchmarkSnapshot writes a snapshot of a store of 1M fixed-window keys
// (to io.Discard: the encoding and the copying, not the disk) while one
// goroutine keeps deciding on the store; it reports the snapshot's size
// and the slowest decision seen (max-take-µs), which is what a snapshot
// can stall a request for: one shard's copy under its lock. The baseline
// sleeps as long instead of snapshotting: its slowest decision is the
// machine's own scheduling noise.
func BenchmarkSnapshot(b *testing.B) {
	const n = 1_000_000
	s := memstore.New(memstore.Config{SweepInterval: -1})
	defer s.Close()
	lim := sluice.NewLimiter(s)
	l := &sluice.Limit{Name: "bench", Rate: 1_000_000, Period: time.Hour}
	keys := keysN(n)
	for _, key := range keys {
		lim.Allow(ctx, key, l)
	}
	var size countWriter
	start := time.Now()
	if err := s.Snapshot(&size); err != nil {
		b.Fatal(err)
	}
	took := time.Since(start)
	for _, bc := range []struct {
		name string
		op   func() error
	}{
		{"snapshot", func() error { return s.Snapshot(io.Discard) }},
		{"baseline", func() error { time.Sleep(took); return nil }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			stop := make(chan struct{})
			var slowest atomic.Int64
			var wg sync.WaitGroup
			wg.Go(func() {
				for i := 0; ; i = (i + 7919) % n {
					select {
					case <-stop:
						return
					default:
					}
					t := time.Now()
					lim.Allow(ctx, keys[i], l)
					if d := int64(time.Since(t)); d > slowest.Load() {
						slowest.Store(d)
					}
				}
			})
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				if err := bc.op(); err != nil {
					b.Fatal(err)
				}
			}
			close(stop)
			wg.Wait()
			b.ReportMetric(float64(slowest.Load())/1e3, "max-take-µs")
			b.ReportMetric(float64(size)/n, "B/key")
		})
	}
}

// countWriter counts the bytes written to it.
type countWriter int64

func (c *countWriter) Write(p []byte) (int, error) {
	*c += countWriter(len(p))
	return len(p), nil
}
