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
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"
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
	fs.StringVar(&t.clientCA, "grpc-client-ca", "", "`file` of the CAs (PEM) that client certificates must chain to: mutual TLS, a client without such a certificate is refused")
	fs.StringVar(&t.clientSAN, "grpc-client-san", "", "`name` a client certificate must be valid for (a DNS name among its SANs), with --grpc-client-ca")
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
// files are read now, so that a bad one fails the start with its name.
func (t *tlsSettings) config() (*tls.Config, error) {
	if t.cert == "" {
		return nil, nil
	}
	kp := &keyPair{cert: t.cert, key: t.key}
	if _, err := kp.load(); err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: kp.get,
		NextProtos:     []string{"h2"},
	}
	if t.clientCA != "" {
		pool, err := readCAs("grpc-client-ca", t.clientCA)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		if t.clientSAN != "" {
			cfg.VerifyPeerCertificate = requireSAN(t.clientSAN)
		}
	}
	return cfg, nil
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

// requireSAN returns a check that the verified client certificate is valid
// for name (one of its DNS SANs matches it), as envoyproxy/ratelimit's
// GRPC_CLIENT_TLS_SAN requires.
func requireSAN(name string) func([][]byte, [][]*x509.Certificate) error {
	return func(_ [][]byte, chains [][]*x509.Certificate) error {
		for _, chain := range chains {
			if len(chain) > 0 && chain[0].VerifyHostname(name) == nil {
				return nil
			}
		}
		return fmt.Errorf("client certificate is not valid for %q", name)
	}
}

// keyPair serves a certificate from its files, loading them again when
// either file's modification time or size changes (checked at most once a
// second), so that a rotated certificate is served to new connections
// without a restart. A rotation that leaves the files unreadable, or not a
// pair, keeps the last good certificate.
type keyPair struct {
	cert, key string

	mu      sync.Mutex
	current *tls.Certificate
	stamp   string    // modification times and sizes of the files loaded
	checked time.Time // last look at the files
}

// stampOf identifies the present state of the files.
func (k *keyPair) stampOf() (string, error) {
	var s string
	for _, f := range []string{k.cert, k.key} {
		fi, err := os.Stat(f)
		if err != nil {
			return "", err
		}
		s += fmt.Sprintf("%d/%d;", fi.ModTime().UnixNano(), fi.Size())
	}
	return s, nil
}

// load reads the pair, making it current.
func (k *keyPair) load() (*tls.Certificate, error) {
	stamp, err := k.stampOf()
	if err != nil {
		return nil, fmt.Errorf("--grpc-tls-cert/--grpc-tls-key: %w", err)
	}
	c, err := tls.LoadX509KeyPair(k.cert, k.key)
	if err != nil {
		return nil, fmt.Errorf("--grpc-tls-cert %s, --grpc-tls-key %s: %w", k.cert, k.key, err)
	}
	k.mu.Lock()
	k.current, k.stamp, k.checked = &c, stamp, time.Now()
	k.mu.Unlock()
	return &c, nil
}

// get is tls.Config.GetCertificate.
func (k *keyPair) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	k.mu.Lock()
	cur, stale := k.current, time.Since(k.checked) >= time.Second
	if stale {
		k.checked = time.Now()
	}
	old := k.stamp
	k.mu.Unlock()
	if stale {
		if stamp, err := k.stampOf(); err == nil && stamp != old {
			if c, err := k.load(); err == nil {
				return c, nil
			}
		}
	}
	if cur == nil {
		return nil, errors.New("no server certificate")
	}
	return cur, nil
}
