package main

// OpenTelemetry tracing of sluice serve's gRPC service, as
// envoyproxy/ratelimit traces its own: a server span for every call
// (otelgrpc), the caller's trace context taken from W3C traceparent or B3
// headers, and the spans exported over OTLP (HTTP by default, or gRPC) to
// the endpoint the standard OTEL_EXPORTER_OTLP_* variables name.
// envoy-rl's TRACING_ENABLED, TRACING_EXPORTER_PROTOCOL,
// TRACING_SAMPLING_RATE and TRACING_SERVICE_* map onto these flags.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/propagators/b3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
)

// tracingSettings are the tracing flags of sluice serve.
type tracingSettings struct {
	enabled                 bool
	protocol                string
	sampling                float64
	service, namespace, iid string
}

func (t *tracingSettings) flags(fs *flag.FlagSet) {
	fs.BoolVar(&t.enabled, "tracing", false, "trace the gRPC service with OpenTelemetry, exporting over OTLP to the endpoint of OTEL_EXPORTER_OTLP_ENDPOINT (or _TRACES_ENDPOINT)")
	fs.StringVar(&t.protocol, "tracing-protocol", "http", "`protocol` of the OTLP exporter: http or grpc")
	fs.Float64Var(&t.sampling, "tracing-sampling-rate", 1, "the share of traces sampled, from 0 to 1 (a sampled caller's trace is always followed)")
	fs.StringVar(&t.service, "tracing-service-name", "RateLimit", "service.name of the spans")
	fs.StringVar(&t.namespace, "tracing-service-namespace", "", "service.namespace of the spans")
	fs.StringVar(&t.iid, "tracing-service-instance-id", "", "service.instance.id of the spans; empty: a random one")
}

func (t *tracingSettings) check() []string {
	var probs []string
	if t.protocol != "http" && t.protocol != "grpc" {
		probs = append(probs, fmt.Sprintf("--tracing-protocol %q: want http or grpc", t.protocol))
	}
	if t.sampling < 0 || t.sampling > 1 {
		probs = append(probs, fmt.Sprintf("--tracing-sampling-rate %v is not in [0, 1]", t.sampling))
	}
	return probs
}

// start sets up the exporter and returns the gRPC server option that
// traces every call, and a shutdown that sends the spans still buffered;
// no option without --tracing.
func (t *tracingSettings) start(ctx context.Context, log *slog.Logger) ([]grpc.ServerOption, func(context.Context) error, error) {
	if !t.enabled {
		return nil, func(context.Context) error { return nil }, nil
	}
	var client otlptrace.Client
	if t.protocol == "grpc" {
		client = otlptracegrpc.NewClient()
	} else {
		client = otlptracehttp.NewClient()
	}
	exp, err := otlptrace.New(ctx, client)
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: %w", err)
	}
	iid := t.iid
	if iid == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		iid = hex.EncodeToString(b[:])
	}
	res := resource.NewSchemaless(
		attribute.String("service.name", t.service),
		attribute.String("service.namespace", t.namespace),
		attribute.String("service.instance.id", iid),
	)
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(t.sampling))),
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
	)
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, b3.New(), propagation.Baggage{})
	log.Info("tracing the gRPC service", "protocol", t.protocol, "service", t.service, "sampling_rate", t.sampling)
	opt := grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(prop)))
	return []grpc.ServerOption{opt}, tp.Shutdown, nil
}
