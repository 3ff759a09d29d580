package server

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// healthServices are the service names the gRPC health service knows: the
// server as a whole, the rate limit service, and "ratelimit", the name
// envoyproxy/ratelimit reports under. All share the server's readiness.
var healthServices = []string{"", "envoy.service.ratelimit.v3.RateLimitService", "ratelimit"}

// healthPoll is how often a Watch re-runs the Config.Ready check and reads
// the store's health; changes of configuration and draining are sent at
// once.
const healthPoll = 5 * time.Second

// health is the grpc.health.v1 service: SERVING exactly when /readyz
// answers 200.
type health struct {
	healthpb.UnimplementedHealthServer
	s *Server
}

func registerHealth(g *grpc.Server, s *Server) {
	healthpb.RegisterHealthServer(g, health{s: s})
}

func known(service string) bool {
	for _, n := range healthServices {
		if n == service {
			return true
		}
	}
	return false
}

func (h health) status(ctx context.Context) healthpb.HealthCheckResponse_ServingStatus {
	if h.s.readiness(ctx) != nil {
		return healthpb.HealthCheckResponse_NOT_SERVING
	}
	return healthpb.HealthCheckResponse_SERVING
}

func (h health) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if !known(req.GetService()) {
		return nil, status.Error(codes.NotFound, "unknown service "+req.GetService())
	}
	return &healthpb.HealthCheckResponse{Status: h.status(ctx)}, nil
}

func (h health) List(ctx context.Context, _ *healthpb.HealthListRequest) (*healthpb.HealthListResponse, error) {
	st := h.status(ctx)
	resp := &healthpb.HealthListResponse{Statuses: make(map[string]*healthpb.HealthCheckResponse, len(healthServices))}
	for _, n := range healthServices {
		resp.Statuses[n] = &healthpb.HealthCheckResponse{Status: st}
	}
	return resp, nil
}

// Watch sends the status now and at every change until the client leaves.
// An unknown service is SERVICE_UNKNOWN, as the protocol asks.
func (h health) Watch(req *healthpb.HealthCheckRequest, stream grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
	ctx := stream.Context()
	if !known(req.GetService()) {
		if err := stream.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVICE_UNKNOWN}); err != nil {
			return err
		}
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	}
	var poll <-chan time.Time
	if h.s.ready != nil || h.s.storeUp != nil {
		t := time.NewTicker(healthPoll)
		defer t.Stop()
		poll = t.C
	}
	last := healthpb.HealthCheckResponse_UNKNOWN
	for {
		changed := h.s.changes()
		if st := h.status(ctx); st != last {
			if err := stream.Send(&healthpb.HealthCheckResponse{Status: st}); err != nil {
				return err
			}
			last = st
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-changed:
		case <-poll:
		}
	}
}
