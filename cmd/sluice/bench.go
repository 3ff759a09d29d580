package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"time"

	"github.com/sluicehq/sluice/internal/loadgen"
)

func init() {
	commands["bench"] = command{
		summary: "drive a rate limit service with load and measure it",
		run: func(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
			return cmdBench(ctx, args, stdout, stderr)
		},
	}
}

func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg loadgen.Config
	mode := fs.String("mode", "grpc", "protocol: grpc (RateLimitService/ShouldRateLimit), json (HTTP POST /json) or http (GET --path, for an HTTP API or sluice proxy)")
	fs.StringVar(&cfg.Target, "target", "127.0.0.1:8081", "host:port of the server (the gRPC port, or the HTTP port with --mode json or http)")
	fs.IntVar(&cfg.Connections, "connections", 1, "gRPC client connections, or HTTP transports with --mode json or http")
	fs.IntVar(&cfg.Concurrency, "concurrency", 16, "requests in flight (workers)")
	fs.IntVar(&cfg.Keys, "keys", 1000, `distinct descriptor values, "k0" … "k<keys-1>", chosen uniformly`)
	fs.Float64Var(&cfg.Hot, "hot", 0, `share of requests (0..1) sent with the one hot value "hot" instead`)
	fs.StringVar(&cfg.Domain, "domain", "bench", "domain of the requests")
	fs.StringVar(&cfg.DescriptorKey, "descriptor-key", "key", "key of the one descriptor entry of each request")
	benchHTTPFlags(fs, &cfg)
	fs.BoolVar(&cfg.Fill, "fill", false, "first send one request for every key, so that the server holds them all (not measured)")
	fs.DurationVar(&cfg.Warmup, "warmup", time.Second, "load sent and not measured, before the measurement")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "length of the measurement (0: until --requests)")
	fs.Int64Var(&cfg.Requests, "requests", 0, "stop after this many measured requests (0: no cap)")
	fs.Float64Var(&cfg.Rate, "rate", 0, "open loop: requests per second, due whatever the answers, latency from when each was due (0: closed loop)")
	fs.DurationVar(&cfg.Timeout, "timeout", 2*time.Second, "timeout of each request")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the choice of keys")
	asJSON := fs.Bool("json", false, "print the result as one line of JSON (latencies in microseconds)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the generator itself to this `file`")
	setUsage(fs, `Usage: sluice bench --target HOST:PORT [flags]

Sends load to an Envoy rate limit service (sluice serve, envoyproxy/ratelimit,
or sluice nullserver for comparison) and prints requests per second, latency
percentiles (p50, p90, p99, p99.9, max) and the count of each answer: OK,
OVER_LIMIT, UNKNOWN, errors.

Each request has one descriptor with one entry {key: --descriptor-key, value},
the value one of --keys distinct values, or the hot value "hot" for a share
--hot of the requests. Requests are encoded once, before the run.

Closed loop by default: --concurrency workers each send as soon as they have
their answer. With --rate the run is open loop: requests are due at that rate
whatever the answers, up to --concurrency in flight, and latency counts from
when a request was due. The run always ends by itself, after --warmup plus
--duration, or --requests measured requests.

`, "")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg.Mode = loadgen.Mode(*mode)
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	res, err := loadgen.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "sluice bench: %v\n", err)
		return errUsage
	}
	if *asJSON {
		return res.WriteJSON(stdout)
	}
	return res.WriteText(stdout)
}
