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

	"github.com/sluicehq/sluice/internal/algo"
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

// LoadFile restores the snapshot at path (see Restore). A missing file is
// an error satisfying errors.Is(err, fs.ErrNotExist), which a caller
// starting for the first time may ignore.
func (s *Store) LoadFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("memstore: restore: %w", err)
	}
	defer f.Close()
	if err := s.Restore(bufio.NewReaderSize(f, 1<<16)); err != nil {
		return fmt.Errorf("%w (file %s)", err, path)
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

	var slots, entries []entry
	var words []wrec
	var logs []logRecord
	var flat []algo.LogEntry
	for i := range s.shards {
		sh := &s.shards[i]
		logs, flat = logs[:0], flat[:0]
		sh.mu.Lock()
		// The shard's table is copied whole, with one copy into a buffer
		// made outside the lock, so that the lock is held for a memory
		// copy only (tens of microseconds a shard at 1M keys), and the
		// live entries are picked out of the copy after.
		for cap(slots) < len(sh.t.slots) {
			n := len(sh.t.slots)
			sh.mu.Unlock()
			slots = make([]entry, n+n/4)
			sh.mu.Lock()
		}
		slots = slots[:len(sh.t.slots)]
		copy(slots, sh.t.slots)
		words = words[:0]
		if t := sh.wordsOf(); t != nil {
			// Words can change without the mutex: each is read once,
			// atomically; a claimed one (wBusy) cannot be seen here, since
			// claims are released before the mutex is.
			for i := range t.slots {
				e := &t.slots[i]
				if k := e.key.Load(); k != 0 {
					if w := e.word.Load(); w < wBusy && wordIdleAt(w) > now {
						words = append(words, wrec{k, w})
					}
				}
			}
		}
		for k, ll := range sh.logs {
			if ll.idle > now {
				logs = append(logs, logRecord{key: k, idle: ll.idle, from: len(flat), to: len(flat) + len(ll.l.Entries)})
				flat = append(flat, ll.l.Entries...)
			}
		}
		sh.mu.Unlock()

		entries = slots[:0] // filtered in place
		for _, e := range slots {
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
			return err
		}
		if b, err = writeChunks(bw, b, tagWords, words, func(b []byte, r wrec) []byte {
			b = binary.LittleEndian.AppendUint64(b, r.k)
			return binary.LittleEndian.AppendUint64(b, r.w)
		}); err != nil {
			return err
		}
		for _, l := range logs {
			b = append(b[:0], tagLog)
			b = binary.LittleEndian.AppendUint64(b, l.key)
			b = binary.LittleEndian.AppendUint64(b, uint64(l.idle))
			b = binary.LittleEndian.AppendUint32(b, uint32(l.to-l.from))
			for _, e := range flat[l.from:l.to] {
				b = binary.LittleEndian.AppendUint64(b, uint64(e.At))
				b = binary.LittleEndian.AppendUint64(b, uint64(e.N))
			}
			if _, err := bw.Write(b); err != nil {
				return err
			}
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

type logRecord struct {
	key      uint64
	idle     int64
	from, to int
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

// decoder reads little-endian integers from a verified snapshot. Reading
// past the end sets ok to false and returns zeros.
type decoder struct {
	b  []byte
	ok bool
}

func (d *decoder) take(n int) []byte {
	if !d.ok || n < 0 || n > len(d.b) {
		d.ok = false
		return nil
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}

func (d *decoder) u8() uint8 {
	if p := d.take(1); p != nil {
		return p[0]
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if p := d.take(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if p := d.take(8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

func (d *decoder) i64() int64 { return int64(d.u64()) }

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrSnapshot, fmt.Sprintf(format, args...))
}

// Restore replaces the whole content of the store, its seed included, with
// the snapshot read from r, dropping whatever has expired since it was
// written. It reads and verifies the whole snapshot first: if r fails, or
// the snapshot is truncated, corrupted, or of an unknown version, Restore
// returns an error (wrapping ErrSnapshot for a bad snapshot) and leaves the
// store unchanged. Restore is meant for start-up, before the store serves,
// but is safe at any time.
func (s *Store) Restore(r io.Reader) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("memstore: restore: %w", err)
	}
	records, seed, err := checkSnapshot(data)
	if err != nil {
		return err
	}
	rs := s.newRestorer(seed)
	d := decoder{b: records, ok: true}
	for d.ok && len(d.b) > 0 {
		switch tag := d.u8(); tag {
		case tagSketch:
			err = rs.sketch(&d)
		case tagEntries:
			err = rs.entries(&d)
		case tagLog:
			err = rs.log(&d)
		case tagWords:
			err = rs.words(&d)
		default:
			err = corrupt("unknown record tag %#x", tag)
		}
		if err != nil {
			return err
		}
	}
	if !d.ok {
		return corrupt("a record overruns the snapshot")
	}
	s.swapIn(rs, seed)
	return nil
}

// checkSnapshot checks the header, the version, the checksum and the seed
// of a snapshot and returns its records and its seed.
func checkSnapshot(data []byte) (records []byte, seed uint64, err error) {
	if len(data) < headerLen+trailerLen {
		return nil, 0, corrupt("truncated: %d bytes", len(data))
	}
	if string(data[:8]) != snapMagic {
		return nil, 0, corrupt("not a memstore snapshot (bad magic)")
	}
	if v := binary.LittleEndian.Uint32(data[8:]); v != snapVersion && v != 1 {
		return nil, 0, corrupt("unsupported version %d (this build reads version %d)", v, snapVersion)
	}
	body, trailer := data[:len(data)-4], data[len(data)-4:]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(trailer) || body[len(body)-1] != tagEnd {
		return nil, 0, corrupt("checksum mismatch: the file is truncated or corrupted")
	}
	seed = binary.LittleEndian.Uint64(data[16:])
	if seed == 0 {
		return nil, 0, corrupt("zero seed")
	}
	return body[headerLen : len(body)-1], seed, nil
}

// restorer builds, apart from the store, the content a snapshot restores.
type restorer struct {
	s           *Store
	now         int64
	next        []shard
	sketches    []restoredSketch
	sketchBytes int64
}

type restoredSketch struct {
	id   sketchID
	s    *countMin
	idle int64
}

func (s *Store) newRestorer(seed uint64) *restorer {
	rs := &restorer{s: s, now: s.now(), next: make([]shard, len(s.shards))}
	for i := range rs.next {
		rs.next[i].logs = make(map[uint64]logList)
		rs.next[i].rng = mix64(seed ^ uint64(i))
	}
	return rs
}

// budget is a shard's share of Config.MaxBytes after the sketches read so
// far; 0 without a cap.
func (rs *restorer) budget() int64 {
	if rs.s.maxBytes == 0 {
		return 0
	}
	return max((rs.s.maxBytes-rs.sketchBytes)/int64(len(rs.next))-shardBytes, 1)
}

// sketch reads a sketch record; an expired sketch is dropped.
func (rs *restorer) sketch(d *decoder) error {
	n := d.u32()
	if n > maxNameLen {
		return corrupt("sketch name of %d bytes", n)
	}
	var id sketchID
	id.name = string(d.take(int(n)))
	id.rate, id.period, id.capacity = d.i64(), d.i64(), d.i64()
	id.width, id.depth = int(d.u32()), int(d.u32())
	idle := d.i64()
	blob := d.take(int(d.u32()))
	if !d.ok {
		return nil // Restore reports the overrun
	}
	if id.width < 1 || id.depth < 1 || id.width*id.depth > algo.MaxSketchCells {
		return corrupt("sketch %q of %dx%d cells", id.name, id.width, id.depth)
	}
	if idle <= rs.now {
		return nil
	}
	sk := algo.NewSketch(id.width, id.depth)
	if err := sk.UnmarshalBinary(blob); err != nil {
		return corrupt("sketch %q: %v", id.name, err)
	}
	rs.sketches = append(rs.sketches, restoredSketch{id: id, s: sk, idle: idle})
	rs.sketchBytes += int64(sk.Bytes())
	return nil
}

// entries reads a record of one-state entries into the new tables, within
// the memory cap; expired ones are dropped.
func (rs *restorer) entries(d *decoder) error {
	n := int(d.u32())
	b := rs.budget()
	for range n {
		k, st := d.u64(), algo.State{A: d.i64(), B: d.i64()}
		if !d.ok {
			return nil // Restore reports the overrun
		}
		if k == 0 {
			return corrupt("entry with key 0")
		}
		if st.A <= rs.now {
			continue
		}
		sh := &rs.next[rs.s.shardOf(k)]
		if i := sh.t.find(k); i >= 0 {
			sh.t.slots[i].st = st
			continue
		}
		if sh.t.n >= limitFor(len(sh.t.slots)) {
			rs.s.makeRoom(sh, rs.now, b)
		}
		sh.t.insert(k, st)
	}
	return nil
}

// words reads a record of word-table entries into the new word tables,
// within the memory cap; expired ones are dropped.
func (rs *restorer) words(d *decoder) error {
	n := int(d.u32())
	for range n {
		k, w := d.u64(), d.u64()
		if !d.ok {
			return nil // Restore reports the overrun
		}
		switch {
		case k == 0:
			return corrupt("word entry with key 0")
		case w >= wBusy:
			return corrupt("word entry with marker %#x", w)
		case wordIdleAt(w) <= rs.now:
			continue
		}
		sh := &rs.next[rs.s.shardOf(k)]
		if t := sh.wordsOf(); t != nil {
			if e := t.find(k); e != nil {
				e.word.Store(w)
				continue
			}
		}
		if t := sh.wordsOf(); t == nil || t.full(1) {
			rs.s.wMakeRoom(sh, 1, rs.now, rs.budget())
		}
		sh.wordsOf().insert(k, w)
	}
	return nil
}

// log reads a sliding log record, within the memory cap; an expired or
// empty log is dropped.
func (rs *restorer) log(d *decoder) error {
	k, idle, n := d.u64(), d.i64(), int(d.u32())
	if n > len(d.b)/16 {
		return corrupt("log of %d entries in %d bytes", n, len(d.b))
	}
	if idle <= rs.now || n == 0 {
		d.take(16 * n)
		return nil
	}
	e := make([]algo.LogEntry, n)
	var newest int64
	for i := range e {
		e[i] = algo.LogEntry{At: d.i64(), N: d.i64()}
		newest = max(newest, e[i].At)
	}
	// The snapshot keeps no Seen: the newest entry's time is the
	// latest the log surely changed at. Drops made later took only
	// entries that leave the window before any time after them.
	l := algo.Log{Entries: e, Seen: newest}
	l.Recount()
	sh := &rs.next[rs.s.shardOf(k)]
	if old, ok := sh.logs[k]; ok {
		sh.logBytes -= logKeyBytes + int64(cap(old.l.Entries))*logEntryBytes
	}
	sh.logs[k] = logList{idle: idle, l: l}
	sh.logBytes += logKeyBytes + int64(n)*logEntryBytes
	if b := rs.budget(); b > 0 {
		trimLogsBudget(sh, k, b, &rs.s.evicted)
	}
	return nil
}

// swapIn replaces the store's content with what rs read: every shard is
// locked (ascending), then the sketch set, as Take does.
func (s *Store) swapIn(rs *restorer, seed uint64) {
	for i := range s.shards {
		s.shards[i].mu.Lock()
	}
	s.sketches.mu.Lock()
	for _, sk := range s.sketches.m {
		sk.mu.Lock()
		sk.dead = true
		sk.mu.Unlock()
	}
	s.sketches.m = make(map[sketchID]*sketchSlot, len(rs.sketches))
	s.sketches.bytes.Store(0)
	for _, r := range rs.sketches {
		s.sketches.addLocked(r.id, r.s, r.idle)
	}
	s.seed.Store(seed)
	for i := range s.shards {
		sh := &s.shards[i]
		next := &rs.next[i]
		sh.t, sh.logs, sh.logBytes, sh.rng = next.t, next.logs, next.logBytes, next.rng
		if old := sh.wordsOf(); old != nil {
			old.freeze(0) // decisions in flight on the old table retry on the new one
		}
		sh.w.Store(next.wordsOf())
	}
	s.sketches.mu.Unlock()
	for i := range s.shards {
		s.shards[i].mu.Unlock()
	}
}
