package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

// outcome is the answer to one request.
type outcome uint8

const (
	outOK      outcome = iota // overall code OK (HTTP 200)
	outOver                   // overall code OVER_LIMIT (HTTP 429)
	outUnknown                // a response with overall code UNKNOWN, or another code
	outError                  // no response: transport error, gRPC error status, other HTTP status
)

// client sends pre-encoded requests. Each worker has a lane of its own
// (0 <= lane < concurrency) and never calls do concurrently on it.
type client interface {
	// do sends body and classifies the answer; on outError, kind names
	// the error in a few words and err holds it.
	do(ctx context.Context, lane int, body []byte) (o outcome, kind string, err error)
	close() error
}

// grpcClient calls ShouldRateLimit over conns, lane i on conns[i%len].
type grpcClient struct {
	conns []*grpc.ClientConn
	lanes []grpcLane
	opts  []grpc.CallOption
}

// grpcLane holds a worker's request and response, reused from call to call
// so that a call allocates nothing of the generator's own.
type grpcLane struct {
	req  rawRequest
	resp rawResponse
}

func newGRPCClient(target string, connections, lanes int) (*grpcClient, error) {
	c := &grpcClient{lanes: make([]grpcLane, lanes), opts: []grpc.CallOption{grpc.ForceCodec(rawCodec{})}}
	for range connections {
		// passthrough: the address as given, no resolver; no proxy from
		// the environment either.
		cc, err := grpc.NewClient("passthrough:///"+target,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithNoProxy())
		if err != nil {
			c.close()
			return nil, err
		}
		cc.Connect()
		c.conns = append(c.conns, cc)
	}
	return c, nil
}

func (c *grpcClient) do(ctx context.Context, lane int, body []byte) (outcome, string, error) {
	l := &c.lanes[lane]
	l.req.b = body
	l.resp.code = rlsv3.RateLimitResponse_UNKNOWN
	err := c.conns[lane%len(c.conns)].Invoke(ctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, &l.req, &l.resp, c.opts...)
	if err != nil {
		return outError, status.Code(err).String(), err
	}
	return codeOutcome(l.resp.code), "", nil
}

func (c *grpcClient) close() error {
	var errs []error
	for _, cc := range c.conns {
		errs = append(errs, cc.Close())
	}
	return errors.Join(errs...)
}

func codeOutcome(c rlsv3.RateLimitResponse_Code) outcome {
	switch c {
	case rlsv3.RateLimitResponse_OK:
		return outOK
	case rlsv3.RateLimitResponse_OVER_LIMIT:
		return outOver
	}
	return outUnknown
}

// rawRequest is a RateLimitRequest already in the wire format.
type rawRequest struct{ b []byte }

// rawResponse is the one field of a RateLimitResponse that the generator
// reads.
type rawResponse struct{ code rlsv3.RateLimitResponse_Code }

// rawCodec sends rawRequest bytes as they are and decodes only the overall
// code of the response: the bytes on the wire are those of the generated
// client, without its per-call encoding and decoding.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	r, ok := v.(*rawRequest)
	if !ok {
		return nil, fmt.Errorf("loadgen: cannot send %T", v)
	}
	return r.b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	r, ok := v.(*rawResponse)
	if !ok {
		return fmt.Errorf("loadgen: cannot decode into %T", v)
	}
	code, err := overallCode(data)
	r.code = code
	return err
}

// Name is "proto": the content-subtype the server expects.
func (rawCodec) Name() string { return "proto" }

// overallCode reads field 1 (overall_code) of an encoded RateLimitResponse,
// skipping the others; absent, it is UNKNOWN (0), as in proto3.
func overallCode(b []byte) (rlsv3.RateLimitResponse_Code, error) {
	code := rlsv3.RateLimitResponse_UNKNOWN
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return code, protowire.ParseError(n)
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return code, protowire.ParseError(n)
			}
			code = rlsv3.RateLimitResponse_Code(int32(v))
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return code, protowire.ParseError(n)
		}
		b = b[n:]
	}
	return code, nil
}

// httpClient sends the requests of newRequest over transports, lane i on
// clients[i%len]. A transport holds up to one idle connection per lane
// that uses it, so in the steady state every request in flight has a
// connection of its own. 200 is OK, 429 over the limit.
type httpClient struct {
	clients    []*http.Client
	newRequest func(ctx context.Context, body []byte) (*http.Request, error)
}

var jsonContentType = []string{"application/json"}

// newJSONClient posts each body to /json.
func newJSONClient(target string, connections, lanes int, timeout time.Duration) *httpClient {
	url := "http://" + target + "/json"
	return newHTTPClient(connections, lanes, timeout, func(ctx context.Context, body []byte) (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err == nil {
			req.Header["Content-Type"] = jsonContentType // read only, shared by all requests
		}
		return req, err
	})
}

// newGetClient gets path, with each body (a key's value) in header unless
// header is empty; or, with post set, posts post as JSON to path.
func newGetClient(target, path, header string, post []byte, connections, lanes int, timeout time.Duration) *httpClient {
	url := "http://" + target + path
	header = http.CanonicalHeaderKey(header)
	return newHTTPClient(connections, lanes, timeout, func(ctx context.Context, body []byte) (*http.Request, error) {
		var req *http.Request
		var err error
		if post != nil {
			req, err = http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(post))
			if err == nil {
				req.Header["Content-Type"] = jsonContentType
			}
		} else {
			req, err = http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		}
		if err == nil && header != "" {
			req.Header[header] = []string{string(body)}
		}
		return req, err
	})
}

func newHTTPClient(connections, lanes int, timeout time.Duration, newRequest func(context.Context, []byte) (*http.Request, error)) *httpClient {
	c := &httpClient{newRequest: newRequest}
	perTransport := (lanes + connections - 1) / connections
	for range connections {
		t := &http.Transport{
			Proxy:               nil, // the address as given, whatever the environment says
			DialContext:         (&net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        perTransport,
			MaxIdleConnsPerHost: perTransport,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		}
		c.clients = append(c.clients, &http.Client{Transport: t})
	}
	return c
}

func (c *httpClient) do(ctx context.Context, lane int, body []byte) (outcome, string, error) {
	req, err := c.newRequest(ctx, body)
	if err != nil {
		return outError, "request", err
	}
	resp, err := c.clients[lane%len(c.clients)].Do(req)
	if err != nil {
		return outError, netErrorKind(err), err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return outError, netErrorKind(err), err
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return outOK, "", nil
	case http.StatusTooManyRequests:
		return outOver, "", nil
	}
	kind := "http " + strconv.Itoa(resp.StatusCode)
	return outError, kind, errors.New(kind)
}

func (c *httpClient) close() error {
	for _, hc := range c.clients {
		hc.CloseIdleConnections()
	}
	return nil
}

// netErrorKind names a transport error in a few words.
func netErrorKind(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection reset"
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	return "transport"
}
