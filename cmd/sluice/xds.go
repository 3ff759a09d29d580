package main

// Rules from an xDS management server (package xdsrules) instead of
// files: --config-xds and its node, as envoyproxy/ratelimit's
// CONFIG_TYPE=GRPC_XDS_SOTW with CONFIG_GRPC_XDS_SERVER_URL,
// CONFIG_GRPC_XDS_NODE_ID, CONFIG_GRPC_XDS_NODE_METADATA and
// CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS; over TLS or mutual TLS as its
// CONFIG_GRPC_XDS_SERVER_USE_TLS and the files beside it; with its
// backoff bounds and message size.

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/internal/base/redact"
	"github.com/sluicehq/sluice/internal/edges/xdsrules"
	"github.com/sluicehq/sluice/rules"
)

// xdsSettings are the flags of rules from xDS.
type xdsSettings struct {
	addr, nodeID, nodeMetadata, headers string

	tls                                bool
	tlsCA, tlsCert, tlsKey, serverName string

	minBackoff, maxBackoff time.Duration
	maxMsgSize             int
}

func (x *xdsSettings) flags(fs *flag.FlagSet) {
	fs.BoolVar(&x.tls, "xds-tls", false, "speak TLS to --config-xds, verifying its certificate against the system's CAs and --xds-tls-ca")
	fs.StringVar(&x.tlsCA, "xds-tls-ca", "", "`file` of CAs (PEM) trusted for the --config-xds server's certificate, beside the system's")
	fs.StringVar(&x.tlsCert, "xds-tls-cert", "", "`file` of the client certificate (PEM) shown to --config-xds: mutual TLS, with --xds-tls-key")
	fs.StringVar(&x.tlsKey, "xds-tls-key", "", "`file` of the key of --xds-tls-cert (PEM)")
	fs.StringVar(&x.serverName, "xds-tls-server-name", "", "`name` the --config-xds server's certificate must be valid for (default: the host of --config-xds)")
	fs.DurationVar(&x.minBackoff, "xds-backoff-min", 500*time.Millisecond, "wait before a failed --config-xds stream is opened again, doubling with jitter")
	fs.DurationVar(&x.maxBackoff, "xds-backoff-max", 30*time.Second, "longest wait before a failed --config-xds stream is opened again")
	fs.IntVar(&x.maxMsgSize, "xds-max-msg-size", 0, "largest xDS response accepted, in `bytes` (0: gRPC's 4 MiB)")

	fs.StringVar(&x.addr, "config-xds", "", "`host:port` of an xDS management server to take the rules from (RateLimitConfig resources over ADS, state of the world) instead of --config")
	fs.StringVar(&x.nodeID, "xds-node-id", "", "`id` of this node for --config-xds")
	fs.StringVar(&x.nodeMetadata, "xds-node-metadata", "", "`metadata` of this node for --config-xds, as key=value,key=value")
	fs.StringVar(&x.headers, "xds-headers", "", "`headers` added to the --config-xds stream, as key=value,key=value")
}

// pairs reads key=value,key=value given to flag.
// The error names the pair that is not key=value, unless flag holds
// secrets (--xds-headers).
func pairs(flag, s string) (map[string]string, error) {
	m, err := keyValues(s, "=")
	switch {
	case err != nil && redact.SecretFlag(flag):
		return nil, fmt.Errorf("--%s: a pair is not key=value (not shown: it may hold a secret)", flag)
	case err != nil:
		return nil, fmt.Errorf("--%s: %w", flag, err)
	}
	return m, nil
}

func (x *xdsSettings) check() []string {
	var probs []string
	if x.addr == "" {
		return nil
	}
	if strings.Contains(x.addr, "@") {
		// gRPC would dial it whole, and its errors would name it.
		probs = append(probs, fmt.Sprintf("--config-xds %q: an @ in it: the address of an xDS server takes no credentials (--xds-headers sends them)", redact.Value(x.addr)))
	}
	if (x.tlsCert == "") != (x.tlsKey == "") {
		probs = append(probs, "--xds-tls-cert and --xds-tls-key go together")
	}
	if !x.tls && (x.tlsCA != "" || x.tlsCert != "" || x.serverName != "") {
		probs = append(probs, "--xds-tls-ca, --xds-tls-cert, --xds-tls-key and --xds-tls-server-name need --xds-tls")
	}
	if x.minBackoff <= 0 || x.maxBackoff < x.minBackoff {
		probs = append(probs, "--xds-backoff-min must be positive and at most --xds-backoff-max")
	}
	if x.maxMsgSize < 0 {
		probs = append(probs, "--xds-max-msg-size must not be negative")
	}
	for flag, v := range map[string]string{"xds-node-metadata": x.nodeMetadata, "xds-headers": x.headers} {
		if _, err := pairs(flag, v); err != nil {
			probs = append(probs, err.Error())
		}
	}
	return probs
}

// client returns the rules client of the flags.
func (x *xdsSettings) client(onLoad func(*rules.Config), onError func(error), merge bool, log *slog.Logger) (*xdsrules.Client, error) {
	md, _ := pairs("xds-node-metadata", x.nodeMetadata)
	headers, _ := pairs("xds-headers", x.headers)
	fields := map[string]*structpb.Value{}
	for k, v := range md {
		fields[k] = structpb.NewStringValue(v)
	}
	creds, err := x.credentials()
	if err != nil {
		return nil, err
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if x.maxMsgSize > 0 {
		opts = append(opts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(x.maxMsgSize)))
	}
	return xdsrules.New(xdsrules.Config{
		Target:       x.addr,
		DialOptions:  opts,
		Node:         &corev3.Node{Id: x.nodeID, Metadata: &structpb.Struct{Fields: fields}},
		Headers:      headers,
		MergeDomains: merge,
		OnLoad:       onLoad,
		OnError:      onError,
		Logger:       log,
		MinBackoff:   x.minBackoff,
		MaxBackoff:   x.maxBackoff,
	})
}

// credentials returns the stream's transport credentials: plaintext, or
// TLS trusting the system's CAs and --xds-tls-ca, with a client
// certificate for mutual TLS. The files are read now, so that a bad one
// fails the start with its name.
func (x *xdsSettings) credentials() (credentials.TransportCredentials, error) {
	if !x.tls {
		return insecure.NewCredentials(), nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: x.serverName}
	if x.tlsCA != "" {
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		pem, err := os.ReadFile(x.tlsCA)
		if err != nil {
			return nil, fmt.Errorf("--xds-tls-ca: %w", err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--xds-tls-ca %s: no PEM certificate in it", x.tlsCA)
		}
		cfg.RootCAs = pool
	}
	if x.tlsCert != "" {
		pair, err := tls.LoadX509KeyPair(x.tlsCert, x.tlsKey)
		if err != nil {
			return nil, fmt.Errorf("--xds-tls-cert and --xds-tls-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return credentials.NewTLS(cfg), nil
}
