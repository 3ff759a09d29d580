package proxy_test

import (
	"testing"
)

// hosted limits two routes by their host, each to one request an hour:
// api.example.com's paths under /v1/, and admin.example.com's GETs, whose
// pattern is written in another spelling of its name.
const hosted = `domain: api
http:
  routes:
    - pattern: "api.example.com/v1/"
      name: v1
      descriptors: [[{key: vhost, value: api}]]
    - pattern: "GET Admin.Example.COM./"
      name: admin
      descriptors: [[{key: vhost, value: admin}]]
descriptors:
  - key: vhost
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: sliding_log}
`

// TestHostSpelling: a client that spells a route's host otherwise (in
// capitals, with a trailing dot, with or without a port, in an absolute
// request URI) is held to the route's limit, never proxied unlimited; a
// Host that cannot be read as the routes read it, and CONNECT (which
// ServeMux matched to no route, not even "/"), are refused. Only another
// host, or none, matches no host's route.
func TestHostSpelling(t *testing.T) {
	up := newUpstream(t, nil)
	f := start(t, hosted, up)
	if resp, _ := f.get("/v1/a", "Host: API.Example.com.:8090"); resp.StatusCode != 200 {
		t.Fatalf("first request to API.Example.com.:8090: %d", resp.StatusCode)
	}
	if got := up.header().Get("X-Forwarded-Host"); got != "api.example.com:8090" {
		t.Errorf("X-Forwarded-Host %q, want the host its route was chosen by, api.example.com:8090", got)
	}
	hits := up.hits.Load()
	for _, host := range []string{"api.example.com", "API.EXAMPLE.COM", "api.example.com.", "Api.Example.Com.:1", "api.example.com:8090"} {
		if resp, _ := f.get("/v1/b", "Host: "+host); resp.StatusCode != 429 {
			t.Errorf("Host %s: %d, want 429 (the route's limit, spent)", host, resp.StatusCode)
		}
	}
	for name, raw := range map[string]string{
		"an absolute URI in capitals": "GET http://API.EXAMPLE.COM./v1/c HTTP/1.1\r\nHost: elsewhere.example\r\n\r\n",
		"an empty port":               "GET /v1/c HTTP/1.1\r\nHost: api.example.com:\r\n\r\n",
	} {
		if code := f.raw(raw); code != 429 {
			t.Errorf("%s: %d, want 429", name, code)
		}
	}
	for name, raw := range map[string]string{
		"two Host headers":       "GET /v1/d HTTP/1.1\r\nHost: elsewhere.example\r\nHost: api.example.com\r\n\r\n",
		"a percent escape":       "GET /v1/d HTTP/1.1\r\nHost: api%2Eexample.com\r\n\r\n",
		"two ports":              "GET /v1/d HTTP/1.1\r\nHost: api.example.com:80:80\r\n\r\n",
		"a port of letters":      "GET /v1/d HTTP/1.1\r\nHost: api.example.com:http\r\n\r\n",
		"CONNECT to a host":      "CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n",
		"CONNECT to a path":      "CONNECT /v1/d HTTP/1.1\r\nHost: api.example.com:8090\r\n\r\n",
		"CONNECT with no host":   "CONNECT / HTTP/1.0\r\n\r\n",
		"an IPv6 address's half": "GET /v1/d HTTP/1.1\r\nHost: [::1\r\n\r\n",
	} {
		if code := f.raw(raw); code != 400 {
			t.Errorf("%s: %d, want 400", name, code)
		}
	}
	if n := up.hits.Load(); n != hits {
		t.Errorf("the upstream saw %d more requests, want none", n-hits)
	}
	// A pattern's host written in another spelling is read as the name.
	if resp, _ := f.get("/", "Host: admin.example.com"); resp.StatusCode != 200 {
		t.Errorf("first request to admin.example.com: %d", resp.StatusCode)
	}
	if resp, _ := f.get("/x", "Host: ADMIN.example.com."); resp.StatusCode != 429 {
		t.Errorf("ADMIN.example.com.: %d, want 429", resp.StatusCode)
	}
	// Another host, no host (HTTP/1.0), and a path in other letters (paths
	// are matched as sent) match no route: unlimited, as documented.
	if resp, _ := f.get("/v1/e", "Host: api.example.org"); resp.StatusCode != 200 {
		t.Errorf("another host: %d, want 200", resp.StatusCode)
	}
	if code := f.raw("GET /v1/e HTTP/1.0\r\n\r\n"); code != 200 {
		t.Errorf("no Host: %d, want 200", code)
	}
	if resp, _ := f.get("/V1/e", "Host: api.example.com"); resp.StatusCode != 200 {
		t.Errorf("/V1/e: %d, want 200", resp.StatusCode)
	}
	if n := f.count("sluice_proxy_requests_total", "route", "_unmatched", "result", "unlimited"); n != 3 {
		t.Errorf("unmatched: %v, want the 3 above", n)
	}
	if d, a := f.count("sluice_proxy_requests_total", "route", "v1", "result", "denied"), f.count("sluice_proxy_requests_total", "route", "admin", "result", "denied"); d != 7 || a != 1 {
		t.Errorf("denied: v1 %v, admin %v; want 7 and 1", d, a)
	}
}
