package memstore

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	"github.com/sluicehq/sluice/internal/base/algo"
)

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
	// The blob's own size bounds what unmarshalling it allocates: no
	// sketch of the record's dimensions is made before it is read.
	sk := new(countMin)
	if err := sk.UnmarshalBinary(blob); err != nil {
		return corrupt("sketch %q: %v", id.name, err)
	}
	if sk.Width() != id.width || sk.Depth() != id.depth {
		return corrupt("sketch %q of %dx%d cells holds %dx%d", id.name, id.width, id.depth, sk.Width(), sk.Depth())
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
	reseed := s.seed.Swap(seed) != seed
	for i := range s.shards {
		sh := &s.shards[i]
		next := &rs.next[i]
		if reseed {
			// Permits are not saved (their holders are gone with the
			// process that wrote the snapshot), and under another seed
			// the ones held here are out of reach of their holders.
			sh.perms, sh.permBytes = nil, 0
		}
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
