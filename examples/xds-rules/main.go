// Command xds-rules is a small xDS management server, built with
// go-control-plane's server and snapshot cache, that serves a rules file
// to `sluice serve --config-xds` (or to envoyproxy/ratelimit with
// CONFIG_TYPE=GRPC_XDS_SOTW): each YAML document of the file is one
// RateLimitConfig resource
// (type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig), in
// envoyproxy/ratelimit's file format. When the file changes, it serves it
// as a new version; a file that does not parse is reported and the
// version served stays. It prints every version it serves, and every
// acknowledgement (ACK) or refusal (NACK) it gets back.
//
//	go run ./examples/xds-rules -rules rules.yaml -addr 127.0.0.1:18000
//	sluice serve --config-xds 127.0.0.1:18000
//
// Every node that connects gets the same rules, whatever its node id.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:18000", "`host:port` to serve xDS on")
	path := flag.String("rules", "rules.yaml", "rules `file`: one RateLimitConfig per YAML document")
	poll := flag.Duration("poll", 500*time.Millisecond, "how often the rules file is checked for changes")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("xds-rules: ")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *addr, *path, *poll); err != nil {
		log.Fatal(err)
	}
}

// anyNode gives every node the same snapshot, whatever its id.
type anyNode struct{}

func (anyNode) ID(*corev3.Node) string { return "" }

func run(ctx context.Context, addr, path string, poll time.Duration) error {
	cache := cachev3.NewSnapshotCache(true, anyNode{}, nil)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	g := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(g, serverv3.NewServer(ctx, cache, serverv3.CallbackFuncs{StreamRequestFunc: printAck}))
	go func() {
		<-ctx.Done()
		g.Stop()
	}()
	log.Printf("listening on %s", ln.Addr())

	go watch(ctx, cache, path, poll)
	return g.Serve(ln)
}

// watch serves the file at path, and a new version whenever it changes.
func watch(ctx context.Context, cache cachev3.SnapshotCache, path string, poll time.Duration) {
	var last []byte
	version := 0
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		data, err := os.ReadFile(path)
		switch {
		case err != nil && last == nil:
			log.Printf("%v (waiting for it)", err)
			last = []byte{}
		case err == nil && !bytes.Equal(data, last):
			last = data
			confs, err := parse(data)
			if err != nil {
				log.Printf("%s: %v (still serving version %d)", path, err, version)
				break
			}
			version++
			if err := serve(ctx, cache, strconv.Itoa(version), confs); err != nil {
				log.Printf("%s: %v", path, err)
				break
			}
			log.Printf("serving version %d: %s", version, summary(confs))
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// serve puts confs in the cache as version.
func serve(ctx context.Context, cache cachev3.SnapshotCache, version string, confs []*rlconf.RateLimitConfig) error {
	res := make([]types.Resource, len(confs))
	for i, c := range confs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		return err
	}
	return cache.SetSnapshot(ctx, "", snap)
}

// parse reads the YAML documents of a rules file as RateLimitConfigs:
// envoyproxy/ratelimit's format is the proto's, with the unit in lower
// case and the name of the resource its domain.
func parse(data []byte) ([]*rlconf.RateLimitConfig, error) {
	var confs []*rlconf.RateLimitConfig
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if doc == nil {
			continue
		}
		upperUnits(doc)
		js, err := json.Marshal(doc)
		if err != nil {
			return nil, err
		}
		c := &rlconf.RateLimitConfig{}
		if err := protojson.Unmarshal(js, c); err != nil {
			return nil, fmt.Errorf("document %d: %v", len(confs)+1, err)
		}
		if c.GetName() == "" {
			c.Name = c.GetDomain()
		}
		confs = append(confs, c)
	}
	if len(confs) == 0 {
		return nil, errors.New("no rules in the file")
	}
	return confs, nil
}

// upperUnits writes every `unit: second` as the enum's name, SECOND.
func upperUnits(v any) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && k == "unit" {
				v[k] = strings.ToUpper(s)
			}
			upperUnits(x)
		}
	case []any:
		for _, x := range v {
			upperUnits(x)
		}
	}
}

// summary names the domains of confs and their descriptors.
func summary(confs []*rlconf.RateLimitConfig) string {
	var b strings.Builder
	for i, c := range confs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "domain %s (%d descriptors)", c.GetDomain(), count(c.GetDescriptors()))
	}
	return b.String()
}

func count(ds []*rlconf.RateLimitDescriptor) int {
	n := len(ds)
	for _, d := range ds {
		n += count(d.GetDescriptors())
	}
	return n
}

// printAck prints what a client says of the last version it got.
func printAck(_ int64, req *discovery.DiscoveryRequest) error {
	switch {
	case req.GetResponseNonce() == "":
		log.Printf("node %q connected", req.GetNode().GetId())
	case req.GetErrorDetail() != nil:
		log.Printf("node %q refused the version sent (keeps %q): %s", req.GetNode().GetId(), req.GetVersionInfo(), req.GetErrorDetail().GetMessage())
	default:
		log.Printf("node %q uses version %s", req.GetNode().GetId(), req.GetVersionInfo())
	}
	return nil
}
