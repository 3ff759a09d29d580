// Package httplimit is the net/http front door of sluice: it owns how an
// HTTP request is turned into the identity a limit is counted against.
//
// So far it holds "who is asking": [ClientIP] resolves the client's address
// from the peer address and, only when the peer is a configured trusted
// proxy, from the X-Forwarded-For, Forwarded (RFC 7239) or X-Real-IP header,
// taking the right-most address that is not a trusted proxy. IPv6 clients are
// grouped by prefix (/64 by default) so that one host cannot mint millions of
// keys, and [Key] gives the stable string form used as the value of Envoy's
// remote_address descriptor.
//
// Most callers want a ClientIP whose TrustedProxies come from
// [ParseTrustedProxies] and nothing else set:
//
//	proxies, err := httplimit.ParseTrustedProxies("10.0.0.0/8, ::1")
//	...
//	ip := &httplimit.ClientIP{TrustedProxies: proxies}
//	p, err := ip.Resolve(r)
//	...
//	key := httplimit.Key(p) // "203.0.113.7" or "2001:db8:1:2::/64"
//
// The zero ClientIP trusts no proxy: it ignores every forwarding header and
// returns the peer's own address.
//
// This package imports only the standard library so far; it may import the
// sluice root package and the rules package, never a store or a transport.
package httplimit
