package redisstore

import (
	"encoding/binary"
	"encoding/hex"

	"github.com/zeebo/xxh3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
	"github.com/sluicehq/sluice/internal/vocab/limits"
)

// HashTag maps a hit's key to the part of it that chooses its Redis Cluster
// slot: keys with equal tags share a slot, so the hits of one request on
// them are decided in one script call, atomically. See wholeKey and
// rules.HashTag.
type HashTag func(key string) string

// wholeKey is the default HashTag: every key is its own tag, which spreads
// keys evenly over the cluster; a request with several hits may then need
// one call per slot.
func wholeKey(key string) string { return key }

// Redis keys are compact and of one size: the prefix, the hash tag as 16 hex
// digits of its xxh3 hash in braces, and 32 hex digits of the 128-bit xxh3
// hash of the limit's parameters and the key, then a suffix:
//
//	<prefix>{<tag>}<id>      the state (a string), a sliding log (a list), or
//	                         a Concurrency limit's permits (a sorted set)
//	<prefix>{<tag>}<id>:b    the end of a block_for penalty
//	<prefix>{<sk>}m          a sketch's latest window start; {<sk>}0 and
//	                         {<sk>}1 its two windows' counters
//
// where <sk> is the hash of the sketch's identity (the limit's name, rate,
// period, capacity, width and depth), the slot of all its keys.

// logFormat is the version of the sliding log's list format (take.lua):
// 2, a header then the entries.
const logFormat = "log2"

// keyer builds the Redis keys of hits.
type keyer struct {
	prefix string
	tag    HashTag
	// buf is where a key is built before it is copied into its string:
	// best an array on the caller's stack. It is never written back (a
	// key too long for it is built in a new array), which is what lets
	// the array stay on the stack.
	buf []byte
}

// paramBytes appends the parameters that make a key's state distinct.
func paramBytes(b []byte, p *algo.Params) []byte {
	rate, capacity := p.IdentityCounts()
	b = append(b, byte(p.Kind))
	b = binary.LittleEndian.AppendUint64(b, uint64(rate))
	b = binary.LittleEndian.AppendUint64(b, uint64(p.IdentityPeriod()))
	b = binary.LittleEndian.AppendUint64(b, uint64(capacity))
	return binary.LittleEndian.AppendUint64(b, uint64(p.Interval))
}

// appendTag appends "<prefix>{<16 hex>}" for the tag string t.
func (k *keyer) appendTag(b []byte, t string) []byte {
	b = append(b, k.prefix...)
	b = append(b, '{')
	var h [8]byte
	binary.BigEndian.PutUint64(h[:], xxh3.HashString(t))
	b = hex.AppendEncode(b, h[:])
	return append(b, '}')
}

// stateKey returns the key of the state of h with parameters p.
func (k *keyer) stateKey(h *sluice.Hit, p *algo.Params) string {
	b := k.appendTag(k.buf[:0], k.tag(h.Key))
	b = k.appendID(b, h.Key, p)
	return string(b)
}

// appendID appends the 32 hex digits identifying key under parameters p.
// A sliding log's identity has a format version: a list in the format of
// an older version (entries without a header) is another key, never read
// as this one's.
func (k *keyer) appendID(b []byte, key string, p *algo.Params) []byte {
	var buf [128]byte // most keys fit: no allocation
	id := paramBytes(buf[:0], p)
	if p.Kind == algo.SlidingLog {
		id = append(id, logFormat...)
	}
	id = append(id, key...)
	sum := xxh3.Hash128(id).Bytes()
	return hex.AppendEncode(b, sum[:])
}

// sketchKeys returns the meta key and the two window keys of the sketch of
// limit l with parameters p, and the block key of h in the sketch's slot.
func (k *keyer) sketchKeys(h *sluice.Hit, p *algo.Params) (meta, k0, k1, block string) {
	w, d := limits.SketchDims(h.Limit)
	id := paramBytes(make([]byte, 0, 64+len(h.Limit.Name)), p)
	id = binary.LittleEndian.AppendUint32(id, uint32(w))
	id = binary.LittleEndian.AppendUint32(id, uint32(d))
	id = append(id, h.Limit.Name...)
	b := k.appendTag(k.buf[:0], string(id))
	base := len(b)
	meta = string(append(b, 'm'))
	k0 = string(append(b[:base], '0'))
	k1 = string(append(b[:base], '1'))
	if h.Limit.BlockFor > 0 {
		b = k.appendID(b[:base], h.Key, p)
		block = string(append(b, ":b"...))
	}
	return meta, k0, k1, block
}

// slotOf returns the Redis Cluster slot of a key built by keyer: CRC16 of
// the text between its first '{' and the next '}'.
func slotOf(key string) uint16 {
	for i := 0; i < len(key); i++ {
		if key[i] != '{' {
			continue
		}
		for j := i + 1; j < len(key); j++ {
			if key[j] == '}' {
				if j > i+1 {
					return crc16(key[i+1:j]) % 16384
				}
				break
			}
		}
		break
	}
	return crc16(key) % 16384
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial 0), the hash of Redis
// Cluster's key slots.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^s[i]]
	}
	return crc
}

// crc16Table holds the CRC of every byte value, for crc16 to take a byte at
// a time.
var crc16Table = func() (t [256]uint16) {
	for b := range t {
		crc := uint16(b) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[b] = crc
	}
	return t
}()

// sketchHash is the 64-bit hash that places key in the counters of a sketch
// with parameters p. It is unseeded: every node must place a key alike.
func sketchHash(key string, p *algo.Params) uint64 {
	var buf [128]byte // most keys fit: no allocation
	id := paramBytes(buf[:0], p)
	return xxh3.Hash(append(id, key...))
}
