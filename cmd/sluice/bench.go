package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"time"

	"github.com/sluicehq/sluice/internal/edges/loadgen"
)

func init() {
	commands["bench"] = command{
		summary: "drive a rate limit service with load and measure it",
		run: func(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
			return cmdBench(ctx, args, stdout, stderr)
		},
		help: func(lookupEnv) *help { return new(benchFlags).help() },
	}
}

// benchFlags are the flags of sluice bench.
type benchFlags struct {
	cfg              loadgen.Config
	mode, cpuProfile string
	asJSON           bool
}

func (o *benchFlags) help() *help {
	h := newHelp("bench", "bench --target HOST:PORT [flags]", `Sends load to an Envoy rate limit service (sluice serve, envoyproxy/ratelimit,
or sluice nullserver for comparison) and prints requests per second, latency
percentiles (p50, p90, p99, p99.9, max) and the count of each answer: OK,
OVER_LIMIT, UNKNOWN, errors.`)
	h.more = `Each request has one descriptor with one entry {key: --descriptor-key, value},
the value one of --keys distinct values, or the hot value "hot" for a share
--hot of the requests. Requests are encoded once, before the run.

Closed loop by default: --concurrency workers each send as soon as they have
their answer. With --rate the run is open loop: requests are due at that rate
whatever the answers, up to --concurrency in flight, and latency counts from
when a request was due. The run always ends by itself, after --warmup plus
--duration, or --requests measured requests.`
	h.group("Target", func(fs *flag.FlagSet) {
		fs.StringVar(&o.mode, "mode", "grpc", "`protocol`: grpc (RateLimitService/ShouldRateLimit), json (HTTP POST /json) or http (GET --path, for an HTTP API or sluice proxy)")
		fs.StringVar(&o.cfg.Target, "target", "127.0.0.1:8081", "`host:port` of the server (the gRPC port, or the HTTP port with --mode json or http)")
		fs.IntVar(&o.cfg.Connections, "connections", 1, "gRPC client connections, or HTTP transports with --mode json or http")
		benchHTTPFlags(fs, &o.cfg)
	})
	h.group("Requests", func(fs *flag.FlagSet) {
		fs.IntVar(&o.cfg.Concurrency, "concurrency", 16, "requests in flight (workers)")
		fs.Float64Var(&o.cfg.Rate, "rate", 0, "open loop: requests per second, due whatever the answers, latency from when each was due (0: closed loop)")
		fs.IntVar(&o.cfg.Keys, "keys", 1000, `distinct descriptor values, "k0" … "k<keys-1>", chosen uniformly`)
		fs.Float64Var(&o.cfg.Hot, "hot", 0, `share of requests (0..1) sent with the one hot value "hot" instead`)
		fs.StringVar(&o.cfg.Domain, "domain", "bench", "`domain` of the requests")
		fs.StringVar(&o.cfg.DescriptorKey, "descriptor-key", "key", "`key` of the one descriptor entry of each request")
		fs.DurationVar(&o.cfg.Timeout, "timeout", 2*time.Second, "timeout of each request")
		fs.Uint64Var(&o.cfg.Seed, "seed", 1, "seed of the choice of keys")
	})
	h.group("Run", func(fs *flag.FlagSet) {
		fs.BoolVar(&o.cfg.Fill, "fill", false, "first send one request for every key, so that the server holds them all (not measured)")
		fs.DurationVar(&o.cfg.Warmup, "warmup", time.Second, "load sent and not measured, before the measurement")
		fs.DurationVar(&o.cfg.Duration, "duration", 10*time.Second, "length of the measurement (0: until --requests)")
		fs.Int64Var(&o.cfg.Requests, "requests", 0, "stop after this many measured requests (0: no cap)")
	})
	h.group("Output", func(fs *flag.FlagSet) {
		fs.BoolVar(&o.asJSON, "json", false, "print the result as one line of JSON (latencies in microseconds)")
		fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the generator itself to this `file`")
	})
	return h
}

func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o benchFlags
	h := o.help()
	cfg := &o.cfg
	if err := h.parse(args, false, stderr); err != nil {
		return err
	}
	cfg.Mode = loadgen.Mode(o.mode)
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	res, err := loadgen.Run(ctx, *cfg)
	if err != nil {
		fmt.Fprintf(stderr, "sluice bench: %v\n", err)
		return errUsage
	}
	if o.asJSON {
		return res.WriteJSON(stdout)
	}
	return res.WriteText(stdout)
}
