// Package loopback gives tests HTTP clients that connect from a chosen
// loopback address (127.0.0.2, 127.0.0.3, ...), so that a server sees
// several distinct peers on one machine.
package loopback

import (
	"net"
	"net/http"
	"testing"

	"github.com/sluicehq/sluice/internal/testsupport/testpart"
)

// Client returns an HTTP client whose connections come from the local
// address ip. Where the system cannot bind ip (loopback addresses other
// than 127.0.0.1 exist on Linux, not everywhere) the test is skipped, and
// fails under CI=true, which runs on Linux.
func Client(t testing.TB, ip string) *http.Client {
	t.Helper()
	probe, err := net.Listen("tcp", ip+":0")
	if err != nil {
		testpart.Missing(t, "cannot use loopback address "+ip+" here: "+err.Error())
	}
	probe.Close()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = d.DialContext
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}
