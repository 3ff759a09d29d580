// Package proxy is sluice's rate limiting reverse proxy: an http.Handler
// that limits each request with the httplimit middleware of the route it
// matches and passes what is admitted to one upstream through
// httputil.ReverseProxy, so that the upstream never sees a request its
// limits deny.
//
// # Routes
//
// The routes of an httpconf.Section are registered on a net/http.ServeMux,
// each as httplimit middleware, with the route's descriptors, around one
// ReverseProxy shared by all routes. A request is matched as ServeMux
// matches it (the most specific pattern wins); the mux's redirects (a path
// that is not clean, "/api" when only "/api/" is a route) are answered by
// the proxy as ServeMux answers them, so that no request reaches the
// upstream under a path its route was not chosen by. Hosts are matched
// in lower case and without a trailing dot (httpconf.Host), paths as
// sent (case matters); a path with an encoded separator, a Host that
// cannot be read and CONNECT are refused 400 (see routable). A request
// that matches no route is proxied unlimited (result "unlimited" in the
// metrics): a route "/" catches everything. [Proxy.SetRoutes] builds a new
// table of routes and swaps it in atomically; a request in flight finishes
// with the table it started with. A route's concurrency counts carry over
// to the route of the same name in the new table
// (httplimit.Concurrency.Inherit), so that the requests in flight still
// count against its max; a route renamed or removed leaves its requests
// counted by its old middleware alone, and its counts are kept for a
// route that takes its name again.
//
// # Forwarding headers
//
// The upstream receives X-Forwarded-For, X-Forwarded-Host and
// X-Forwarded-Proto, set from the request unless its peer (the address
// that connected to the proxy) is one of the section's trusted proxies:
//
//   - X-Forwarded-For: the peer's address; after the incoming chain, only
//     when the peer is trusted. A chain sent by anyone else never reaches
//     the upstream, so that the upstream can read the header as the
//     proxy does.
//   - X-Forwarded-Host and X-Forwarded-Proto: a trusted peer's are passed
//     on; otherwise the request's Host as its route was chosen by (in
//     lower case, without a trailing dot), and "https" or "http" as the
//     request came over TLS or not.
//   - Forwarded (RFC 7239): a trusted peer's is passed on with an element
//     for this hop appended; anyone else's is removed. X-Real-IP: a
//     trusted peer's is passed on; anyone else's is removed.
//
// The Host header is the upstream's (as httputil.ProxyRequest.SetURL
// sets it); Config.Rewrite may change that. Hop-by-hop headers are
// removed both ways, as ReverseProxy does.
//
// # Streaming
//
// Bodies are streamed both ways, never buffered whole. Responses are
// flushed to the client after every write of the upstream's body
// (Config.FlushInterval -1, the default), so that server-sent events,
// chunked responses and any slowly written body reach the client as the
// upstream writes them: a limiter in front of an API must not change when
// its bytes arrive. ReverseProxy does so already for text/event-stream
// and for responses of unknown length; the default extends it to slow
// responses of known length, for the cost of one flush per read from the
// upstream (at most 32 KB). Every writer between ReverseProxy and the
// server's (the route's recorder, the middleware's) passes a flush on,
// whether it is asked through http.ResponseController or by type
// (http.Flusher). Protocol upgrades (WebSocket) are passed through: the
// middleware does not wrap the ResponseWriter in a way that hides Hijack.
//
// Over HTTP/1 the upstream must read a request's whole body before its
// answer begins: net/http's server drains and closes what is left of a
// request body when the response's header goes out (see endedBody).
//
// # Timeouts
//
// Config.WriteIdleTimeout lets go of a client that stops reading its
// answer (each write to it must be done within the timeout), and
// Config.UpstreamTimeout of an upstream that sends no response headers
// (504); both end the request, so that its concurrency permits, renewed
// while it runs, are released. Neither cuts a stream that flows, however
// long, nor one that pauses. An upgraded connection is bounded by the
// first (each write to its client) and its 101 by the second.
//
// # Errors
//
// An upstream that cannot be reached or fails before its response starts
// is answered 502 with an RFC 9457 application/problem+json body
// ([ProblemBadGateway]) that says nothing of the cause, which is logged;
// one that sends no response headers within Config.UpstreamTimeout, 504
// ([ProblemGatewayTimeout]).
// Denials, invalid requests and decisions that fail are answered by the
// middleware (429, 400, 503; see httplimit). A request cancelled while
// it runs because its concurrency permit was lost (a renewal found the
// store no longer held it, and other requests held every slot) is
// answered 503 ([ProblemPermitLost]) if its answer had not started, cut
// short otherwise; either way it is logged (at most a line a second)
// and counted as result "error", not as an upstream error: the proxy,
// not the upstream, failed it, and a 502 would blame the upstream.
//
// # Country and ASN
//
// The entries {source: country} and {source: asn} of a route look the
// client address (as client_ip resolves it) up in the MaxMind-format
// databases of the section's geoip block. A database is reloaded when its
// file changes, in the background; a file it refuses is logged (component
// geoip) and the one in force keeps answering.
//
// AdminHandler serves the operators' side of a proxy (/healthz, /readyz,
// /metrics), apart from the API's paths.
//
// This package imports the root package, rules (the failure policy's
// name), httplimit, httpconf, the Prometheus client and the standard
// library; it must not import stores, rules loading, the reload package,
// gRPC or cmd/: the caller builds the Decider and wires reloads.
package proxy

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/edges/hitters"
	"github.com/sluicehq/sluice/internal/edges/httpconf"
	"github.com/sluicehq/sluice/internal/edges/topkeys"
	"github.com/sluicehq/sluice/rules"
)

// Config configures a Proxy. Upstream, Decider and Domain are required;
// every other zero field means the default written in its comment.
type Config struct {
	// Upstream is where admitted requests go: an http or https URL with a
	// host, and optionally a path prefix that request paths are joined to
	// (httputil.ProxyRequest.SetURL).
	Upstream *url.URL

	// Decider decides every limited request: an *decide.Decider over the
	// rules and a store, or a client of a remote sluice serve.
	Decider httplimit.Decider

	// Domain is the rules domain the requests are decided in.
	Domain string

	// HTTP is the http section: client identification, headers, shadow
	// mode and routes. Nil means httpconf.Default(), one route "/"
	// limited by the client address.
	HTTP *httpconf.Section

	// Transport carries requests to the upstream. Nil means a clone of
	// http.DefaultTransport keeping up to 100 idle connections to the
	// upstream (the default 2 would open a new connection for most
	// requests under load).
	Transport http.RoundTripper

	// FlushInterval is ReverseProxy's: how often the response is flushed
	// to the client while it is copied. Zero means -1, after every write
	// (see Streaming in the package documentation).
	FlushInterval time.Duration

	// WriteIdleTimeout bounds a client that stops reading its answer:
	// each write of the answer to the client (at most 32 KB of the
	// upstream's body, then a flush; a write to an upgraded connection)
	// must be done within it. Past it the request is aborted: its
	// connection closed, its upstream request cancelled, its permits
	// released, a token budget's reservation settled as cut off; logged
	// and counted (sluice_proxy_timeouts_total{timeout="write_idle"}).
	// A stream that keeps flowing, or pauses with nothing to write, is
	// never cut. Zero means no bound.
	WriteIdleTimeout time.Duration

	// UpstreamTimeout bounds the wait for the upstream's response
	// headers once the request (its body included) has been sent to
	// it: past it the request is answered 504 ([ProblemGatewayTimeout]),
	// its upstream request cancelled, logged and counted
	// (sluice_proxy_timeouts_total{timeout="upstream"}, and as an
	// upstream error); a token budget settles it as cut off. The body
	// that follows the headers is not bounded by it. It is the default
	// transport's ResponseHeaderTimeout: with a Transport, set that
	// transport's own (New refuses both). Zero means no bound.
	UpstreamTimeout time.Duration

	// Logger receives upstream errors, at most one line per second. Nil
	// discards them.
	Logger *slog.Logger

	// Metrics, when set, counts requests by route and result, upstream
	// errors and durations (see Metrics).
	Metrics *Metrics

	// Hitters, when set, is told every limited descriptor decided: its
	// rule, its key and whether it was allowed, denied or denied in
	// shadow mode (the admin listener's dashboard shows them; see
	// AdminConfig). It keeps the top keys in bounded memory.
	Hitters *hitters.Tracker

	// Rewrite, when set, is called after the proxy has set the upstream
	// URL and the forwarding headers, to change the outgoing request
	// further (pr.Out).
	Rewrite func(pr *httputil.ProxyRequest)

	// ModifyResponse is ReverseProxy's: called with every upstream
	// response; an error it returns is answered as an upstream error.
	ModifyResponse func(*http.Response) error

	// ErrorHandler, when set, answers upstream errors instead of the 502
	// problem body. err is the transport's (or ModifyResponse's) error:
	// do not send it to the client.
	ErrorHandler func(w http.ResponseWriter, r *http.Request, err error)
}

// Proxy is a rate limiting reverse proxy; see the package documentation.
// Make one with New. It is safe for concurrent use.
type Proxy struct {
	cfg       Config
	upstream  *url.URL
	transport http.RoundTripper
	flush     time.Duration
	log       *slog.Logger
	table     atomic.Pointer[table]

	mu       sync.Mutex   // serializes SetRoutes
	lastLog  atomic.Int64 // upstream errors: at most one line a second
	lostLog  atomic.Int64 // requests cancelled for a lost permit: likewise
	stallLog atomic.Int64 // requests aborted for a client that stopped reading: likewise
	recorder sync.Pool    // *recorder

	writeIdle       time.Duration // Config.WriteIdleTimeout
	upstreamTimeout time.Duration // Config.UpstreamTimeout
}

// ErrConfig is wrapped by the errors of New and SetRoutes.
var ErrConfig = errors.New("proxy: invalid configuration")

// New validates cfg and returns a Proxy serving cfg.HTTP's routes.
func New(cfg Config) (*Proxy, error) {
	u := cfg.Upstream
	switch {
	case u == nil:
		return nil, fmt.Errorf("%w: Upstream is required", ErrConfig)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("%w: upstream %q is not an http or https URL", ErrConfig, u.Redacted())
	case u.Host == "":
		return nil, fmt.Errorf("%w: upstream %q has no host", ErrConfig, u.Redacted())
	case cfg.Decider == nil:
		return nil, fmt.Errorf("%w: Decider is required", ErrConfig)
	case cfg.WriteIdleTimeout < 0 || cfg.UpstreamTimeout < 0:
		return nil, fmt.Errorf("%w: a negative WriteIdleTimeout or UpstreamTimeout", ErrConfig)
	case cfg.UpstreamTimeout > 0 && cfg.Transport != nil:
		return nil, fmt.Errorf("%w: UpstreamTimeout with a Transport: set the transport's own ResponseHeaderTimeout", ErrConfig)
	}
	p := &Proxy{
		cfg:       cfg,
		upstream:  new(url.URL),
		transport: cfg.Transport,
		flush:     cfg.FlushInterval,
		log:       cfg.Logger,

		writeIdle:       cfg.WriteIdleTimeout,
		upstreamTimeout: cfg.UpstreamTimeout,
	}
	*p.upstream = *u
	if p.transport == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 100
		t.ResponseHeaderTimeout = cfg.UpstreamTimeout
		p.transport = t
	}
	if p.flush == 0 {
		p.flush = -1
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.recorder.New = func() any { return new(recorder) }
	if err := p.SetRoutes(cfg.Domain, cfg.HTTP); err != nil {
		return nil, err
	}
	return p, nil
}

// SetRoutes builds the routes of s (nil means httpconf.Default()), decided
// in domain, and puts them in force at once; on error the routes in force
// stay. A section that httpconf.Parse returned without error always
// builds.
func (p *Proxy) SetRoutes(domain string, s *httpconf.Section) error {
	if s == nil {
		s = httpconf.Default()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	t, err := p.build(domain, s)
	if err != nil {
		return err
	}
	// The section's GeoIP databases reload themselves when their files
	// change; what they refuse is logged here.
	for _, db := range s.GeoIP.DBs() {
		db.SetLogger(p.log.With("component", "geoip"))
	}
	old := p.table.Swap(t)
	if old != nil && p.cfg.Metrics != nil {
		p.cfg.Metrics.forget(old, t)
	}
	return nil
}

// ServeHTTP limits r by its route and passes it to the upstream if it is
// admitted.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p.writeIdle > 0 {
		clearWriteDeadline(w) // recorder.go
	}
	r, why := routable(r) // spelling.go
	if why != "" {
		writeProblem(w, http.StatusBadRequest, httplimit.ProblemInvalidRequest, "Bad Request", why)
		return
	}
	t := p.table.Load()
	h, pattern := t.mux.Handler(r)
	if pattern == "" { // no route: ServeMux would answer 404 or 405
		t.unmatched.ServeHTTP(w, r)
		return
	}
	h.ServeHTTP(w, r)
}

// table is one built set of routes and the ReverseProxy they share.
type table struct {
	p         *Proxy
	trusted   []netip.Prefix
	mux       *http.ServeMux
	rp        *httputil.ReverseProxy
	routes    []*route
	unmatched *route
	// conc holds the Concurrency each route's middleware was made with,
	// by route name, for the next table's to inherit its counts.
	conc map[string]*httplimit.Concurrency
}

func (p *Proxy) build(domain string, s *httpconf.Section) (*table, error) {
	if len(s.Routes) == 0 {
		return nil, fmt.Errorf("%w: no routes", ErrConfig)
	}
	t := &table{p: p, trusted: append([]netip.Prefix(nil), s.ClientIP.TrustedProxies...), mux: http.NewServeMux(),
		conc: map[string]*httplimit.Concurrency{}}
	t.rp = &httputil.ReverseProxy{
		Rewrite:        t.rewrite,
		Transport:      p.transport,
		FlushInterval:  p.flush,
		ModifyResponse: p.cfg.ModifyResponse,
		ErrorHandler:   t.upstreamError,
		ErrorLog:       slog.NewLogLogger(p.log.Handler(), slog.LevelWarn),
	}
	var record func([]rules.Descriptor, *decide.Outcome) // top keys
	if p.cfg.Hitters != nil {
		top, shadow := p.cfg.Hitters, s.ShadowMode
		// The decision that settled each request: the top keys' one
		// recording, shared with sluice serve's hook.
		record = func(descs []rules.Descriptor, o *decide.Outcome) { topkeys.Record(top, descs, o, shadow) }
	}
	names := map[string]bool{}
	for _, rc := range s.Routes {
		if names[rc.Name] || rc.Name == unmatchedRoute {
			return nil, fmt.Errorf("%w: route name %q repeated or reserved", ErrConfig, rc.Name)
		}
		names[rc.Name] = true
		conc := p.inherit(rc)
		limit, err := httplimit.New(httplimit.Config{
			Decider:     p.cfg.Decider,
			Domain:      domain,
			ClientIP:    s.ClientIP,
			Descriptors: rc.Descriptors,
			Headers:     s.Headers,
			Shaping:     rc.Shaping,
			Failures:    rc.Failures,
			Concurrency: conc,
			Tokens:      rc.Tokens,
			ShadowMode:  s.ShadowMode,
			OnResult:    t.onResult,
			OnSettle:    t.onSettle,
			OnOutcome:   record,
			Logger:      p.log.With("route", rc.Name),
		})
		if err != nil {
			return nil, fmt.Errorf("%w: route %q: %v", ErrConfig, rc.Name, err)
		}
		if conc != nil {
			conc.Inherit = nil // New took its counts: no chain of tables
			t.conc[rc.Name] = conc
		}
		rt := &route{name: rc.Name, t: t, m: p.cfg.Metrics.limitedRoute(rc.Name), tokens: rc.Tokens != nil}
		rt.h = limit(http.HandlerFunc(t.pass))
		if err := handle(t.mux, rc.Pattern, rt); err != nil {
			return nil, fmt.Errorf("%w: route %q: %v", ErrConfig, rc.Name, err)
		}
		t.routes = append(t.routes, rt)
	}
	t.carry(p.table.Load(), names)
	t.unmatched = &route{name: unmatchedRoute, t: t, m: p.cfg.Metrics.route(unmatchedRoute), unlimited: true}
	t.unmatched.h = http.HandlerFunc(t.pass)
	return t, nil
}

// carry keeps in t the counts of old's routes that t has no route of
// (renamed or removed), at most maxCarried of them: a route renamed back
// gets its counts again, so that cycling names admits max more per name,
// not per reload (an attack: 30 in flight for 3 over 20 reloads of 5
// names).
func (t *table) carry(old *table, names map[string]bool) {
	if old == nil {
		return
	}
	n := 0
	for name, c := range old.conc {
		if names[name] {
			continue
		}
		if n++; n > maxCarried {
			return
		}
		t.conc[name] = c
	}
}

// maxCarried bounds the counts of routes no longer in force a table keeps.
const maxCarried = 256

// inherit returns a copy of rc's Concurrency (nil without one) that
// inherits the counts of the route of its name in force (p.mu held), so
// that the requests it runs count against the new max until they end.
func (p *Proxy) inherit(rc httpconf.Route) *httplimit.Concurrency {
	if rc.Concurrency == nil {
		return nil
	}
	c := *rc.Concurrency
	if old := p.table.Load(); old != nil {
		c.Inherit = old.conc[rc.Name]
	}
	return &c
}

// handle registers h on mux, returning ServeMux's panic over an invalid or
// conflicting pattern as an error.
func handle(mux *http.ServeMux, pattern string, h http.Handler) (err error) {
	defer func() {
		if e := recover(); e != nil {
			err = fmt.Errorf("pattern %q: %v", pattern, e)
		}
	}()
	mux.Handle(pattern, h)
	return nil
}

// unmatchedRoute is the route label of requests that match no route.
const unmatchedRoute = "_unmatched"

// route is one route of a table: its middleware around the table's
// ReverseProxy, and its metrics.
type route struct {
	name      string
	t         *table
	h         http.Handler // the middleware, or pass for unmatched
	m         routeMetrics
	unlimited bool
	tokens    bool // a token budget's route
}

// onResult records what the middleware did with a request, for the
// metrics.
func (t *table) onResult(w http.ResponseWriter, _ *http.Request, res httplimit.Result) {
	if rec := recorderOf(w); rec != nil {
		rec.result = res
	}
}

// onSettle records a request's token reservation and what it spent, for
// the metrics.
func (t *table) onSettle(w http.ResponseWriter, _ *http.Request, reserved, spent int64) {
	if rec := recorderOf(w); rec != nil {
		rec.settled, rec.reserved, rec.spent = true, reserved, spent
	}
}

// rewrite sets the outgoing request's URL and forwarding headers (see the
// package documentation).
func (t *table) rewrite(pr *httputil.ProxyRequest) {
	in, out := pr.In, pr.Out
	pr.SetURL(t.p.upstream)
	if out.Body != nil && out.Body != http.NoBody {
		out.Body = &endedBody{ReadCloser: out.Body}
	}
	peer, ok := peerAddr(in.RemoteAddr)
	trusted := ok && t.isTrusted(peer)
	h := out.Header
	vals := new([3]string) // the values set here, in one allocation
	if ok {
		ip := peer.String()
		if prior := in.Header["X-Forwarded-For"]; trusted && len(prior) > 0 {
			ip = strings.Join(prior, ", ") + ", " + ip
		}
		vals[0] = ip
		h["X-Forwarded-For"] = vals[0:1:1]
	}
	if v := in.Header["X-Forwarded-Host"]; trusted && len(v) > 0 {
		h["X-Forwarded-Host"] = v
	} else {
		vals[1] = in.Host
		h["X-Forwarded-Host"] = vals[1:2:2]
	}
	if v := in.Header["X-Forwarded-Proto"]; trusted && len(v) > 0 {
		h["X-Forwarded-Proto"] = v
	} else {
		vals[2] = "http"
		if in.TLS != nil {
			vals[2] = "https"
		}
		h["X-Forwarded-Proto"] = vals[2:3:3]
	}
	if v := in.Header["Forwarded"]; trusted && len(v) > 0 && ok {
		h["Forwarded"] = append(v[:len(v):len(v)], forwardedElement(peer, in.TLS != nil))
	}
	if !trusted {
		delete(h, "X-Real-Ip")
	}
	if t.p.cfg.Rewrite != nil {
		t.p.cfg.Rewrite(pr)
	}
}

// forwardedElement is this hop's RFC 7239 element: for= the peer, and
// the protocol.
func forwardedElement(peer netip.Addr, tls bool) string {
	proto := "http"
	if tls {
		proto = "https"
	}
	if peer.Is6() {
		return `for="[` + peer.String() + `]";proto=` + proto
	}
	return "for=" + peer.String() + ";proto=" + proto
}

func (t *table) isTrusted(a netip.Addr) bool {
	for _, p := range t.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// peerAddr parses a RemoteAddr ("ip:port", "[ipv6]:port"), without zone,
// IPv4-mapped addresses as IPv4.
func peerAddr(s string) (netip.Addr, bool) {
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		host = s
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.WithZone("").Unmap(), true
}
