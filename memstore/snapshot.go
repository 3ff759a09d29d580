package memstore

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"

	"github.com/sluicehq/sluice/internal/base/algo"
)

// The snapshot format, version 2. All integers are little-endian.
//
//	header    magic "SLUICEMS", version u32 = 2, flags u32 = 0,
//	          seed u64, written-at i64 (Unix ns)
//	records   each a tag byte and its body, in any order:
//	  0x01 sketch   name-len u32, name, rate i64, period i64, capacity i64,
//	                width u32, depth u32, idle-at i64, blob-len u32,
//	                blob (algo sketch MarshalBinary)
//	  0x02 entries  count u32, count × {key u64, A i64, B i64}
//	                (one-state keys and block_for penalties)
//	  0x03 log      key u64, idle-at i64, count u32, count × {at i64, n i64}
//	  0x04 words    count u32, count × {key u64, word u64}
//	                (the word table's keys, words.go; since version 2)
//	trailer   tag 0xFF, CRC-32C (Castagnoli) u32 of every byte before it
//
// The writer puts sketches first so that a reader knows their memory before
// it fills the tables under Config.MaxBytes. Version 1 (no word table) is
// read too: its entries of word-table limits move to the word table when
// their key is next decided.
const (
	snapMagic   = "SLUICEMS"
	snapVersion = 2
	headerLen   = 8 + 4 + 4 + 8 + 8
	trailerLen  = 1 + 4

	tagSketch  = 0x01
	tagEntries = 0x02
	tagLog     = 0x03
	tagWords   = 0x04
	tagEnd     = 0xff

	// maxNameLen bounds the limit name of a sketch record.
	maxNameLen = 1 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrSnapshot wraps every error about the content of a snapshot (as
// opposed to an I/O error reading it).
var ErrSnapshot = errors.New("memstore: bad snapshot")

// WriteFile saves a snapshot of the store to path atomically: it writes a
// temporary file in the same directory, syncs it, and renames it over path,
// so that path holds either the previous snapshot or the new one.
func (s *Store) WriteFile(path string) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("memstore: snapshot: %w", err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
			err = fmt.Errorf("memstore: snapshot to %s: %w", path, err)
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<16)
	if err := s.Snapshot(bw); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	// Make the rename durable; not every system can sync a directory.
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// crcWriter passes writes through and hashes them.
type crcWriter struct {
	w   io.Writer
	crc hash.Hash32
}

func (c *crcWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.crc.Write(p[:n])
	return n, err
}

// Snapshot writes every live state of the store to w in the format above.
// Each shard is copied under its lock and written after, so a snapshot of a
// busy store is consistent per key, and the store is never stalled on w:
// a decision waits at most for one shard's memory copy.
func (s *Store) Snapshot(w io.Writer) error {
	cw := &crcWriter{w: w, crc: crc32.New(castagnoli)}
	bw := bufio.NewWriterSize(cw, 1<<16)
	var b []byte
	now := s.now()

	b = append(b, snapMagic...)
	b = binary.LittleEndian.AppendUint32(b, snapVersion)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, s.seed.Load())
	b = binary.LittleEndian.AppendUint64(b, uint64(now))
	if _, err := bw.Write(b); err != nil {
		return err
	}

	if err := s.snapshotSketches(bw); err != nil {
		return err
	}

	var c shardCopy
	for i := range s.shards {
		c.fill(&s.shards[i], now)
		var err error
		if b, err = c.write(bw, b, now); err != nil {
			return err
		}
	}

	if err := bw.WriteByte(tagEnd); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	_, err := w.Write(binary.LittleEndian.AppendUint32(nil, cw.crc.Sum32()))
	return err
}

// shardCopy is what Snapshot copies of a shard under its lock, to write
// after it unlocks. Its buffers are reused from shard to shard.
type shardCopy struct {
	slots []entry     // the two-word table, whole
	words []wrec      // the word table's live keys
	logs  []logRecord // the live sliding logs, their entries in flat
	flat  []algo.LogEntry
}

// logRecord is a sliding log in a shardCopy: its key, when it goes idle,
// and where its entries are in flat.
type logRecord struct {
	key      uint64
	idle     int64
	from, to int
}

// fill copies sh into c, under sh's lock: its two-word table whole, and
// the words and sliding logs live at now.
func (c *shardCopy) fill(sh *shard, now int64) {
	c.logs, c.flat = c.logs[:0], c.flat[:0]
	sh.mu.Lock()
	// The shard's table is copied whole, with one copy into a buffer
	// made outside the lock, so that the lock is held for a memory
	// copy only (tens of microseconds a shard at 1M keys), and the
	// live entries are picked out of the copy after.
	for cap(c.slots) < len(sh.t.slots) {
		n := len(sh.t.slots)
		sh.mu.Unlock()
		c.slots = make([]entry, n+n/4)
		sh.mu.Lock()
	}
	c.slots = c.slots[:len(sh.t.slots)]
	copy(c.slots, sh.t.slots)
	c.words = c.words[:0]
	if t := sh.wordsOf(); t != nil {
		// Words can change without the mutex: each is read once,
		// atomically; a claimed one (wBusy) cannot be seen here, since
		// claims are released before the mutex is.
		for i := range t.slots {
			e := &t.slots[i]
			if k := e.key.Load(); k != 0 {
				if w := e.word.Load(); w < wBusy && wordIdleAt(w) > now {
					c.words = append(c.words, wrec{k, w})
				}
			}
		}
	}
	for k, ll := range sh.logs {
		if ll.idle > now {
			c.logs = append(c.logs, logRecord{key: k, idle: ll.idle, from: len(c.flat), to: len(c.flat) + len(ll.l.Entries)})
			c.flat = append(c.flat, ll.l.Entries...)
		}
	}
	sh.mu.Unlock()
}

// write writes the records of c to bw: the entries of its table live at
// now, its words and its logs. b is the buffer to reuse; it is returned
// for the next use.
func (c *shardCopy) write(bw *bufio.Writer, b []byte, now int64) ([]byte, error) {
	entries := c.slots[:0] // filtered in place
	for _, e := range c.slots {
		if e.key != 0 && e.st.A > now {
			entries = append(entries, e)
		}
	}
	var err error
	if b, err = writeChunks(bw, b, tagEntries, entries, func(b []byte, e entry) []byte {
		b = binary.LittleEndian.AppendUint64(b, e.key)
		b = binary.LittleEndian.AppendUint64(b, uint64(e.st.A))
		return binary.LittleEndian.AppendUint64(b, uint64(e.st.B))
	}); err != nil {
		return b, err
	}
	if b, err = writeChunks(bw, b, tagWords, c.words, func(b []byte, r wrec) []byte {
		b = binary.LittleEndian.AppendUint64(b, r.k)
		return binary.LittleEndian.AppendUint64(b, r.w)
	}); err != nil {
		return b, err
	}
	for _, l := range c.logs {
		b = append(b[:0], tagLog)
		b = binary.LittleEndian.AppendUint64(b, l.key)
		b = binary.LittleEndian.AppendUint64(b, uint64(l.idle))
		b = binary.LittleEndian.AppendUint32(b, uint32(l.to-l.from))
		for _, e := range c.flat[l.from:l.to] {
			b = binary.LittleEndian.AppendUint64(b, uint64(e.At))
			b = binary.LittleEndian.AppendUint64(b, uint64(e.N))
		}
		if _, err := bw.Write(b); err != nil {
			return b, err
		}
	}
	return b, nil
}

// writeChunks writes recs as records of tag, at most sweepChunk each:
// the tag, a count u32, and each record as put appends it. b is the
// buffer to reuse; it is returned for the next use.
func writeChunks[T any](bw *bufio.Writer, b []byte, tag byte, recs []T, put func([]byte, T) []byte) ([]byte, error) {
	for len(recs) > 0 {
		chunk := recs[:min(len(recs), sweepChunk)]
		recs = recs[len(chunk):]
		b = append(b[:0], tag)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(chunk)))
		for _, r := range chunk {
			b = put(b, r)
		}
		if _, err := bw.Write(b); err != nil {
			return b, err
		}
	}
	return b, nil
}

func (s *Store) snapshotSketches(bw *bufio.Writer) error {
	s.sketches.mu.RLock()
	slots := make([]*sketchSlot, 0, len(s.sketches.m))
	for _, sk := range s.sketches.m {
		slots = append(slots, sk)
	}
	s.sketches.mu.RUnlock()
	for _, sk := range slots {
		sk.mu.Lock()
		dead, idle := sk.dead, sk.idle
		blob, err := sk.s.MarshalBinary()
		sk.mu.Unlock()
		if err != nil {
			return fmt.Errorf("memstore: snapshot of sketch %q: %w", sk.id.name, err)
		}
		if dead {
			continue
		}
		id := &sk.id
		b := []byte{tagSketch}
		b = binary.LittleEndian.AppendUint32(b, uint32(len(id.name)))
		b = append(b, id.name...)
		b = binary.LittleEndian.AppendUint64(b, uint64(id.rate))
		b = binary.LittleEndian.AppendUint64(b, uint64(id.period))
		b = binary.LittleEndian.AppendUint64(b, uint64(id.capacity))
		b = binary.LittleEndian.AppendUint32(b, uint32(id.width))
		b = binary.LittleEndian.AppendUint32(b, uint32(id.depth))
		b = binary.LittleEndian.AppendUint64(b, uint64(idle))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(blob)))
		b = append(b, blob...)
		if _, err := bw.Write(b); err != nil {
			return err
		}
	}
	return nil
}
