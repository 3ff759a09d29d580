// Package grpcraw is the gRPC codec of sluice's gRPC listener: gRPC's own
// protobuf codec, except that a *Message receives a message's bytes as
// they came, and is sent as its bytes. A service that receives into a
// Message decodes (and checks) the bytes itself, so that it answers a
// malformed message InvalidArgument, where gRPC's decoding would end the
// call with Internal; a client (a test) sends with it what no encoder
// would. Every other message is coded as usual.
//
// This package imports gRPC and nothing of sluice.
package grpcraw

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// Message is what the codec decodes a message into: its bytes, undecoded.
type Message struct{ Bytes []byte }

// ServerOption makes a gRPC server decode with the codec: the server of a
// service that receives into a Message must have it.
func ServerOption() grpc.ServerOption { return grpc.ForceServerCodecV2(Codec()) }

// Codec returns the codec, for a client: grpc.ForceCodecV2(Codec()).
func Codec() encoding.CodecV2 { return codec{proto: encoding.GetCodecV2(proto.Name)} }

// codec is gRPC's protobuf codec, except for a *Message.
type codec struct{ proto encoding.CodecV2 }

func (c codec) Name() string { return proto.Name }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(*Message); ok {
		return mem.BufferSlice{mem.SliceBuffer(m.Bytes)}, nil
	}
	return c.proto.Marshal(v)
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	if m, ok := v.(*Message); ok {
		m.Bytes = data.Materialize()
		return nil
	}
	return c.proto.Unmarshal(data, v)
}
