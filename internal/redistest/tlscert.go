package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
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
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "redistest CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	c := &certs{
		CAFile:   filepath.Join(dir, "ca.crt"),
		CertFile: filepath.Join(dir, "redis.crt"),
		KeyFile:  filepath.Join(dir, "redis.key"),
		pool:     x509.NewCertPool(),
	}
	c.pool.AddCert(ca)
	files := []struct {
		path, kind string
		der        []byte
	}{
		{c.CAFile, "CERTIFICATE", caDER},
		{c.CertFile, "CERTIFICATE", der},
		{c.KeyFile, "EC PRIVATE KEY", keyDER},
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.kind, Bytes: f.der}), 0o600); err != nil {
			return nil, err
		}
	}
	c.pair = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
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
