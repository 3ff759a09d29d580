package loadgen

import (
	"context"
	"io"
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
)

// NullServer is a rate limit service that decides nothing: it answers every
// request OK at once, with one status per descriptor shaped like a real
// server's answer to a matched descriptor (code, current limit, remaining,
// duration until reset), so that a server under test and NullServer encode
// responses of the same size. It validates nothing and keeps no state.
//
// Register it on a grpc.Server with [RegisterNullServer]; serve POST /json
// with [NullServer.ServeHTTP].
type NullServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

// nullLimit is the limit NullServer reports: 1000 per second.
const nullLimit = 1000

// RegisterNullServer registers a NullServer as the
// envoy.service.ratelimit.v3.RateLimitService of s.
func RegisterNullServer(s *grpc.Server) {
	rlsv3.RegisterRateLimitServiceServer(s, &NullServer{})
}

// ShouldRateLimit answers OK.
func (*NullServer) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return nullResponse(req), nil
}

func nullResponse(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.GetDescriptors())),
	}
	for i := range resp.Statuses {
		resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{
			Code: rlsv3.RateLimitResponse_OK,
			CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{
				RequestsPerUnit: nullLimit,
				Unit:            rlsv3.RateLimitResponse_RateLimit_SECOND,
			},
			LimitRemaining:     nullLimit - 1,
			DurationUntilReset: &durationpb.Duration{Seconds: 1},
		}
	}
	return resp
}

// ServeHTTP answers POST /json as envoyproxy/ratelimit does, but always
// 200 and OK: it decodes the request (malformed JSON gets 400) and writes
// the response in protobuf JSON. GET /healthz answers OK; anything else is
// 404.
func (*NullServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/healthz":
		io.WriteString(w, "OK\n")
		return
	case "/json":
	default:
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	out, err := protojson.Marshal(nullResponse(&req))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(out)
}
