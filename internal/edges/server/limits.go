package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	protov2 "google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/edges/grpcraw"
	"github.com/sluicehq/sluice/internal/vocab/bounds"
)

// MaxRequestBytes bounds an encoded rate limit request on either transport:
// a gRPC message (larger ones get ResourceExhausted from gRPC itself) and
// the body of POST /json (larger ones get 413). Within it, the counts of
// bounds.MaxDescriptors, bounds.MaxEntries and bounds.MaxTotalEntries are checked
// on the wire, before the request is decoded into memory, so that an
// oversized request costs a scan of its bytes and no more.
const MaxRequestBytes = 1 << 20

// MaxJSONBody bounds the body of a POST /json request, in bytes; a larger
// one is answered 413.
const MaxJSONBody = MaxRequestBytes

// errMalformed is the error of a request whose encoding is broken.
var errMalformed = fmt.Errorf("%w: malformed RateLimitRequest", sluice.ErrInvalid)

// GRPCServerOptions returns the options a gRPC server needs to serve the
// rate limit service of RegisterGRPC: the bound on a request's size and
// the codec that hands the service a request's bytes undecoded
// (internal/edges/grpcraw), so that it checks their counts before decoding them
// and answers a malformed request InvalidArgument (gRPC's own decoding
// would answer Internal). The Rate Limit Quota Service (package rlqs)
// needs the same codec. Messages of every other service are decoded as
// usual. It also keeps goroutines to run the streams' handlers
// (streamWorkers).
func GRPCServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxRequestBytes), grpcraw.ServerOption(), grpc.NumStreamWorkers(streamWorkers())}
}

// streamWorkers is how many goroutines a gRPC server of GRPCServerOptions
// keeps to run its streams' handlers, each a stream after another: 16 a
// core. A handler on a goroutine of its own (gRPC's default) starts on a
// small stack and grows it, copying every frame, once its calls go deeper
// than the stack it was given: on the Redis store's path (a request parks
// in the store's batcher some 7 KB deep) that copy was about a sixth of
// the server's CPU. A worker keeps the stack it grew, but only while it
// is busy: gRPC hands streams to its workers in turn, and the collector
// shrinks the stack of one that waits, so more workers than the requests
// in flight grow stacks again (256 on this 2-core machine cost more CPU a
// request than 32, on memstore and on Redis alike). A stream that finds
// every worker busy runs on a goroutine of its own, as without them. The
// requests in flight grow with a node's throughput, hence with its cores.
// A long-lived stream (RLQS) holds its worker while it lasts.
func streamWorkers() uint32 { return uint32(16 * runtime.GOMAXPROCS(0)) }

// rlsServiceDesc is Envoy's RateLimitService with its one method decoded
// by shouldRateLimit rather than by gRPC.
var rlsServiceDesc = func() grpc.ServiceDesc {
	d := rlsv3.RateLimitService_ServiceDesc
	d.Methods = []grpc.MethodDesc{{MethodName: "ShouldRateLimit", Handler: shouldRateLimit}}
	return d
}()

// shouldRateLimit is the gRPC handler of ShouldRateLimit: it checks the
// request's bytes and decodes them itself, so that an oversized or
// malformed request is InvalidArgument, counted, and costs no decoding.
func shouldRateLimit(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	s := srv.(*Server)
	var raw grpcraw.Message
	if err := dec(&raw); err != nil {
		return nil, err
	}
	req := new(rlsv3.RateLimitRequest)
	if err := decodeRequest(raw.Bytes, req); err != nil {
		return nil, s.fail(err, viaGRPC).grpcErr()
	}
	if interceptor == nil {
		return s.ShouldRateLimit(ctx, req)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: rlsv3.RateLimitService_ShouldRateLimit_FullMethodName}
	return interceptor(ctx, req, info, func(ctx context.Context, req any) (any, error) {
		return s.ShouldRateLimit(ctx, req.(*rlsv3.RateLimitRequest))
	})
}

// Field numbers of the two repeated fields the wire scan counts.
var (
	descriptorsField = (&rlsv3.RateLimitRequest{}).ProtoReflect().Descriptor().Fields().ByName("descriptors").Number()
	entriesField     = (&rlsv3.RateLimitRequest{}).ProtoReflect().Descriptor().Fields().ByName("descriptors").Message().Fields().ByName("entries").Number()
)

// decodeRequest decodes a RateLimitRequest in protobuf after checking its
// counts on the wire. (Its size gRPC has bounded: MaxRecvMsgSize.)
func decodeRequest(b []byte, req *rlsv3.RateLimitRequest) error {
	if err := scanProto(b); err != nil {
		return err
	}
	if err := protov2.Unmarshal(b, req); err != nil {
		return fmt.Errorf("%w: %v", errMalformed, err)
	}
	return nil
}

// scanProto counts the descriptors of an encoded RateLimitRequest and the
// entries of each, without decoding anything, and checks them against the
// bounds of bounds.CheckCounts.
func scanProto(b []byte) error {
	descriptors, most, total := 0, 0, 0
	for len(b) > 0 {
		num, typ, val, rest, err := nextField(b)
		if err != nil {
			return err
		}
		b = rest
		if num != descriptorsField || typ != protowire.BytesType {
			continue
		}
		descriptors++
		entries := 0
		for len(val) > 0 {
			num, _, _, rest, err := nextField(val)
			if err != nil {
				return err
			}
			val = rest
			if num == entriesField {
				entries++
			}
		}
		total += entries
		most = max(most, entries)
		if err := bounds.CheckCounts(descriptors, most, total); err != nil {
			return err
		}
	}
	return nil
}

// nextField splits the first field off the encoded message b: its number
// and wire type, its value's bytes when it is length-delimited, and the
// rest of b.
func nextField(b []byte) (num protowire.Number, typ protowire.Type, val, rest []byte, err error) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 {
		return 0, 0, nil, nil, fmt.Errorf("%w: %v", errMalformed, protowire.ParseError(n))
	}
	b = b[n:]
	if typ == protowire.BytesType {
		val, n = protowire.ConsumeBytes(b)
	} else {
		n = protowire.ConsumeFieldValue(num, typ, b)
	}
	if n < 0 {
		return 0, 0, nil, nil, fmt.Errorf("%w: %v", errMalformed, protowire.ParseError(n))
	}
	return num, typ, val, b[n:], nil
}

// maxJSONDepth bounds the nesting of a /json body: a RateLimitRequest
// nests five deep; protojson refuses unknown fields anyway.
const maxJSONDepth = 32

// errJSONSyntax stops the JSON scan: the body is not JSON, which protojson
// then says precisely.
var errJSONSyntax = errors.New("json syntax")

// scanJSON counts the descriptors of a RateLimitRequest in protobuf JSON
// and the entries of each, without decoding anything, and checks them
// against the bounds of bounds.CheckCounts. A body that is not JSON passes:
// protojson, which decodes it next, names its fault.
func scanJSON(b []byte) error {
	s := jsonScan{b: b}
	err := s.value(roleTop, 0)
	if errors.Is(err, errJSONSyntax) {
		return nil
	}
	return err
}

// Where a JSON value is in a RateLimitRequest, for the counts.
const (
	roleOther       = iota
	roleTop         // the request
	roleDescriptors // the request's descriptors array
	roleDescriptor  // one descriptor
	roleEntries     // a descriptor's entries array
)

type jsonScan struct {
	b                        []byte
	i                        int
	descriptors, most, total int
}

func (s *jsonScan) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\r', '\n':
			s.i++
		default:
			return
		}
	}
}

func (s *jsonScan) value(role, depth int) error {
	if depth > maxJSONDepth {
		return fmt.Errorf("%w: %w: JSON nested more than %d deep", sluice.ErrInvalid, bounds.ErrTooLarge, maxJSONDepth)
	}
	s.space()
	if s.i >= len(s.b) {
		return errJSONSyntax
	}
	switch s.b[s.i] {
	case '{':
		return s.object(role, depth+1)
	case '[':
		return s.array(role, depth+1)
	case '"':
		_, err := s.str()
		return err
	}
	for s.i < len(s.b) { // a number, true, false or null
		switch s.b[s.i] {
		case ',', ']', '}', ' ', '\t', '\r', '\n':
			return nil
		}
		s.i++
	}
	return nil
}

// str skips a string and reports whether it is the key name of a
// descriptors or entries field (protojson decodes escapes in keys too).
func (s *jsonScan) str() (string, error) {
	start := s.i
	s.i++
	escaped := false
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case '\\':
			escaped = true
			s.i += 2
			continue
		case '"':
			s.i++
			raw := s.b[start:s.i]
			if !escaped {
				return keyName(raw), nil
			}
			var k string
			if err := json.Unmarshal(raw, &k); err != nil {
				return "", errJSONSyntax
			}
			return keyName([]byte(k)), nil
		}
		s.i++
	}
	return "", errJSONSyntax
}

// keyName returns "descriptors" or "entries" when raw (quoted or not) is
// one of them, else "".
func keyName(raw []byte) string {
	if len(raw) >= 2 && raw[0] == '"' {
		raw = raw[1 : len(raw)-1]
	}
	switch string(raw) {
	case "descriptors":
		return "descriptors"
	case "entries":
		return "entries"
	}
	return ""
}

// next steps over the comma after a member or element, or over the close
// of its object or array, which it reports as done.
func (s *jsonScan) next(close byte) (done bool, err error) {
	s.space()
	if s.i >= len(s.b) {
		return false, errJSONSyntax
	}
	switch s.b[s.i] {
	case ',':
		s.i++
		return false, nil
	case close:
		s.i++
		return true, nil
	}
	return false, errJSONSyntax
}

func (s *jsonScan) object(role, depth int) error {
	s.i++ // {
	s.space()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return nil
	}
	for {
		s.space()
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return errJSONSyntax
		}
		key, err := s.str()
		if err != nil {
			return err
		}
		s.space()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return errJSONSyntax
		}
		s.i++
		child := roleOther
		switch {
		case role == roleTop && key == "descriptors":
			child = roleDescriptors
		case role == roleDescriptor && key == "entries":
			child = roleEntries
		}
		if err := s.value(child, depth); err != nil {
			return err
		}
		if done, err := s.next('}'); done || err != nil {
			return err
		}
	}
}

func (s *jsonScan) array(role, depth int) error {
	s.i++ // [
	s.space()
	if s.i < len(s.b) && s.b[s.i] == ']' {
		s.i++
		return nil
	}
	entries := 0
	for {
		elem := roleOther
		switch role {
		case roleDescriptors:
			s.descriptors++
			elem = roleDescriptor
		case roleEntries:
			entries++
			s.total++
			s.most = max(s.most, entries)
		}
		if err := bounds.CheckCounts(s.descriptors, s.most, s.total); err != nil {
			return err
		}
		if err := s.value(elem, depth); err != nil {
			return err
		}
		if done, err := s.next(']'); done || err != nil {
			return err
		}
	}
}
