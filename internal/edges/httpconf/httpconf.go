// Package httpconf reads the http section of a rules file: how sluice's
// HTTP front doors (sluice proxy) identify clients, which rate limit
// headers they send, and their routes, each with the descriptors its
// requests are limited by.
//
// A rules file holds one domain's rules, as sluice serve reads them, and
// optionally a top-level http section, which the rules package accepts and
// ignores and this package reads strictly: unknown keys are errors, and
// every problem is reported with its line and column, as a *rules.Error.
//
//	domain: api
//	http:
//	  client_ip:
//	    trusted_proxies: [10.0.0.0/8, "::1"]
//	    headers: [X-Forwarded-For]      # X-Forwarded-For | Forwarded | X-Real-IP
//	    ipv6_prefix: 64
//	    ipv4_prefix: 32
//	  headers: [ietf, x-ratelimit, retry-after]   # or [all], or [none]; default all
//	  shadow_mode: false
//	  geoip:                            # databases for source: country and source: asn
//	    country: GeoLite2-Country.mmdb  # relative to this file's directory
//	    asn: GeoLite2-ASN.mmdb
//	  routes:
//	    - pattern: "POST /login"      # a net/http.ServeMux pattern
//	      name: login                 # default: the pattern
//	      descriptors:                # default: [[{key: remote_address}]]
//	        - [{key: remote_address}]
//	        - [{key: user, header: X-User}]
//	        - [{key: method, source: method}, {key: path, source: path}]
//	        - [{key: plan, api_key: X-API-Key}]
//	        - [{country: CF-IPCountry}]   # a CDN's country header
//	        - [{source: country}]         # the client address in geoip's country database
//	        - [{key: network, source: asn}]
//	        - [{key: tier, value: gold}]
//	      shaping: {max_delay: 500ms, max_queue: 20}
//	      failures:                   # limits that count only these statuses
//	        statuses: [401]
//	        descriptors: [[{key: failed_login, source: remote_address}]]
//	      concurrency: {max: 10}      # in flight per client address
//	    - pattern: "POST /v1/chat/completions"
//	      descriptors: [[{key: api_key, api_key: Authorization}]]
//	      tokens:                     # a token budget (LLM APIs)
//	        descriptor: [{key: api_key_tokens, api_key: Authorization}]
//	        reserve:
//	          fields: [max_completion_tokens, max_tokens]
//	          header: X-Max-Tokens
//	          default: 1024
//	          max: 4096
//	          prompt: bytes
//	        usage: {input_weight: 1, output_weight: 4, header: X-Tokens-Used}
//	        enforce: true
//	        unbounded: refuse           # or allow: images, files, server-side tools
//	        max_body: 8388608
//	    - pattern: "/"
//	descriptors: ...                  # the rules, as always
//
// docs/proxy.md is the reference of every key. A file without an http
// section gets [Default]: one route "/" limited by the client address.
//
// This package owns the section's format and its translation into
// httplimit settings. It imports rules (for its Problem and Error types
// and to load the rules of the same file), httplimit, rls (the Decider's
// signature, to check routes with httplimit.New), geoip (to open the
// databases the section names), go.yaml.in/yaml/v3 and x/net's httpguts
// and idna (which httpguts imports already); it must not import stores,
// transports or the proxy.
package httpconf

import (
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/decision/ratelimitheaders"
)

// Section is the parsed http section. It must not be changed once handed to
// a front door.
type Section struct {
	// ClientIP is client_ip: the trusted proxies and forwarding headers
	// that identify the client, and the grouping of addresses.
	ClientIP httplimit.ClientIP

	// Headers is headers: the families of rate limit headers sent.
	// Zero means all of them (ratelimitheaders.HeadersAll).
	Headers ratelimitheaders.HeaderMode

	// ShadowMode is shadow_mode: decide and count every request, deny
	// none.
	ShadowMode bool

	// GeoIP is geoip: the databases of the entries {source: country} and
	// {source: asn}.
	GeoIP GeoIP

	// Routes are the routes in file order; never empty.
	Routes []Route
}

// Route is one entry of routes: the requests matching Pattern are limited
// by Descriptors.
type Route struct {
	// Pattern is a net/http.ServeMux pattern ("POST /login",
	// "/api/{id}", "example.com/", "/"), matched as ServeMux matches it:
	// the most specific pattern wins, whatever the order of the routes.
	// Its host is written as Host writes it (Parse does so), and so must
	// be the Host of the requests it is matched with.
	Pattern string

	// Name names the route in metrics and logs; by default the pattern.
	// Unique within the section.
	Name string

	// Descriptors are the descriptors of the route's requests, decided
	// together, all-or-nothing. Empty means httplimit's default: the
	// client address as remote_address.
	Descriptors []httplimit.Descriptor

	// Shaping is shaping: delay denied requests in a queue per key
	// instead of denying them (httplimit.Shaping):
	//	shaping: {max_delay: 500ms, max_queue: 20}
	Shaping *httplimit.Shaping

	// Failures is failures: limits that count only responses with the
	// given statuses (httplimit.Failures). A route with failures and no
	// descriptors is limited by its failure limits alone.
	//	failures:
	//	  statuses: [401, 403]
	//	  descriptors: [[{key: failed_login, source: remote_address}]]
	Failures *httplimit.Failures

	// Concurrency is concurrency: a cap on the requests in flight per key
	// in this process (httplimit.Concurrency); descriptor is one
	// descriptor's entries, by default the client address.
	//	concurrency: {max: 10, descriptor: [{key: user, header: X-User}]}
	Concurrency *httplimit.Concurrency

	// Tokens is tokens: a token budget, reserved at admission and settled
	// from the answer's usage (httplimit.Tokens).
	//	tokens:
	//	  descriptor: [{key: api_key_tokens, api_key: Authorization}]
	//	  reserve: {default: 1024, max: 4096, prompt: bytes}
	//	  enforce: true
	Tokens *httplimit.Tokens

	// Line is the line of the route in its file; 0 for the default route.
	Line int
}

// Bounds on a section.
const (
	// MaxRoutes is the most routes a section may list.
	MaxRoutes = 1000

	// MaxNameLen is the longest route name, in bytes.
	MaxNameLen = 128
)

// Default is the section of a file without one: one route "/", which
// every request matches, limited by the client address (remote_address),
// trusting no proxy and sending every rate limit header.
func Default() *Section {
	return &Section{Routes: []Route{{Pattern: "/", Name: "/"}}}
}
