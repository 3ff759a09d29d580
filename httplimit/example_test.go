package httplimit_test

import (
	"fmt"
	"net/http/httptest"

	"github.com/sluicehq/sluice/httplimit"
)

func ExampleClientIP() {
	proxies, err := httplimit.ParseTrustedProxies("10.0.0.0/8")
	if err != nil {
		panic(err)
	}
	ip := &httplimit.ClientIP{TrustedProxies: proxies}

	// Behind our load balancer at 10.0.0.1: the client wrote 192.0.2.66
	// itself, the load balancer appended the address it saw.
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "10.0.0.1:4000"
	r.Header.Set("X-Forwarded-For", "192.0.2.66, 198.51.100.1")
	p, _ := ip.Resolve(r)
	fmt.Println(httplimit.Key(p))

	// The same header straight from the internet is ignored.
	r.RemoteAddr = "203.0.113.5:4000"
	p, _ = ip.Resolve(r)
	fmt.Println(httplimit.Key(p))

	// IPv6 clients are grouped by /64.
	r.RemoteAddr = "[2001:db8:1:2:aaaa:bbbb:cccc:dddd]:4000"
	p, _ = ip.Resolve(r)
	fmt.Println(httplimit.Key(p))
	// Output:
	// 198.51.100.1
	// 203.0.113.5
	// 2001:db8:1:2::/64
}
