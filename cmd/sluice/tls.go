package main

// gRPC server TLS for sluice serve: a certificate and key (reloaded when
// their files change, so that a rotated certificate needs no restart),
// and, for mutual TLS, the CA that client certificates must chain to and
// optionally the name they must carry. envoyproxy/ratelimit's
// GRPC_SERVER_USE_TLS, GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY,
// GRPC_CLIENT_TLS_CACERT and GRPC_CLIENT_TLS_SAN map onto these flags.

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// tlsSettings are the gRPC listener's TLS flags.
type tlsSettings struct {
	cert, key string // server certificate and key files; empty: no TLS
	clientCA  string // CA file of client certificates: mutual TLS
	clientSAN string // a DNS name client certificates must be valid for
}

func (t *tlsSettings) flags(fs *flag.FlagSet) {
	fs.StringVar(&t.cert, "grpc-tls-cert", "", "`file` of the gRPC listener's TLS certificate (PEM, chain included); with --grpc-tls-key, the listener speaks TLS only. Reloaded when the file changes")
	fs.StringVar(&t.key, "grpc-tls-key", "", "`file` of the key of --grpc-tls-cert (PEM)")
	fs.StringVar(&t.clientCA, "grpc-client-ca", "", "`file` of the CAs (PEM) that client certificates must chain to: mutual TLS, a client without such a certificate is refused. Reloaded when the file changes")
	fs.StringVar(&t.clientSAN, "grpc-client-san", "", "`name` a client certificate must carry among its DNS SANs, with --grpc-client-ca: compared exactly but for case and a trailing dot, so a wildcard SAN (*.internal) does not match")
}

// check reports what is wrong with the flags together.
func (t *tlsSettings) check() []string {
	var probs []string
	switch {
	case (t.cert == "") != (t.key == ""):
		probs = append(probs, "--grpc-tls-cert and --grpc-tls-key go together")
	case t.cert == "" && (t.clientCA != "" || t.clientSAN != ""):
		probs = append(probs, "--grpc-client-ca and --grpc-client-san need --grpc-tls-cert and --grpc-tls-key")
	}
	if t.clientSAN != "" && t.clientCA == "" {
		probs = append(probs, "--grpc-client-san needs --grpc-client-ca")
	}
	return probs
}

// config returns the listener's TLS configuration, nil without TLS. The
// files are read now, so that a bad one fails the start with its name,
// and again when they change (reloading): the certificate and key, and
// the CA of client certificates, so that either rotates without a
// restart. A rotation that leaves a file unreadable keeps what was in
// force, logs it (WARN) and counts it in
// sluice_grpc_tls_loads_total{file,result} of reg.
func (t *tlsSettings) config(log *slog.Logger, reg prometheus.Registerer) (*tls.Config, error) {
	if t.cert == "" {
		return nil, nil
	}
	loads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_grpc_tls_loads_total",
		Help: "Loads of the gRPC listener's TLS files after start (file: certificate or client_ca), by result: a failure keeps what was in force.",
	}, []string{"file", "result"})
	if reg != nil {
		reg.MustRegister(loads)
	}
	kp := &reloading[*tls.Certificate]{
		files: []string{t.cert, t.key}, what: "certificate", log: log, loads: loads,
		parse: func() (*tls.Certificate, error) {
			c, err := tls.LoadX509KeyPair(t.cert, t.key)
			if err != nil {
				return nil, fmt.Errorf("--grpc-tls-cert %s, --grpc-tls-key %s: %w", t.cert, t.key, err)
			}
			return &c, nil
		},
	}
	if err := kp.load(); err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return kp.get(), nil },
		NextProtos:     []string{"h2"},
	}
	if t.clientCA == "" {
		return cfg, nil
	}
	if t.clientSAN != "" {
		cfg.VerifyPeerCertificate = requireSAN(t.clientSAN)
	}
	cfg.ClientAuth = tls.RequireAndVerifyClientCert
	// Each handshake takes the configuration of the CAs in force.
	withCAs := &reloading[*tls.Config]{
		files: []string{t.clientCA}, what: "client_ca", log: log, loads: loads,
		parse: func() (*tls.Config, error) {
			pool, err := readCAs("grpc-client-ca", t.clientCA)
			if err != nil {
				return nil, err
			}
			c := cfg.Clone()
			c.ClientCAs = pool
			return c, nil
		},
	}
	if err := withCAs.load(); err != nil {
		return nil, err
	}
	outer := cfg.Clone()
	outer.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) { return withCAs.get(), nil }
	return outer, nil
}

// readCAs reads a PEM file of CA certificates, given to flag.
func readCAs(flag, file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flag, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--%s: no PEM certificates in %s", flag, file)
	}
	return pool, nil
}

// requireSAN returns a check that the verified client certificate
// carries name among its DNS SANs, compared exactly but for case and a
// trailing dot. A wildcard there (*.internal) does not match: it names
// whoever holds a certificate for any name under it, where name is one
// client. (envoyproxy/ratelimit's GRPC_CLIENT_TLS_SAN takes the
// wildcards of x509's VerifyHostname.)
func requireSAN(name string) func([][]byte, [][]*x509.Certificate) error {
	want := dnsKey(name)
	return func(_ [][]byte, chains [][]*x509.Certificate) error {
		for _, chain := range chains {
			if len(chain) > 0 && slices.ContainsFunc(chain[0].DNSNames, func(n string) bool { return dnsKey(n) == want }) {
				return nil
			}
		}
		return fmt.Errorf("client certificate does not carry the DNS name %q", name)
	}
}

// dnsKey is a DNS name as requireSAN compares it.
func dnsKey(name string) string { return strings.ToLower(strings.TrimSuffix(name, ".")) }

// reloading holds what parse makes of files, made again when a file's
// modification time or size changes (looked at, on use, at most once a
// second: a symlink swapped by the kubelet changes both), so that new
// connections get the new files without a restart. A load that fails
// keeps the last good value; it is logged once (WARN) for each state of
// the files, and counted.
type reloading[T any] struct {
	files []string
	what  string // the file label of loads
	parse func() (T, error)
	log   *slog.Logger
	loads *prometheus.CounterVec // {file, result}

	mu      sync.Mutex
	current T
	stamp   string    // modification times and sizes of the files loaded
	failed  string    // stamp of the last load that failed, logged
	checked time.Time // last look at the files
}

// stampOf identifies the present state of the files.
func (r *reloading[T]) stampOf() (string, error) {
	var s string
	for _, f := range r.files {
		fi, err := os.Stat(f)
		if err != nil {
			return "", err
		}
		s += fmt.Sprintf("%d/%d;", fi.ModTime().UnixNano(), fi.Size())
	}
	return s, nil
}

// load makes the value at start: an error names the file.
func (r *reloading[T]) load() error {
	stamp, err := r.stampOf()
	if err != nil {
		return fmt.Errorf("%s: %w", strings.Join(r.files, ", "), err)
	}
	v, err := r.parse()
	if err != nil {
		return err
	}
	r.current, r.stamp, r.checked = v, stamp, time.Now()
	return nil
}

// get returns the value in force, made again first if the files changed.
func (r *reloading[T]) get() T {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.checked) < time.Second {
		return r.current
	}
	r.checked = time.Now()
	stamp, err := r.stampOf()
	if err == nil && (stamp == r.stamp || stamp == r.failed) {
		return r.current
	}
	if err == nil {
		var v T
		if v, err = r.parse(); err == nil {
			r.current, r.stamp, r.failed = v, stamp, ""
			r.loads.WithLabelValues(r.what, "success").Inc()
			r.log.Info("gRPC TLS file reloaded", "file", r.what, "path", strings.Join(r.files, ", "))
			return r.current
		}
		r.failed = stamp
	} else if r.failed == "missing" {
		return r.current
	} else {
		r.failed = "missing"
	}
	r.loads.WithLabelValues(r.what, "failure").Inc()
	r.log.Warn("gRPC TLS file not reloaded; keeping the one in force", "file", r.what, "path", strings.Join(r.files, ", "), "err", err)
	return r.current
}
