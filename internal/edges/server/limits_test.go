package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/edges/server"
	"github.com/sluicehq/sluice/internal/vocab/bounds"
)

// bytesCodec sends a []byte as the message as it is, so that a test can
// send what no generated client would: broken protobuf.
type bytesCodec struct{}

func (bytesCodec) Name() string { return "proto" }
func (bytesCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (bytesCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

// bigRequest is a request of n descriptors of entries entries each, none
// of which matches a rule of the limits test's rules.
func bigRequest(n, entries int) *rlsv3.RateLimitRequest {
	r := &rlsv3.RateLimitRequest{Domain: "api"}
	for i := range n {
		d := &rlv3.RateLimitDescriptor{}
		for j := range entries {
			d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: fmt.Sprintf("k%d", j), Value: fmt.Sprint(i)})
		}
		r.Descriptors = append(r.Descriptors, d)
	}
	return r
}

// TestRequestBounds sends requests over each bound on both transports:
// each is refused with InvalidArgument (400) naming the bound, counted in
// sluice_requests_too_large_total, and consumes nothing; a request just
// within every bound is answered.
func TestRequestBounds(t *testing.T) {
	e := newEnv(t, "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n", server.Config{})
	over := []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{"20k descriptors", bigRequest(20_000, 1), "descriptors"},
		{"descriptors", bigRequest(bounds.MaxDescriptors+1, 1), "descriptors"},
		{"entries of one", bigRequest(1, bounds.MaxEntries+1), "entries"},
		{"entries in all", bigRequest(bounds.MaxTotalEntries/bounds.MaxEntries+1, bounds.MaxEntries), "entries in all"},
	}
	user := d("user=a")
	tooLarge := func(via string) float64 {
		return metric(t, e.reg, "sluice_requests_too_large_total", "transport="+via)
	}
	for i, tc := range over {
		// The user descriptor rides along: were it consumed, the limit
		// of 1 would deny the last request below.
		tc.req.Descriptors = append([]*rlv3.RateLimitDescriptor{user}, tc.req.Descriptors...)
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.rls.ShouldRateLimit(context.Background(), tc.req)
			if status.Code(err) != grpccodes.InvalidArgument || !strings.Contains(err.Error(), "too large") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("gRPC: %v, want InvalidArgument: too large: … %s", err, tc.want)
			}
			if got := tooLarge("grpc"); got != float64(i+1) {
				t.Errorf("grpc too large: %v, want %d", got, i+1)
			}
			body, err := protojson.Marshal(tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if len(body) > server.MaxJSONBody {
				t.Fatalf("%d bytes of JSON: the case must fit the body bound, which is tested on its own below", len(body))
			}
			resp, b := e.post(string(body))
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "too large") || !strings.Contains(string(b), tc.want) {
				t.Errorf("JSON: %d %s", resp.StatusCode, b)
			}
			if got := tooLarge("http"); got != float64(i+1) {
				t.Errorf("http too large: %v, want %d", got, i+1)
			}
		})
	}
	// A key spelt with escapes is the same key to protojson: it is
	// counted all the same.
	escaped := `{"domain":"api","\u0064escriptors":[` + strings.Repeat(`{"entries":[{"key":"k","value":"v"}]},`, bounds.MaxDescriptors) + `{"entries":[{"key":"k","value":"v"}]}]}`
	if resp, b := e.post(escaped); resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "descriptors") {
		t.Errorf("escaped key: %d %s", resp.StatusCode, b)
	}
	// Nested deeper than any request: refused before protojson.
	deep := `{"domain":"api","descriptors":[{"entries":[{"key":"k","value":"v"}]}],"x":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}`
	if resp, b := e.post(deep); resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "nested") {
		t.Errorf("deep JSON: %d %s", resp.StatusCode, b)
	}
	// Over the byte bound: gRPC refuses the message itself.
	huge := &rlsv3.RateLimitRequest{Domain: strings.Repeat("x", server.MaxRequestBytes), Descriptors: []*rlv3.RateLimitDescriptor{user}}
	if _, err := e.rls.ShouldRateLimit(context.Background(), huge); status.Code(err) != grpccodes.ResourceExhausted {
		t.Errorf("%d-byte message: %v, want ResourceExhausted", proto.Size(huge), err)
	}

	// Within every bound: answered, and the user's one hit is still there.
	within := bigRequest(bounds.MaxDescriptors-1, 4)
	within.Descriptors = append(within.Descriptors, user)
	resp := e.call(within)
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.Statuses) != bounds.MaxDescriptors {
		t.Fatalf("within the bounds: %s, %d statuses", resp.OverallCode, len(resp.Statuses))
	}
	e.expect(req("api", user), 1, "OVER_LIMIT: OVER_LIMIT")
}

// TestMalformedProtobuf sends bytes that are not a RateLimitRequest over
// gRPC: InvalidArgument, as for a malformed JSON body, never Internal.
func TestMalformedProtobuf(t *testing.T) {
	e := newEnv(t, "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n", server.Config{})
	good, err := proto.Marshal(req("api", d("user=a")))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"truncated", good[:len(good)-3]},
		{"bad tag", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
		{"length past the end", []byte{0x12, 0x7f, 0x0a}},
		{"garbage", []byte("GET / HTTP/1.1\r\n\r\n")},
		{"invalid UTF-8 domain", append([]byte{0x0a, 0x02}, 0xff, 0xfe)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out []byte
			err := e.conn.Invoke(context.Background(), rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, &tc.b, &out, grpc.ForceCodecV2(bytesCodec{}))
			if status.Code(err) != grpccodes.InvalidArgument {
				t.Errorf("%x: %v, want InvalidArgument", tc.b, err)
			}
		})
	}
	// The good bytes, sent the same way, are answered.
	var out []byte
	if err := e.conn.Invoke(context.Background(), rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, &good, &out, grpc.ForceCodecV2(bytesCodec{})); err != nil {
		t.Fatalf("good bytes: %v", err)
	}
	var resp rlsv3.RateLimitResponse
	if err := proto.Unmarshal(out, &resp); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("good bytes: %v %v", resp.OverallCode, err)
	}
}

// TestScanAgreesWithDecoding checks the wire scans of both encodings
// against the counts of the decoded request, on random requests around
// the bounds: a scan refuses exactly what bounds.CheckCounts refuses.
func TestScanAgreesWithDecoding(t *testing.T) {
	e := newEnv(t, "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1000000}\n", server.Config{})
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 60 {
		r := &rlsv3.RateLimitRequest{Domain: "api"}
		n := rng.IntN(bounds.MaxDescriptors + 40)
		most, total := 0, 0
		for range n {
			k := rng.IntN(3)
			if rng.IntN(20) == 0 {
				k = rng.IntN(bounds.MaxEntries + 10)
			}
			d := &rlv3.RateLimitDescriptor{}
			for j := range k {
				d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: fmt.Sprintf("k%d", j), Value: "v"})
			}
			if rng.IntN(4) == 0 {
				d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: 1}
			}
			r.Descriptors = append(r.Descriptors, d)
			most, total = max(most, k), total+k
		}
		want := bounds.CheckCounts(n, most, total) != nil
		_, err := e.rls.ShouldRateLimit(context.Background(), r)
		if got := status.Code(err) == grpccodes.InvalidArgument && strings.Contains(err.Error(), "too large"); got != want {
			t.Errorf("request %d (%d descriptors, %d entries at most, %d in all), gRPC: %v, want too large %v", i, n, most, total, err, want)
		}
		body, _ := protojson.Marshal(r)
		resp, b := e.post(string(body))
		var eb struct{ Error string }
		json.Unmarshal(b, &eb)
		if got := resp.StatusCode == http.StatusBadRequest && strings.Contains(eb.Error, "too large"); got != want {
			t.Errorf("request %d (%d descriptors, %d entries at most, %d in all), JSON: %d %s, want too large %v", i, n, most, total, resp.StatusCode, b, want)
		}
	}
}

// BenchmarkJSON is POST /json in process (no listener): a request of one
// descriptor, and one of 20,000 that is refused on its counts.
func BenchmarkJSON(b *testing.B) {
	srv := benchServer(b, 0, false)
	h := srv.Handler()
	for _, bc := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
		code int
	}{
		{"one", req("bench", d("user=a")), http.StatusOK},
		{"refused_20k", bigRequest(20_000, 1), http.StatusBadRequest},
	} {
		body, err := protojson.Marshal(bc.req)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/json", bytes.NewReader(body)))
				if w.Code != bc.code {
					b.Fatalf("status %d: %s", w.Code, w.Body)
				}
			}
		})
	}
}
