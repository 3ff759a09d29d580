package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/base/redact"
	"github.com/sluicehq/sluice/internal/edges/rlsclient"
	"github.com/sluicehq/sluice/internal/stores/stack"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

// remoteSettings are the flags of --store remote: the sluice serve (or
// any Envoy rate limit service) that decides for the proxy.
type remoteSettings struct {
	addr    string
	timeout time.Duration
	tls     bool
	tlsCA   string
}

func (r *remoteSettings) flags(fs *flag.FlagSet) {
	fs.StringVar(&r.addr, "rls-addr", "", "gRPC `address` (host:port) of the sluice serve that decides with --store remote")
	fs.DurationVar(&r.timeout, "rls-timeout", rlsclient.DefaultTimeout, "deadline of each call to --rls-addr; past it the failure policy answers")
	fs.BoolVar(&r.tls, "rls-tls", false, "call --rls-addr over TLS")
	fs.StringVar(&r.tlsCA, "rls-tls-ca", "", "PEM `file` of the CAs that sign --rls-addr's certificate (implies --rls-tls); empty means the system's")
}

// check validates the settings for the store named store.
func (r *remoteSettings) check(store string) []string {
	var probs []string
	if store != "remote" {
		if r.addr != "" || r.tls || r.tlsCA != "" {
			probs = append(probs, "--rls-addr, --rls-tls and --rls-tls-ca apply to --store remote only")
		}
		return probs
	}
	if r.addr == "" {
		probs = append(probs, "--store remote needs --rls-addr")
	}
	if strings.Contains(r.addr, "@") {
		// gRPC would dial it whole, and its errors would name it.
		probs = append(probs, fmt.Sprintf("--rls-addr %q: an @ in it: the address of a rate limit service takes no credentials", redact.Value(r.addr)))
	}
	if r.timeout <= 0 {
		probs = append(probs, fmt.Sprintf("--rls-timeout must be positive, got %v", r.timeout))
	}
	return probs
}

// dialOptions are the gRPC options of the settings: TLS when asked for.
func (r *remoteSettings) dialOptions() ([]grpc.DialOption, error) {
	if !r.tls && r.tlsCA == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if r.tlsCA != "" {
		pool, err := readCAs("rls-tls-ca", r.tlsCA)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(cfg))}, nil
}

// openRemoteDecider decides on the remote service of r. The rules
// initial, in a Decider over this process's memory, answer by their
// failure policy (the domain's failure_policy, else --failure-policy;
// local: this process's share, 1/--local-nodes, of every limit) when the remote cannot.
func openRemoteDecider(s *storeSettings, r *remoteSettings, initial *rules.Config, log *slog.Logger) (*proxyDecider, error) {
	opts, err := r.dialOptions()
	if err != nil {
		return nil, err
	}
	client, err := rlsclient.New(rlsclient.Config{
		Target:      r.addr,
		DialOptions: opts,
		Timeout:     r.timeout,
		Logger:      log.With("component", "rls"),
	})
	if err != nil {
		return nil, err
	}
	local := memstore.New(memstore.Config{})
	lim := sluice.NewLimiter(local)
	dec, err := decide.New(decide.Config{
		Limiter:  lim,
		Rules:    initial,
		Remote:   client,
		Failover: decide.Failover{Default: s.failurePolicy, Local: lim, Nodes: s.localNodes},
	})
	if err != nil {
		client.Close()
		local.Close()
		return nil, err
	}
	// The local policy's store holds permits while the service is away.
	register := func(reg *prometheus.Registry) {
		reg.MustRegister(client.Collector("sluice"), stack.LocalCollector(local))
	}
	return &proxyDecider{
		Decider:  dec,
		health:   scrubbed(client.Health),
		register: register,
		close:    func() { client.Close(); local.Close() },
	}, nil
}
