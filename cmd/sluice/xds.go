package main

// Rules from an xDS management server (package xdsrules) instead of
// files: --config-xds and its node, as envoyproxy/ratelimit's
// CONFIG_TYPE=GRPC_XDS_SOTW with CONFIG_GRPC_XDS_SERVER_URL,
// CONFIG_GRPC_XDS_NODE_ID, CONFIG_GRPC_XDS_NODE_METADATA and
// CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS.

import (
	"flag"
	"fmt"
	"log/slog"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/xdsrules"
)

// xdsSettings are the flags of rules from xDS.
type xdsSettings struct {
	addr, nodeID, nodeMetadata, headers string
}

func (x *xdsSettings) flags(fs *flag.FlagSet) {
	fs.StringVar(&x.addr, "config-xds", "", "`host:port` of an xDS management server to take the rules from (RateLimitConfig resources over ADS, state of the world) instead of --config")
	fs.StringVar(&x.nodeID, "xds-node-id", "", "`id` of this node for --config-xds")
	fs.StringVar(&x.nodeMetadata, "xds-node-metadata", "", "`metadata` of this node for --config-xds, as key=value,key=value")
	fs.StringVar(&x.headers, "xds-headers", "", "`headers` added to the --config-xds stream, as key=value,key=value")
}

// pairs reads key=value,key=value given to flag.
func pairs(flag, s string) (map[string]string, error) {
	m, err := keyValues(s, "=")
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flag, err)
	}
	return m, nil
}

func (x *xdsSettings) check() []string {
	var probs []string
	if x.addr == "" {
		return nil
	}
	for flag, v := range map[string]string{"xds-node-metadata": x.nodeMetadata, "xds-headers": x.headers} {
		if _, err := pairs(flag, v); err != nil {
			probs = append(probs, err.Error())
		}
	}
	return probs
}

// client returns the rules client of the flags.
func (x *xdsSettings) client(onLoad func(*rules.Config), onError func(error), merge bool, log *slog.Logger) (*xdsrules.Client, error) {
	md, _ := pairs("xds-node-metadata", x.nodeMetadata)
	headers, _ := pairs("xds-headers", x.headers)
	fields := map[string]*structpb.Value{}
	for k, v := range md {
		fields[k] = structpb.NewStringValue(v)
	}
	return xdsrules.New(xdsrules.Config{
		Target:       x.addr,
		DialOptions:  []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		Node:         &corev3.Node{Id: x.nodeID, Metadata: &structpb.Struct{Fields: fields}},
		Headers:      headers,
		MergeDomains: merge,
		OnLoad:       onLoad,
		OnError:      onError,
		Logger:       log,
	})
}
