//go:build linux

package bench

// BenchmarkRedisClient compares Redis clients on the one command the Redis
// store sends per rate limit decision: EVALSHA of a small GCRA-like script on
// a key drawn from 10k keys, from many goroutines at once. It starts its own
// redis-server (no persistence) on a free loopback port and stops it after.
//
// It only runs when asked, so that `go test -bench .` in this module (run.sh)
// does not start Redis:
//
//	go test -run '^$' -bench RedisClient -redis
//
// and skips when redis-server is not on the PATH. redisclient.sh runs it the
// way docs/benchmarks.md reports it.
//
// Besides ns/op and allocs/op, every sub-benchmark reads Redis' INFO before
// and after and reports, per decision:
//
//   - redis-cpu-ms/1k: Redis CPU (used_cpu_user+used_cpu_sys) per 1000 decisions;
//   - reads/op: socket reads Redis processed (total_reads_processed), i.e.
//     round trips: 1 without pipelining, below 1 when commands are batched;
//   - evalsha/op: EVALSHA calls Redis counted (cmdstat_evalsha), which must
//     be 1: one script call per decision, no EVAL fallback;
//   - client-cpu-ns/op: CPU time of this process (the "sluice node").

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/bits"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

var (
	flagRedis       = flag.Bool("redis", false, "run BenchmarkRedisClient (starts a redis-server from the PATH)")
	flagRedisPool   = flag.Int("redis-goredis-pool", 0, "go-redis PoolSize in BenchmarkRedisClient (0: the library default, 10 per GOMAXPROCS)")
	flagRedisKeys   = flag.Int("redis-keys", 10_000, "distinct keys in BenchmarkRedisClient")
	flagRedisServer = flag.String("redis-server", "redis-server", "redis-server binary for BenchmarkRedisClient")
)

// redisGCRA is representative of the store's scripts: read the key, take the
// time from Redis, compute, write back with an expiry, return two integers.
// ARGV[1] is the emission interval and ARGV[2] the burst tolerance, both in
// microseconds. It returns {allowed, slack or wait in microseconds}.
const redisGCRA = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]))
if not tat or tat < now then
  tat = now
end
local next = tat + interval
local wait = next - tolerance - now
if wait > 0 then
  return {0, wait}
end
redis.call('SET', KEYS[1], string.format('%d', next), 'PX', math.ceil((next - now) / 1000))
return {1, -wait}
`

// 100 per second with a burst of 100: at the throughput reached here (about
// 10 decisions per key per second) every decision is allowed, so the script
// always does its full read-modify-write.
const (
	redisInterval  = "10000"   // µs
	redisTolerance = "1000000" // µs
)

var redisArgs = []string{redisInterval, redisTolerance}
var redisArgsAny = []any{redisInterval, redisTolerance}

// redisClient makes one decision: it returns whether key was allowed.
type redisClient struct {
	name string
	open func(tb testing.TB, addr string) (decide func(ctx context.Context, key string) (bool, error), close func())
}

func redisClients() []redisClient {
	return []redisClient{
		{name: "rueidis", open: func(tb testing.TB, addr string) (func(context.Context, string) (bool, error), func()) {
			return openRueidis(tb, addr, false, 0)
		}},
		{name: "rueidis-flush20us", open: func(tb testing.TB, addr string) (func(context.Context, string) (bool, error), func()) {
			return openRueidis(tb, addr, false, 20*time.Microsecond)
		}},
		{name: "rueidis-noauto", open: func(tb testing.TB, addr string) (func(context.Context, string) (bool, error), func()) {
			return openRueidis(tb, addr, true, 0)
		}},
		{name: "goredis", open: func(tb testing.TB, addr string) (func(context.Context, string) (bool, error), func()) {
			return openGoRedis(tb, addr, false)
		}},
		{name: "goredis-autopipeline", open: func(tb testing.TB, addr string) (func(context.Context, string) (bool, error), func()) {
			return openGoRedis(tb, addr, true)
		}},
	}
}

// openRueidis uses rueidis.Lua.Exec: EVALSHA, then EVAL on NOSCRIPT.
// Concurrent calls share one pipelined connection unless noAuto. flushDelay
// is ClientOption.MaxFlushDelay: the pipeline's writer waits up to that long
// after each flush to gather more commands into the next one.
func openRueidis(tb testing.TB, addr string, noAuto bool, flushDelay time.Duration) (func(context.Context, string) (bool, error), func()) {
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:           []string{addr},
		DisableCache:          true,
		DisableAutoPipelining: noAuto,
		MaxFlushDelay:         flushDelay,
	})
	if err != nil {
		tb.Fatal(err)
	}
	script := rueidis.NewLuaScript(redisGCRA)
	decide := func(ctx context.Context, key string) (bool, error) {
		v, err := script.Exec(ctx, c, []string{key}, redisArgs).AsIntSlice()
		if err != nil {
			return false, err
		}
		if len(v) != 2 {
			return false, fmt.Errorf("script returned %v", v)
		}
		return v[0] == 1, nil
	}
	return decide, c.Close
}

// openGoRedis uses go-redis Script.Run: EVALSHA, then EVAL on NOSCRIPT. With
// auto, the commands go through the client's (experimental) AutoPipeliner,
// which batches concurrent commands into pipelines.
func openGoRedis(tb testing.TB, addr string, auto bool) (func(context.Context, string) (bool, error), func()) {
	c := goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: *flagRedisPool})
	var s goredis.Scripter = c
	if auto {
		ap, err := c.AutoPipeline()
		if err != nil {
			tb.Fatal(err)
		}
		s = ap
	}
	script := goredis.NewScript(redisGCRA)
	decide := func(ctx context.Context, key string) (bool, error) {
		v, err := script.Run(ctx, s, []string{key}, redisArgsAny...).Int64Slice()
		if err != nil {
			return false, err
		}
		if len(v) != 2 {
			return false, fmt.Errorf("script returned %v", v)
		}
		return v[0] == 1, nil
	}
	return decide, func() { c.Close() }
}

// redisProc is a redis-server started for the benchmark.
type redisProc struct {
	addr string
	cmd  *exec.Cmd
}

func startRedis(tb testing.TB) *redisProc {
	bin, err := exec.LookPath(*flagRedisServer)
	if err != nil {
		tb.Skipf("no redis-server: %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir := tb.TempDir()
	cmd := exec.Command(bin,
		"--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"),
		"--daemonize", "no")
	// Killed with the benchmark even if it dies without cleaning up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	p := &redisProc{addr: fmt.Sprintf("127.0.0.1:%d", port), cmd: cmd}
	tb.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := p.info(); err == nil {
			return p
		} else if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			tb.Fatalf("redis-server on %s did not start: %v\n%s", p.addr, err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// info returns the numeric fields of INFO (cpu, stats, commandstats), the
// command stats as "cmdstat_NAME.calls". It speaks RESP on a connection of
// its own so that no client under test is involved.
func (p *redisProc) info() (map[string]float64, error) {
	conn, err := net.DialTimeout("tcp", p.addr, time.Second)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte("INFO everything\r\n")); err != nil {
		return nil, err
	}
	r := bufio.NewReader(conn)
	head, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(head, "$") {
		return nil, fmt.Errorf("INFO: %q", strings.TrimSpace(head))
	}
	n, err := strconv.Atoi(strings.TrimSpace(head[1:]))
	if err != nil {
		return nil, err
	}
	body := make([]byte, n+2)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, err
	}
	m := make(map[string]float64)
	for _, line := range strings.Split(string(body), "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		if strings.HasPrefix(k, "cmdstat_") {
			for _, f := range strings.Split(v, ",") {
				fk, fv, _ := strings.Cut(f, "=")
				if x, err := strconv.ParseFloat(fv, 64); err == nil {
					m[k+"."+fk] = x
				}
			}
			continue
		}
		if x, err := strconv.ParseFloat(v, 64); err == nil {
			m[k] = x
		}
	}
	return m, nil
}

func redisCPU(m map[string]float64) float64 {
	return m["used_cpu_user"] + m["used_cpu_sys"]
}

// redisClientCPU is the CPU time (user and system) this process has used.
func redisClientCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func BenchmarkRedisClient(b *testing.B) {
	if !*flagRedis {
		b.Skip("starts a redis-server: run with -redis")
	}
	srv := startRedis(b)
	keys := make([]string, *flagRedisKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("sluice:user:%08d", i)
	}
	for _, rc := range redisClients() {
		for _, par := range []int{1, 8, 64} {
			b.Run(fmt.Sprintf("client=%s/par=%d", rc.name, par), func(b *testing.B) {
				decide, closeClient := rc.open(b, srv.addr)
				defer closeClient()
				ctx := context.Background()
				// Warm up: connect, load the script (the NOSCRIPT fallback
				// happens here, once), then measure only EVALSHA.
				for i := 0; i < 100; i++ {
					if _, err := decide(ctx, keys[i%len(keys)]); err != nil {
						b.Fatal(err)
					}
				}
				before, err := srv.info()
				if err != nil {
					b.Fatal(err)
				}
				var seeds, denied atomic.Uint64
				var failed atomic.Value
				n := uint64(len(keys))
				b.SetParallelism(par)
				b.ReportAllocs()
				b.ResetTimer()
				cpu0 := redisClientCPU()
				b.RunParallel(func(pb *testing.PB) {
					x := 0x9E3779B97F4A7C15 * (seeds.Add(1) + 1)
					var no uint64
					for pb.Next() {
						// xorshift64*, then a uniform index in [0, n).
						x ^= x >> 12
						x ^= x << 25
						x ^= x >> 27
						i, _ := bits.Mul64(x*0x2545F4914F6CDD1D, n)
						ok, err := decide(ctx, keys[i])
						if err != nil {
							failed.CompareAndSwap(nil, err)
							continue
						}
						if !ok {
							no++
						}
					}
					denied.Add(no)
				})
				cpu := redisClientCPU() - cpu0
				b.StopTimer()
				if err, _ := failed.Load().(error); err != nil {
					b.Fatal(err)
				}
				after, err := srv.info()
				if err != nil {
					b.Fatal(err)
				}
				ops := float64(b.N)
				// The two INFO calls themselves are one read each.
				reads := after["total_reads_processed"] - before["total_reads_processed"] - 1
				evalsha := after["cmdstat_evalsha.calls"] - before["cmdstat_evalsha.calls"]
				if ev := after["cmdstat_eval.calls"] - before["cmdstat_eval.calls"]; ev != 0 {
					b.Fatal(errors.New("EVAL fallbacks during the measurement: " + strconv.FormatFloat(ev, 'f', 0, 64)))
				}
				b.ReportMetric((redisCPU(after)-redisCPU(before))*1e6/ops, "redis-cpu-ms/1k")
				b.ReportMetric(reads/ops, "reads/op")
				b.ReportMetric(evalsha/ops, "evalsha/op")
				b.ReportMetric(float64(cpu.Nanoseconds())/ops, "client-cpu-ns/op")
				b.ReportMetric(float64(denied.Load())/ops, "denied/op")
			})
		}
	}
}
