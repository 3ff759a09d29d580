package redistest

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"

	"github.com/sluicehq/sluice/internal/testsupport/testpki"
)

// certs are the files of a throwaway CA and of one certificate it signed
// for 127.0.0.1 and localhost, usable by servers and by clients (Redis
// replicas, cluster nodes and sentinels present it when they connect).
type certs struct {
	CAFile, CertFile, KeyFile string
	pool                      *x509.CertPool
	pair                      tls.Certificate
}

func newCerts(dir string) (*certs, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ca, err := testpki.NewCA("redistest CA")
	if err != nil {
		return nil, err
	}
	cert, key, pair, err := ca.Issue(testpki.Leaf{
		Serial:   2,
		Name:     "127.0.0.1",
		IPs:      []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames: []string{"localhost"},
		Usages:   []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, err
	}
	c := &certs{
		CAFile:   filepath.Join(dir, "ca.crt"),
		CertFile: filepath.Join(dir, "redis.crt"),
		KeyFile:  filepath.Join(dir, "redis.key"),
		pool:     x509.NewCertPool(),
		pair:     pair,
	}
	c.pool.AddCert(ca.Cert)
	for path, data := range map[string][]byte{c.CAFile: ca.PEM, c.CertFile: cert, c.KeyFile: key} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// clientConfig trusts the CA and presents the certificate, so that it works
// whether or not the server asks for client certificates.
func (c *certs) clientConfig() *tls.Config {
	return &tls.Config{
		RootCAs:      c.pool,
		Certificates: []tls.Certificate{c.pair},
		ServerName:   "127.0.0.1",
		MinVersion:   tls.VersionTLS12,
	}
}
