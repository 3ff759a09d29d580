// Package bench compares sluice's embedded store with the in-memory rate
// limiters Go programmers use today, on one workload in one go test run.
//
// It is a module of its own so that the peers never become dependencies of
// sluice. Run it with run.sh; docs/benchmarks.md has the results.
package bench

import (
	"context"
	"flag"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"

	golimiter "github.com/sethvargo/go-limiter"
	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/throttled/throttled/v2"
	throttledmem "github.com/throttled/throttled/v2/store/memstore"
	ululelimiter "github.com/ulule/limiter/v3"
	ululemem "github.com/ulule/limiter/v3/drivers/store/memory"
	"golang.org/x/time/rate"
)

// The one limit every implementation enforces in BenchmarkAllow: rate
// requests per period with a burst (capacity) of rate. The default is high
// enough that the workload allows (each run reports denied/op), so that every
// implementation does its full read-modify-write rather than an early deny.
var (
	flagRate   = flag.Int("rate", 10000, "requests per period, and burst, of every limiter in BenchmarkAllow")
	flagPeriod = flag.Duration("period", time.Second, "period of the limit in BenchmarkAllow")
)

// spec is a limit: rate requests per period, with a burst of rate.
type spec struct {
	rate   int
	period time.Duration
}

// impl is one rate limiter under test. New returns a limiter that enforces l
// on every key, as allow, and a function that releases it.
type impl struct {
	name string
	new  func(tb testing.TB, l spec) (allow func(ctx context.Context, key string) bool, close func())
}

func impls() []impl {
	return []impl{
		sluiceImpl(sluice.FixedWindow),
		sluiceImpl(sluice.TokenBucket),
		sluiceImpl(sluice.GCRA),
		{"xrate-sharded", newXRate},
		{"sethvargo-go-limiter", newGoLimiter},
		{"throttled-gcra", newThrottled},
		{"ulule-limiter", newUlule},
	}
}

// sluiceImpl is sluice's Limiter over its embedded store with the given
// algorithm.
func sluiceImpl(alg sluice.Algorithm) impl {
	return impl{"sluice-" + alg.String(), func(tb testing.TB, l spec) (func(context.Context, string) bool, func()) {
		limit := &sluice.Limit{Algorithm: alg, Rate: int64(l.rate), Period: l.period}
		if alg != sluice.FixedWindow {
			limit.Burst = int64(l.rate)
		}
		if err := limit.Validate(); err != nil {
			tb.Fatal(err)
		}
		store := memstore.New(memstore.Config{})
		lim := sluice.NewLimiter(store)
		allow := func(ctx context.Context, key string) bool {
			d, err := lim.Allow(ctx, key, limit)
			if err != nil {
				panic(err)
			}
			return d.Allowed
		}
		return allow, func() { store.Close() }
	}}
}

// xrateShards is a map of golang.org/x/time/rate limiters split into shards,
// each behind its own mutex, creating a limiter on a key's first use: what Go
// programmers write today when they need a limit per key.
type xrateShards struct {
	seed   maphash.Seed
	limit  rate.Limit
	burst  int
	shards [64]xrateShard
}

type xrateShard struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
	_  [64 - 16]byte // one shard per cache line
}

func (s *xrateShards) allow(key string) bool {
	sh := &s.shards[maphash.String(s.seed, key)%uint64(len(s.shards))]
	sh.mu.Lock()
	l, ok := sh.m[key]
	if !ok {
		l = rate.NewLimiter(s.limit, s.burst)
		sh.m[key] = l
	}
	sh.mu.Unlock()
	return l.Allow()
}

func newXRate(tb testing.TB, l spec) (func(context.Context, string) bool, func()) {
	s := &xrateShards{seed: maphash.MakeSeed(), limit: rate.Every(l.period / time.Duration(l.rate)), burst: l.rate}
	for i := range s.shards {
		s.shards[i].m = make(map[string]*rate.Limiter)
	}
	return func(_ context.Context, key string) bool { return s.allow(key) }, func() {}
}

func newGoLimiter(tb testing.TB, l spec) (func(context.Context, string) bool, func()) {
	store, err := memorystore.New(&memorystore.Config{Tokens: uint64(l.rate), Interval: l.period})
	if err != nil {
		tb.Fatal(err)
	}
	var _ golimiter.Store = store
	allow := func(ctx context.Context, key string) bool {
		_, _, _, ok, err := store.Take(ctx, key)
		if err != nil {
			panic(err)
		}
		return ok
	}
	return allow, func() { store.Close(context.Background()) }
}

func newThrottled(tb testing.TB, l spec) (func(context.Context, string) bool, func()) {
	store, err := throttledmem.NewCtx(0) // 0: an unbounded map, its fastest form
	if err != nil {
		tb.Fatal(err)
	}
	// MaxBurst counts the requests allowed beyond the first.
	quota := throttled.RateQuota{MaxRate: throttled.PerDuration(l.rate, l.period), MaxBurst: l.rate - 1}
	lim, err := throttled.NewGCRARateLimiterCtx(store, quota)
	if err != nil {
		tb.Fatal(err)
	}
	allow := func(ctx context.Context, key string) bool {
		limited, _, err := lim.RateLimitCtx(ctx, key, 1)
		if err != nil {
			panic(err)
		}
		return !limited
	}
	return allow, func() {}
}

func newUlule(tb testing.TB, l spec) (func(context.Context, string) bool, func()) {
	lim := ululelimiter.New(ululemem.NewStore(), ululelimiter.Rate{Period: l.period, Limit: int64(l.rate)})
	allow := func(ctx context.Context, key string) bool {
		c, err := lim.Get(ctx, key)
		if err != nil {
			panic(err)
		}
		return !c.Reached
	}
	return allow, func() {}
}

// makeKeys returns n distinct keys shaped like real ones.
func makeKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("user:%08d", i)
	}
	return keys
}

var keySets = []struct {
	name string
	n    int
}{
	{"10k", 10_000},
	{"1M", 1_000_000},
}

// filled is the limiter of the sub-benchmark that last ran, with every key
// seen once. The testing package calls a sub-benchmark several times as it
// grows b.N; filling a million keys each time would dominate the run.
var filled struct {
	name  string
	allow func(context.Context, string) bool
	close func()
}

func filledLimiter(b *testing.B, name string, im impl, keys []string) func(context.Context, string) bool {
	if filled.name == name {
		return filled.allow
	}
	if filled.close != nil {
		filled.close()
	}
	filled.name, filled.allow, filled.close = "", nil, nil
	runtime.GC()
	allow, closeFn := im.new(b, spec{*flagRate, *flagPeriod})
	ctx := context.Background()
	for _, k := range keys {
		allow(ctx, k)
	}
	filled.name, filled.allow, filled.close = name, allow, closeFn
	return allow
}

// BenchmarkAllow decides one request on a key drawn at random from a full
// set of keys, from every P in parallel.
//
// Besides ns/op (wall time over b.N) it reports cpu-ns/op, the CPU time the
// whole process spent per request (user and system, every thread, the
// garbage collector included). On a shared machine, other processes
// stretch the wall time; they change the CPU time much less.
func BenchmarkAllow(b *testing.B) {
	for _, ks := range keySets {
		keys := makeKeys(ks.n)
		for _, im := range impls() {
			name := "keys=" + ks.name + "/impl=" + im.name
			b.Run(name, func(b *testing.B) {
				allow := filledLimiter(b, name, im, keys)
				var seeds, denied atomic.Uint64
				n := uint64(len(keys))
				b.ReportAllocs()
				b.ResetTimer()
				cpu0 := cpuTime()
				b.RunParallel(func(pb *testing.PB) {
					ctx := context.Background()
					// xorshift64*, a cheap generator per goroutine.
					x := 0x9E3779B97F4A7C15 * (seeds.Add(1) + 1)
					var no uint64
					for pb.Next() {
						x ^= x >> 12
						x ^= x << 25
						x ^= x >> 27
						i, _ := bits.Mul64(x*0x2545F4914F6CDD1D, n)
						if !allow(ctx, keys[i]) {
							no++
						}
					}
					denied.Add(no)
				})
				cpu := cpuTime() - cpu0
				b.StopTimer()
				b.ReportMetric(float64(denied.Load())/float64(b.N), "denied/op")
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
			})
		}
		keys = nil
	}
	if filled.close != nil {
		filled.close()
	}
	filled.name, filled.allow, filled.close = "", nil, nil
}

// BenchmarkBytesPerKey fills a fresh limiter with a million keys and reports
// the heap it holds per key. The key strings themselves are built beforehand
// and not counted, unless the implementation copies them.
//
// The limit is 100 per hour, so that every key is still limited (not yet
// replenished) when the heap is measured: sluice's store forgets a key whose
// state has become equal to a fresh one, and would otherwise hold nothing.
func BenchmarkBytesPerKey(b *testing.B) {
	const n = 1_000_000
	l := spec{rate: 100, period: time.Hour}
	keys := makeKeys(n)
	for _, im := range impls() {
		b.Run("impl="+im.name, func(b *testing.B) {
			ctx := context.Background()
			var bytes, fill float64
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				before := settledHeap()
				start := time.Now()
				b.StartTimer()
				allow, closeFn := im.new(b, l)
				for _, k := range keys {
					allow(ctx, k)
				}
				b.StopTimer()
				fill += float64(time.Since(start).Nanoseconds())
				after := settledHeap()
				runtime.KeepAlive(allow)
				bytes += float64(after) - float64(before)
				closeFn()
				b.StartTimer()
			}
			b.ReportMetric(bytes/float64(b.N)/n, "B/key")
			b.ReportMetric(fill/float64(b.N)/n, "ns/insert")
		})
	}
}

// settledHeap returns the bytes of live heap objects once garbage collection
// has settled. One runtime.GC is not enough: a limiter released earlier may
// be held by a goroutine that only a finalizer stops (ulule's cleaner), and
// it would then be freed in the middle of the next measurement.
func settledHeap() uint64 {
	var m runtime.MemStats
	last := uint64(math.MaxUint64)
	for range 10 {
		runtime.GC()
		time.Sleep(20 * time.Millisecond) // let finalizers and what they stop run
		runtime.ReadMemStats(&m)
		if m.HeapAlloc+m.HeapAlloc/1000 >= last {
			break
		}
		last = m.HeapAlloc
	}
	return m.HeapAlloc
}

// cpuTime returns the CPU time (user and system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
