package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"

	"github.com/sluicehq/sluice/internal/testsupport/geoiptest"
)

// Example_countryAndASN is the country and ASN section of docs/proxy.md:
// every request is limited by the country and the autonomous system of
// its client address, looked up in MaxMind-format databases (here small
// ones built for the example).
func Example_countryAndASN() {
	dir, err := os.MkdirTemp("", "geoip-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	if err := geoiptest.WriteDir(dir); err != nil {
		panic(err)
	}
	src := []byte(`domain: api
http:
  client_ip:
    trusted_proxies: [10.0.0.0/8]    # the load balancers in front
  geoip:
    country: GeoLite2-Country.mmdb   # beside this file, or an absolute path
    asn: GeoLite2-ASN.mmdb
  routes:
    - pattern: "/"
      descriptors:
        - [{source: country}]        # key country, value "GB"
        - [{source: asn}]            # key asn, value "20712"
descriptors:
  - key: country
    value: GB
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: asn
    value: "29518"
    rate_limit: {unit: minute, requests_per_unit: 3}
`)
	// Here the load balancer is this process, on loopback.
	front, stop := exampleProxy(filepath.Join(dir, "api.yaml"), src, nil)
	defer stop()

	for _, client := range []string{
		"81.2.69.142", "81.2.69.7", "81.2.69.8", // GB, AS20712: 2 a minute
		"89.160.20.112", "2a01:4f8::1", "89.160.20.5", "2a01:4f8::9", // SE, AS29518: 3 a minute
		"10.1.2.3", // private: no country, no ASN, not limited
	} {
		req, _ := http.NewRequest("GET", front+"/", nil)
		req.Header.Set("X-Forwarded-For", client)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		fmt.Println(client, resp.StatusCode)
	}
	// Output:
	// 81.2.69.142 200
	// 81.2.69.7 200
	// 81.2.69.8 429
	// 89.160.20.112 200
	// 2a01:4f8::1 200
	// 89.160.20.5 200
	// 2a01:4f8::9 429
	// 10.1.2.3 200
}
