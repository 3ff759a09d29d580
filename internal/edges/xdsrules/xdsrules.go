// Package xdsrules takes rules from an xDS management server instead of
// files, as envoyproxy/ratelimit's CONFIG_TYPE=GRPC_XDS_SOTW does: a
// state-of-the-world ADS stream of
// ratelimit.config.ratelimit.v3.RateLimitConfig resources, one domain
// each. Every response is converted to rules and checked by package rules
// as a file is, then acknowledged (ACK) and put in force, or refused
// (NACK: the version in force, the refused response's nonce, and every
// problem in the error detail) while the rules in force stay. A stream
// that fails is opened again after a backoff.
//
// A refused version is logged once, and reported to OnError once. A
// server may send a version it was told is refused again at once, for
// ever: go-control-plane's snapshot cache answers a request whose version
// is not its snapshot's straight away, and a NACK carries the version in
// force. So a version refused again is NACKed only Config.NackInterval
// after the response came, which bounds the loop to one round a
// NackInterval instead of as fast as both ends go; a server with a new
// version sends it in answer to that NACK.
//
// This package imports rules, grpc and the Envoy protos; it serves
// nothing and stores nothing: callers apply new rules in Config.OnLoad.
package xdsrules

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/sluicehq/sluice/internal/base/redact"
	"github.com/sluicehq/sluice/rules"
)

// Config configures a Client. Target and Node are required.
type Config struct {
	// Target is the management server's address, for grpc.NewClient.
	Target string
	// DialOptions are the connection's options; at least its transport
	// credentials.
	DialOptions []grpc.DialOption
	// Node identifies this client to the server (envoy-rl's
	// CONFIG_GRPC_XDS_NODE_ID and CONFIG_GRPC_XDS_NODE_METADATA).
	Node *corev3.Node
	// Headers are added to the stream's metadata (envoy-rl's
	// CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS).
	Headers map[string]string
	// MergeDomains lets several resources define one domain
	// (rules.LoadOptions.MergeDomains).
	MergeDomains bool

	// OnLoad is called with every new config put in force, OnError with
	// the error of every version refused (once: not again when the server
	// sends the same version again); both from Run's goroutine.
	OnLoad  func(*rules.Config)
	OnError func(error)
	Logger  *slog.Logger

	// NackInterval is how long after a response the NACK of a version
	// refused just before is sent: the pace at which a server that sends a
	// refused version again at once is answered (zero: 1s).
	NackInterval time.Duration

	// Backoff bounds the wait before a failed stream is opened again:
	// from MinBackoff (zero: 500ms), doubling with jitter, up to
	// MaxBackoff (zero: 30s).
	MinBackoff, MaxBackoff time.Duration
}

// Client keeps the rules of a management server.
type Client struct {
	cfg     Config
	log     *slog.Logger
	current atomic.Pointer[rules.Config]
	first   chan struct{} // closed when the first config is in force
	once    sync.Once     // closes first

	// The last version refused and why, until a version is put in force
	// (Run's goroutine only).
	refusedVersion, refusedWhy string
	refused                    bool
}

// New returns a Client of cfg, with no rules until the server sends them.
func New(cfg Config) (*Client, error) {
	if cfg.Target == "" || cfg.Node == nil {
		return nil, errors.New("xdsrules: Target and Node are required")
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 500 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 30 * time.Second
	}
	if cfg.NackInterval <= 0 {
		cfg.NackInterval = time.Second
	}
	c := &Client{cfg: cfg, log: cfg.Logger, first: make(chan struct{})}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	empty, _ := rules.NewConfig()
	c.current.Store(empty)
	return c, nil
}

// Current returns the rules in force: empty until the first response.
func (c *Client) Current() *rules.Config { return c.current.Load() }

// First is closed once the first config is in force.
func (c *Client) First() <-chan struct{} { return c.first }

// Reload does nothing: the server sends changes when they happen.
func (c *Client) Reload() {
	c.log.Info("rules come from the xDS server, which sends every change: nothing to reload")
}

// Run keeps a stream to the server until ctx ends, opening it again after
// a backoff when it fails. It returns nil when ctx ends.
func (c *Client) Run(ctx context.Context) error {
	wait := c.cfg.MinBackoff
	for {
		err := c.stream(ctx)
		if ctx.Err() != nil {
			return nil
		}
		c.log.Warn("xDS stream to the management server failed; opening it again", "target", redact.Value(c.cfg.Target), "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait/2 + rand.N(wait/2+1)):
		}
		wait = min(2*wait, c.cfg.MaxBackoff)
	}
}

// stream runs one stream until it fails.
func (c *Client) stream(ctx context.Context) error {
	conn, err := grpc.NewClient(c.cfg.Target, c.cfg.DialOptions...)
	if err != nil {
		return err
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(c.cfg.Headers) > 0 {
		sctx = metadata.NewOutgoingContext(sctx, metadata.New(c.cfg.Headers))
	}
	ads, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx)
	if err != nil {
		return err
	}
	// The version in force from this stream, sent with every request: ""
	// until one is, so that a new stream gets the server's whole state.
	acked := ""
	send := func(nonce string, refused error) error {
		req := &discovery.DiscoveryRequest{Node: c.cfg.Node, TypeUrl: resource.RateLimitConfigType, VersionInfo: acked, ResponseNonce: nonce}
		if refused != nil {
			req.ErrorDetail = status.New(codes.InvalidArgument, refused.Error()).Proto()
		}
		return ads.Send(req)
	}
	if err := send("", nil); err != nil {
		return err
	}
	c.log.Info("xDS stream open", "target", redact.Value(c.cfg.Target), "node", c.cfg.Node.GetId())
	for {
		resp, err := ads.Recv()
		if err != nil {
			return err
		}
		at := time.Now()
		if resp.GetTypeUrl() != resource.RateLimitConfigType {
			c.log.Debug("xDS response of a type not asked for, ignored", "type_url", resp.GetTypeUrl(), "version", resp.GetVersionInfo())
			continue
		}
		version := resp.GetVersionInfo()
		cfg, err := Convert(resp.GetResources(), rules.LoadOptions{MergeDomains: c.cfg.MergeDomains})
		if err != nil {
			if c.refuse(version, err) {
				// Sent again as it was refused: NACKed at a pace.
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(time.Until(at.Add(c.cfg.NackInterval))):
				}
			}
			if err := send(resp.GetNonce(), err); err != nil {
				return err
			}
			continue
		}
		acked = version
		if err := send(resp.GetNonce(), nil); err != nil {
			return err
		}
		c.refused = false
		prev := c.current.Swap(cfg)
		if prev.Hash() != cfg.Hash() {
			c.log.Info("xDS rules loaded", "version", version, "hash", cfg.Hash(), "domains", cfg.Domains())
			if c.cfg.OnLoad != nil {
				c.cfg.OnLoad(cfg)
			}
		}
		// After OnLoad: whoever waits for the first rules (readiness)
		// finds them in force.
		c.once.Do(func() { close(c.first) })
	}
}

// refuse notes that version was refused for err: logged, and reported to
// OnError, unless it is the version refused last for the same reason
// (the server sent it again), which refuse reports with true.
func (c *Client) refuse(version string, err error) (again bool) {
	why := err.Error()
	if c.refused && version == c.refusedVersion && why == c.refusedWhy {
		c.log.Debug("xDS rules refused again; NACKed after a pause", "version", version, "in", c.cfg.NackInterval)
		return true
	}
	c.refused, c.refusedVersion, c.refusedWhy = true, version, why
	c.log.Error("xDS rules refused (NACK); keeping the rules in force", "version", version, "err", err, "hash", c.current.Load().Hash())
	if c.cfg.OnError != nil {
		c.cfg.OnError(err)
	}
	return false
}

// Convert turns RateLimitConfig resources into rules, each checked as a
// rules file named after the resource is (envoy-rl converts them to its
// YAML the same way): every problem of every resource is reported.
func Convert(resources []*anypb.Any, opt rules.LoadOptions) (*rules.Config, error) {
	var probs []rules.Problem
	var domains []*rules.Domain
	for i, res := range resources {
		var rc rlconf.RateLimitConfig
		if err := res.UnmarshalTo(&rc); err != nil {
			probs = append(probs, rules.Problem{File: fmt.Sprintf("resource %d", i), Msg: fmt.Sprintf("not a RateLimitConfig: %v", err)})
			continue
		}
		name := rc.GetName()
		if name == "" {
			name = fmt.Sprintf("resource %d", i)
		}
		data, err := yaml.Marshal(toYAML(&rc))
		if err != nil {
			probs = append(probs, rules.Problem{File: name, Msg: err.Error()})
			continue
		}
		d, err := rules.Parse("xds:"+name, data)
		if err != nil {
			var re *rules.Error
			if errors.As(err, &re) {
				probs = append(probs, re.Problems...)
				continue
			}
			return nil, err
		}
		domains = append(domains, d)
	}
	if len(probs) > 0 {
		return nil, &rules.Error{Problems: probs}
	}
	return rules.NewConfigWith(domains, opt)
}

// toYAML is the rules file of rc.
func toYAML(rc *rlconf.RateLimitConfig) map[string]any {
	return map[string]any{"domain": rc.GetDomain(), "descriptors": descriptors(rc.GetDescriptors())}
}

func descriptors(ds []*rlconf.RateLimitDescriptor) []any {
	out := make([]any, 0, len(ds))
	for _, d := range ds {
		m := map[string]any{"key": d.GetKey()}
		if d.GetValue() != "" {
			m["value"] = d.GetValue()
		}
		if rl := d.GetRateLimit(); rl != nil {
			r := map[string]any{"unit": strings.ToLower(rl.GetUnit().String()), "requests_per_unit": rl.GetRequestsPerUnit()}
			if rl.GetUnlimited() {
				r = map[string]any{"unlimited": true}
			}
			if rl.GetName() != "" {
				r["name"] = rl.GetName()
			}
			if len(rl.GetReplaces()) > 0 {
				var reps []any
				for _, rep := range rl.GetReplaces() {
					reps = append(reps, map[string]any{"name": rep.GetName()})
				}
				r["replaces"] = reps
			}
			m["rate_limit"] = r
		}
		if len(d.GetDescriptors()) > 0 {
			m["descriptors"] = descriptors(d.GetDescriptors())
		}
		if d.GetShadowMode() {
			m["shadow_mode"] = true
		}
		if d.GetDetailedMetric() {
			m["detailed_metric"] = true
		}
		if d.GetQuotaMode() {
			m["quota_mode"] = true
		}
		if md := d.GetMetadata(); md != nil {
			m["metadata"] = md.AsMap()
		}
		out = append(out, m)
	}
	return out
}
