package httpconf_test

import (
	"fmt"

	"github.com/sluicehq/sluice/internal/edges/httpconf"
)

func ExampleParse() {
	s, err := httpconf.Parse("rules.yaml", []byte(`
domain: api
http:
  client_ip: {trusted_proxies: [10.0.0.0/8]}
  routes:
    - pattern: "POST /login"
      name: login
      descriptors:
        - [{key: remote_address}]
        - [{key: user, header: X-User}]
    - pattern: "/"
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 60}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range s.Routes {
		fmt.Printf("%s (line %d): %d descriptor(s)\n", r.Name, r.Line, len(r.Descriptors))
	}

	_, err = httpconf.Parse("rules.yaml", []byte("domain: api\nhttp:\n  routes:\n    - pattern: get /login\n      descripters: []\n"))
	fmt.Println(err)
	// Output:
	// login (line 6): 2 descriptor(s)
	// / (line 11): 0 descriptor(s)
	// rules.yaml:4:16: pattern "get /login": the method must be upper case, as requests send it ("GET")
	// rules.yaml:5:7: unknown key "descripters" in a route (want one of pattern, name, descriptors, shaping, failures, concurrency, tokens)
}
