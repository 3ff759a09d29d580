package memstore_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"runtime"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/storetest"
)

// sealed is a snapshot of version 2 (the format of snapshot.go) around
// records, with a correct checksum: what whoever can write the state
// file can make. A checksum is no signature, so every record of such a
// file is read as hostile.
func sealed(records ...[]byte) []byte {
	b := []byte("SLUICEMS")
	b = binary.LittleEndian.AppendUint32(b, 2)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, 0x5eed)
	b = binary.LittleEndian.AppendUint64(b, uint64(storetest.Start.UnixNano()))
	for _, r := range records {
		b = append(b, r...)
	}
	b = append(b, 0xff)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
}

// le appends the little-endian encodings of vs (uint32 or uint64).
func le(b []byte, vs ...any) []byte {
	for _, v := range vs {
		switch v := v.(type) {
		case uint32:
			b = binary.LittleEndian.AppendUint32(b, v)
		case uint64:
			b = binary.LittleEndian.AppendUint64(b, v)
		default:
			panic(fmt.Sprintf("le: %T", v))
		}
	}
	return b
}

// allocated returns the bytes f allocates.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestRestoreHostile restores snapshots crafted with a correct checksum
// whose records lie: counts far past the bytes that follow, a sketch of
// more cells than any limit may have, a name of 4 GB, a sketch whose
// record claims the largest dimensions and holds a few bytes, zero keys
// and busy markers. Each is refused (ErrSnapshot), leaves the store as it
// was, and costs memory in proportion to the file, not to what it
// claims: a restore must not be a way to make the process allocate
// gigabytes from a file of a few hundred bytes.
func TestRestoreHostile(t *testing.T) {
	clock := storetest.NewClock(storetest.Start)
	later := uint64(storetest.Start.Add(time.Hour).UnixNano())
	maxCells := uint32(1 << 12) // width × depth == algo.MaxSketchCells
	sketch := func(name string, width, depth uint32, blob []byte) []byte {
		b := le([]byte{0x01}, uint32(len(name)))
		b = append(b, name...)
		b = le(b, uint64(10), uint64(time.Second), uint64(10), width, depth, later, uint32(len(blob)))
		return append(b, blob...)
	}
	fakeBlob := le([]byte("sluice-cms-1\n"), uint32(2), uint32(2), uint64(0), uint64(0)) // a sketch's header, no cells
	for _, c := range []struct {
		name string
		file []byte
	}{
		{"4 billion entries in 24 bytes", sealed(le([]byte{0x02}, uint32(0xffffffff), uint64(7), later, later))},
		{"4 billion words in 16 bytes", sealed(le([]byte{0x04}, uint32(0xffffffff), uint64(7), uint64(1)))},
		{"a log of 2 billion entries in 16 bytes", sealed(le([]byte{0x03}, uint64(7), later, uint32(0x7fffffff), later, uint64(1)))},
		{"a sketch name of 4 GB", sealed(le([]byte{0x01}, uint32(0xffffffff)))},
		{"a sketch of more cells than any limit", sealed(sketch("s", 1<<16, 1<<16, fakeBlob))},
		{"the largest sketch in a header", sealed(sketch("s", maxCells, maxCells, fakeBlob))},
		{"a sketch holding other dimensions than its record's", sealed(sketch("s", 64, 64, append(bytes.Clone(fakeBlob), make([]byte, 8*2*2)...)))},
		{"an entry of key 0", sealed(le([]byte{0x02}, uint32(1), uint64(0), later, later))},
		{"a word of a busy marker", sealed(le([]byte{0x04}, uint32(1), uint64(7), ^uint64(0)))},
		{"an unknown record", sealed([]byte{0x7f, 1, 2, 3})},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := memstore.New(memstore.Config{Now: clock.Now, SweepInterval: -1, Shards: 2})
			keep := &sluice.Limit{Rate: 10, Period: time.Hour}
			lim := sluice.NewLimiter(s)
			lim.AllowN(ctx, "keep", keep, 3)
			var err error
			n := allocated(func() { err = s.Restore(bytes.NewReader(c.file)) })
			if !errors.Is(err, memstore.ErrSnapshot) {
				t.Errorf("restored: %v, want ErrSnapshot", err)
			}
			if most := uint64(1<<20 + 64*len(c.file)); n > most {
				t.Errorf("a restore of a %d-byte file allocated %d bytes, more than %d", len(c.file), n, most)
			}
			if d, _ := lim.AllowN(ctx, "keep", keep, 0); d.Remaining != 7 || s.Stats().Keys != 1 {
				t.Errorf("the store changed: remaining %d, %d keys", d.Remaining, s.Stats().Keys)
			}
		})
	}
	if algo.MaxSketchCells != int(maxCells)*int(maxCells) {
		t.Fatalf("the largest sketch above is %d cells, algo.MaxSketchCells %d", maxCells*maxCells, algo.MaxSketchCells)
	}
}

// TestRestoreOverCap: a snapshot of far more keys than the store's
// memory cap admits (written by a store without a cap, or crafted) is
// restored within the cap, the keys due to expire soonest evicted.
func TestRestoreOverCap(t *testing.T) {
	clock := storetest.NewClock(storetest.Start)
	big := memstore.New(memstore.Config{Now: clock.Now, SweepInterval: -1})
	lim := sluice.NewLimiter(big)
	l := &sluice.Limit{Rate: 10, Period: time.Hour}
	for i := range 10_000 {
		if _, err := lim.Allow(ctx, fmt.Sprint("k", i), l); err != nil {
			t.Fatal(err)
		}
	}
	snap := snapshotOf(t, big)
	const capBytes = 64 << 10
	small := memstore.New(memstore.Config{Now: clock.Now, SweepInterval: -1, MaxBytes: capBytes, Shards: 4})
	if err := small.Restore(bytes.NewReader(snap)); err != nil {
		t.Fatal(err)
	}
	if b, n := small.Stats().Bytes, small.Stats().Keys; b > capBytes || n == 0 || n >= 10_000 {
		t.Errorf("restored %d keys in %d bytes under a cap of %d, want some keys within the cap", n, b, capBytes)
	}
	t.Logf("%d of 10,000 keys restored in %d bytes (cap %d)", small.Stats().Keys, small.Stats().Bytes, capBytes)
}
