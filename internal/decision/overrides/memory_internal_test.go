package overrides

import (
	"encoding/json"
	"fmt"
	"runtime"
	"testing"
)

// BenchmarkHeldMemory reports the heap a node spends per override when a
// million are held, by each store: the index plus the store's own copy
// (the file store's map; the Redis store's map and the JSON it compares
// with Redis's). The overrides share one limit, as a plan's customers do.
func BenchmarkHeldMemory(b *testing.B) {
	const n = 1_000_000
	for _, kind := range []string{"file", "redis"} {
		b.Run(kind, func(b *testing.B) {
			for b.Loop() {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				idx := NewIndex(nil)
				fs := &FileStore{idx: idx, liveSet: liveSet{live: map[string]*Override{}}}
				rs := &RedisStore{idx: idx, liveSet: liveSet{live: map[string]*Override{}}, fields: map[string]storedField{}}
				for i := range n {
					o := &Override{Domain: "api", Path: []Entry{{Key: "tenant", Value: fmt.Sprint("t", i)}},
						Limit: json.RawMessage(`{"unit":"minute","requests_per_unit":100}`)}
					if kind == "file" {
						if err := fs.apply(&Change{Op: "put", After: o}); err != nil {
							b.Fatal(err)
						}
						continue
					}
					raw, _ := json.Marshal(o)
					rs.applyLocked("put", o.ID(), string(raw))
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "heapB/override")
				runtime.KeepAlive(fs)
				runtime.KeepAlive(rs)
			}
		})
	}
}
