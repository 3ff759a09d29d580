package docs

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"

	// The Envoy messages the docs' configurations name, directly or in
	// an Any's @type: registered by importing their packages.
	_ "github.com/cncf/xds/go/xds/type/matcher/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/local_ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	_ "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
)

// looksLikeEnvoy reports whether a YAML block is an Envoy configuration.
// A Kubernetes resource (apiVersion: first, as Envoy Gateway's CRDs) is
// not, though it may name Envoy's metadata namespaces.
func looksLikeEnvoy(text string) bool {
	if strings.HasPrefix(text, "apiVersion:") {
		return false
	}
	return strings.Contains(text, "typed_config") || strings.Contains(text, "@type") || strings.Contains(text, "envoy.")
}

// checkEnvoy parses the YAML text as the Envoy message named message, as
// Envoy reads its configuration (proto JSON: an unknown field or @type is
// an error), and validates it with its protoc-gen-validate rules, the
// contents of every Any within included.
func checkEnvoy(message, text string) error {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(message))
	if err != nil {
		return fmt.Errorf("envoy=%s: %v (the message's package is imported in docs/envoy_test.go?)", message, err)
	}
	var doc any
	if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
		return err
	}
	js, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	m := mt.New().Interface()
	if err := protojson.Unmarshal(js, m); err != nil {
		return err
	}
	return validateDeep(m)
}

// validateDeep runs the message's ValidateAll, and that of every message
// within it, the contents of Anys included (ValidateAll does not look
// into an Any).
func validateDeep(m proto.Message) error {
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			return err
		}
	}
	if a, ok := m.(*anypb.Any); ok {
		inner, err := a.UnmarshalNew()
		if err != nil {
			return err
		}
		if err := validateDeep(inner); err != nil {
			return fmt.Errorf("%s: %w", a.GetTypeUrl(), err)
		}
		return nil
	}
	var err error
	m.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.Message() == nil:
		case fd.IsList():
			for i := 0; i < v.List().Len() && err == nil; i++ {
				err = validateDeep(v.List().Get(i).Message().Interface())
			}
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					err = validateDeep(mv.Message().Interface())
					return err == nil
				})
			}
		default:
			err = validateDeep(v.Message().Interface())
		}
		return err == nil
	})
	return err
}

// TestEnvoyConfigs: every Envoy configuration in the user docs is a YAML
// block with envoy=MESSAGE that parses as that message and is valid, as
// Envoy would take it; an Envoy-looking YAML block without envoy= fails.
func TestEnvoyConfigs(t *testing.T) {
	for _, page := range userDocs(t) {
		for _, b := range blocks(t, page) {
			if b.lang != "yaml" && b.lang != "yml" {
				continue
			}
			where := filepath.Clean(page) + ":" + strconv.Itoa(b.line)
			message := attrs(t, page, b.line)["envoy"]
			switch {
			case message != "":
				if err := checkEnvoy(message, b.text); err != nil {
					t.Errorf("%s: envoy=%s: %v", where, message, err)
				}
			case looksLikeEnvoy(b.text):
				t.Errorf("%s: an Envoy configuration without envoy=MESSAGE: add the message it is, e.g. ```yaml envoy=envoy.config.bootstrap.v3.Bootstrap", where)
			}
		}
	}
}

// TestCheckEnvoyFails: checkEnvoy refuses what Envoy would refuse.
func TestCheckEnvoyFails(t *testing.T) {
	const filter = `name: envoy.filters.http.ratelimit
typed_config:
  "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
  domain: %s
  rate_limit_service:
    transport_api_version: V3
    grpc_service: {envoy_grpc: {cluster_name: sluice}}
`
	const hcm = "envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter"
	for _, c := range []struct {
		name, message, yaml, want string
	}{
		{"valid", hcm, fmt.Sprintf(filter, "edge"), ""},
		{"unknown field", hcm, fmt.Sprintf(filter, "edge") + "  failure_mode_deny_all: true\n", "unknown field"},
		{"invalid value in an Any", hcm, fmt.Sprintf(filter, `""`), "Domain: value length must be at least 1"},
		{"invalid value", "envoy.config.cluster.v3.Cluster", "name: sluice\nconnect_timeout: -1s\n", "ConnectTimeout"},
		{"unresolved @type", hcm, strings.Replace(fmt.Sprintf(filter, "edge"), "ratelimit.v3.RateLimit", "ratelimit.v3.RateLimiter", 1), "unable to resolve"},
		{"unknown message", "envoy.config.bootstrap.v3.Bootstrapp", "{}", "not found"},
		{"not YAML", hcm, "name: [", "yaml"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := checkEnvoy(c.message, c.yaml)
			switch {
			case c.want == "" && err != nil:
				t.Errorf("error %v, want none", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Errorf("error %v, want one with %q", err, c.want)
			}
		})
	}
	if !looksLikeEnvoy(fmt.Sprintf(filter, "edge")) || looksLikeEnvoy("domain: edge\ndescriptors: []\n") {
		t.Error("looksLikeEnvoy: an Envoy filter not seen, or sluice rules taken for Envoy")
	}
	if looksLikeEnvoy("apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: BackendTrafficPolicy\nspec: {namespace: io.envoy.ai_gateway}\n") {
		t.Error("looksLikeEnvoy: a Kubernetes resource taken for Envoy")
	}
}
