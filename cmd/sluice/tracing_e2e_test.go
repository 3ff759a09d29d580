package main

import (
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver keeps the spans an OTLP exporter sends, with the
// service.name of their resource.
type otlpReceiver struct {
	coltrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []receivedSpan
}

type receivedSpan struct {
	service, name, traceID string
	kind                   tracepb.Span_SpanKind
}

func (r *otlpReceiver) add(req *coltrace.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				service = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, receivedSpan{service, s.GetName(), hex.EncodeToString(s.GetTraceId()), s.GetKind()})
			}
		}
	}
}

func (r *otlpReceiver) Export(_ context.Context, req *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	r.add(req)
	return &coltrace.ExportTraceServiceResponse{}, nil
}

func (r *otlpReceiver) find(traceID string) (receivedSpan, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.spans {
		if s.traceID == traceID {
			return s, true
		}
	}
	return receivedSpan{}, false
}

// TestServeE2ETracing: with envoy-rl's TRACING_* variables, every call of
// the gRPC service is a server span, in the caller's trace (W3C
// traceparent), sent over OTLP to a real receiver, over HTTP (envoy-rl's
// default) and over gRPC.
func TestServeE2ETracing(t *testing.T) {
	beside(t)
	for _, protocol := range []string{"http", "grpc"} {
		t.Run(protocol, func(t *testing.T) {
			recv := &otlpReceiver{}
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			if protocol == "http" {
				srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					body, _ := io.ReadAll(r.Body)
					var req coltrace.ExportTraceServiceRequest
					if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
						http.Error(w, "bad export", http.StatusBadRequest)
						return
					}
					recv.add(&req)
					w.Header().Set("Content-Type", "application/x-protobuf")
				})}
				go srv.Serve(lis)
				t.Cleanup(func() { srv.Close() })
			} else {
				g := grpc.NewServer()
				coltrace.RegisterTraceServiceServer(g, recv)
				go g.Serve(lis)
				t.Cleanup(g.Stop)
			}
			rules := filepath.Join(t.TempDir(), "rules.yaml")
			writeRules(t, rules, dayRule("traced", "k", 5))
			p := startSluice(t, []string{
				"TRACING_ENABLED=true", "TRACING_EXPORTER_PROTOCOL=" + protocol, "TRACING_SERVICE_NAME=rl-under-test",
				"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + lis.Addr().String(), "OTEL_EXPORTER_OTLP_INSECURE=true",
				"OTEL_BSP_SCHEDULE_DELAY=100",
			}, "--config", rules)

			const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
			ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			r, err := rlsv3.NewRateLimitServiceClient(p.conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "traced", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", "v")}})
			if err != nil || codesOf(r) != "OK:OK" {
				t.Fatalf("call: %v %v", r, err)
			}
			var got receivedSpan
			poll(t, "the server span at the OTLP receiver", func() bool {
				var ok bool
				got, ok = recv.find(traceID)
				return ok
			})
			if got.name != "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" || got.kind != tracepb.Span_SPAN_KIND_SERVER || got.service != "rl-under-test" {
				t.Errorf("span %+v", got)
			}
		})
	}
}
