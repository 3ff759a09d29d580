// Package httplimit is the net/http front door of sluice: middleware that
// limits requests with the same rules and deciders as sluice serve, and the
// client address resolution it keys them by.
//
// # The middleware
//
// [New] returns a func(http.Handler) http.Handler, the shape the standard
// library, chi (r.Use) and gorilla/mux (r.Use) take as they are:
//
//	decider, err := decide.New(decide.Config{Limiter: sluice.NewLimiter(store), Rules: cfg})
//	...
//	limit, err := httplimit.New(httplimit.Config{Decider: decider, Domain: "api"})
//	...
//	http.ListenAndServe(":8080", limit(mux))
//
// For gin, wrap it per route group with a small adapter that runs the rest
// of the chain as the next handler:
//
//	func ginLimit(limit func(http.Handler) http.Handler) gin.HandlerFunc {
//		return func(c *gin.Context) {
//			passed := false
//			limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
//				passed = true
//				c.Request = r
//				c.Next()
//			})).ServeHTTP(c.Writer, c.Request)
//			if !passed {
//				c.Abort()
//			}
//		}
//	}
//
// For echo, echo.WrapMiddleware(limit) is the adapter. This package
// imports neither.
//
// For each request the middleware resolves the client (Config.ClientIP),
// builds the RLS descriptors of Config.Descriptors (by default the client
// address as Envoy's remote_address), and decides them together with
// hits_addend 1 in Config.Domain:
//
//   - allowed: the rate limit headers of the deciding limit (the one with
//     the least quota left) are set, then the handler is called; the last
//     allowed request shows 0 remaining;
//   - denied: Config.DenyStatus (429) with an RFC 9457
//     application/problem+json body ([ProblemRateLimited]) and a
//     Retry-After never earlier than the deciding limit allows; or
//     Config.OnDeny;
//   - shadow mode (Config.ShadowMode, or a rule's shadow_mode): let
//     through, as sluice serve answers;
//   - store failure: the Decider's failure policy answers (decide.Failover);
//     a fail_open answer carries no rate limit headers. When nothing can
//     answer, Config.OnError, by default a 503 that says nothing of the
//     cause;
//   - a value the limits cannot take (see [Descriptor]): 400 with a
//     problem+json body ([ProblemInvalidRequest]), nothing charged.
//
// Four options change that flow, each off by default:
//
//   - [Shaping] delays a denied request, in a FIFO queue per key, until its
//     limits admit it, up to a maximum delay and queue length: the leaky
//     bucket as a queue, as NGINX limit_req with burst;
//   - [Failures] are limits that count only responses with given statuses
//     (failed logins): checked before the handler, charged after it;
//   - [Concurrency] caps the requests in flight per key in this process;
//   - [Tokens] is a token budget for LLM APIs: a cost reserved at
//     admission from the request, settled from the answer's usage.
//
// docs/recipes.md puts them to work: login brute-force protection, per
// user plus per IP, tiered plans, tokens per API key.
//
// The headers are X-RateLimit-Limit, X-RateLimit-Remaining,
// X-RateLimit-Reset (seconds), Retry-After on denials, and the IETF
// RateLimit-Policy and RateLimit fields in the draft -08 syntax
// ("name";q=100;w=60 and "name";r=50;t=30), the same values sluice serve
// sends; Config.Headers switches each family. t and X-RateLimit-Reset are
// the seconds until more quota is available (drafts -10 and -11), and a
// denial's Retry-After is never earlier (see package ratelimitheaders).
//
// The middleware pools its per-request state (the RLS request, the
// outcome and its response, buffers). On a memstore it allocates two
// objects per request: the counter keys (one string, built by the rules)
// and, with headers, one block holding every header value.
// TestMiddlewareAllocs asserts it; BenchmarkMiddleware and its baseline
// BenchmarkDecideOnly measure the time.
//
// # Who is asking
//
// [ClientIP] resolves the client's address from the peer address and, only
// when the peer is a configured trusted proxy, from the X-Forwarded-For,
// Forwarded (RFC 7239) or X-Real-IP header, taking the right-most address
// that is not a trusted proxy. IPv6 clients are grouped by prefix (/64 by
// default) so that one host cannot mint millions of keys, and [Key] gives
// the stable string form used as the value of Envoy's remote_address
// descriptor.
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
// Other descriptors come from a header, an API key, the method and path
// (per-endpoint limits), a country header or a constant ([Source]), in any
// combination: per user and per IP together are two descriptors, decided
// all-or-nothing.
//
// This package imports the sluice root package, decide, rules,
// ratelimitheaders (the HeaderMode and the header values), openai (the
// wire format of token budgets) and the standard library; never a store (tests aside), gRPC, protobuf or a
// transport (a test holds it to that).
package httplimit
