package loadgen

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
)

// HotValue is the descriptor value of the hot key; the others are "k0",
// "k1", … "k<keys-1>".
const HotValue = "hot"

// KeyValue returns the descriptor value of key i of n: i < n is an ordinary
// key, i == n the hot key.
func KeyValue(i, n int) string {
	if i == n {
		return HotValue
	}
	return "k" + strconv.Itoa(i)
}

// bodies holds one encoded request per key, back to back in one buffer so
// that a million keys cost the garbage collector nothing to scan. Body i is
// buf[off[i]:off[i+1]]; the last one is the hot key's.
type bodies struct {
	buf []byte
	off []uint32
}

func (b *bodies) body(i int) []byte {
	lo, hi := b.off[i], b.off[i+1]
	return b.buf[lo:hi:hi]
}

// Request returns the request that the generator sends for key i of n (see
// KeyValue).
func Request(domain, descriptorKey string, i, n int) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{
		Domain: domain,
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: descriptorKey, Value: KeyValue(i, n)}},
		}},
	}
}

// protoBodies encodes the request of every key, and of the hot key, in the
// protobuf wire format.
func protoBodies(domain, descriptorKey string, keys int) (*bodies, error) {
	req := Request(domain, descriptorKey, 0, keys)
	entry := req.Descriptors[0].Entries[0]
	b := &bodies{off: make([]uint32, 0, keys+2)}
	b.off = append(b.off, 0)
	var err error
	for i := 0; i <= keys; i++ {
		entry.Value = KeyValue(i, keys)
		if b.buf, err = (proto.MarshalOptions{}).MarshalAppend(b.buf, req); err != nil {
			return nil, err
		}
		if err := b.mark(); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// jsonBodies encodes the request of every key, and of the hot key, in
// protobuf JSON, as POST /json takes it.
func jsonBodies(domain, descriptorKey string, keys int) (*bodies, error) {
	d, err := json.Marshal(domain)
	if err != nil {
		return nil, err
	}
	k, err := json.Marshal(descriptorKey)
	if err != nil {
		return nil, err
	}
	prefix := fmt.Sprintf(`{"domain":%s,"descriptors":[{"entries":[{"key":%s,"value":"`, d, k)
	const suffix = `"}]}]}`
	b := &bodies{off: make([]uint32, 0, keys+2)}
	b.off = append(b.off, 0)
	for i := 0; i <= keys; i++ {
		b.buf = append(b.buf, prefix...)
		b.buf = append(b.buf, KeyValue(i, keys)...) // [a-z0-9]: nothing to escape
		b.buf = append(b.buf, suffix...)
		if err := b.mark(); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// mark ends the body being appended.
func (b *bodies) mark() error {
	if len(b.buf) > math.MaxUint32 {
		return fmt.Errorf("request bodies take more than 4 GiB: too many keys")
	}
	b.off = append(b.off, uint32(len(b.buf)))
	return nil
}

// valueBodies holds the value of every key, and of the hot key, as HTTP
// mode sends them in its header.
func valueBodies(keys int) (*bodies, error) {
	b := &bodies{off: make([]uint32, 0, keys+2)}
	b.off = append(b.off, 0)
	for i := 0; i <= keys; i++ {
		b.buf = append(b.buf, KeyValue(i, keys)...)
		if err := b.mark(); err != nil {
			return nil, err
		}
	}
	return b, nil
}
