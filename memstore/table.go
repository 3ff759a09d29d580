package memstore

import (
	"math/bits"

	"github.com/sluicehq/sluice/internal/base/algo"
)

// entry is one slot of a table: a key's 64-bit hash and its state, inline.
// Key 0 marks an empty slot (keyHash never returns 0). 24 bytes, no
// pointers, so the garbage collector never scans a table.
type entry struct {
	key uint64
	st  algo.State
}

const (
	entryBytes = 24

	// maxLoad is the largest fraction of a table's slots in use. Robin Hood
	// probing keeps lookups short at this load (an unsuccessful lookup stops
	// as soon as it meets an entry closer to its home than the key would be).
	maxLoad = 0.92

	// growth is the factor by which a full table grows. After a resize the
	// load is maxLoad/growth ≈ 0.77, so a table never holds more than
	// entryBytes*growth/maxLoad ≈ 31.3 bytes per key.
	growth = 1.2

	minCap = 8
)

// table is an open-addressing hash table with linear probing, Robin Hood
// insertion and backward-shift deletion. Its capacity is any integer: the
// home slot of a key is the high word of key*cap (Lemire's multiply-shift
// range reduction), so tables grow by a modest factor instead of doubling.
//
// A table is not safe for concurrent use; its shard's mutex guards it.
type table struct {
	slots []entry
	n     int // entries in use
}

// limitFor returns how many entries a table of capacity c may hold: at most
// maxLoad of it, and always leaving one slot empty so that probes end.
func limitFor(c int) int {
	l := int(float64(c) * maxLoad)
	if l > c-1 {
		l = c - 1
	}
	return l
}

// capFor returns the capacity of a table rebuilt to hold n entries with
// room to grow: n*growth/maxLoad, at least minCap.
func capFor(n int) int {
	c := int(float64(n)*growth/maxLoad) + 1
	if c < minCap {
		c = minCap
	}
	return c
}

func (t *table) home(key uint64) int {
	hi, _ := bits.Mul64(key, uint64(len(t.slots)))
	return int(hi)
}

// dist returns how far slot i is from the home of key.
func (t *table) dist(i int, key uint64) int {
	d := i - t.home(key)
	if d < 0 {
		d += len(t.slots)
	}
	return d
}

// find returns the slot of key, or -1.
func (t *table) find(key uint64) int {
	c := len(t.slots)
	if c == 0 {
		return -1
	}
	i := t.home(key)
	for d := 0; ; d++ {
		k := t.slots[i].key
		if k == key {
			return i
		}
		if k == 0 || t.dist(i, k) < d {
			return -1
		}
		if i++; i == c {
			i = 0
		}
	}
}

// insert adds key, which must be absent, with state st. The caller ensures
// that t.n < limitFor(len(t.slots)).
func (t *table) insert(key uint64, st algo.State) {
	c := len(t.slots)
	cur := entry{key: key, st: st}
	i := t.home(key)
	for d := 0; ; d++ {
		e := &t.slots[i]
		if e.key == 0 {
			*e = cur
			t.n++
			return
		}
		if ed := t.dist(i, e.key); ed < d {
			cur, *e = *e, cur
			d = ed
		}
		if i++; i == c {
			i = 0
		}
	}
}

// remove deletes the entry in slot i, shifting the entries after it back
// towards their homes so that no tombstone is left.
func (t *table) remove(i int) {
	c := len(t.slots)
	for {
		j := i + 1
		if j == c {
			j = 0
		}
		e := t.slots[j]
		if e.key == 0 || t.dist(j, e.key) == 0 {
			t.slots[i] = entry{}
			break
		}
		t.slots[i] = e
		i = j
	}
	t.n--
}

// rebuild moves every entry still live at now into a new table of
// capacity c (which must exceed the number of live entries).
func (t *table) rebuild(c int, now int64) {
	old := t.slots
	t.slots = make([]entry, c)
	t.n = 0
	for _, e := range old {
		if e.key != 0 && e.st.A > now {
			t.insert(e.key, e.st)
		}
	}
}

// sweep deletes the entries idle at now among slots [from, to) and returns
// how many it deleted. Entries shifted into the range from beyond it are
// examined too; an entry shifted across the wrap-around is left for the next
// pass.
func (t *table) sweep(from, to int, now int64) int {
	removed := 0
	for i := from; i < to && i < len(t.slots); {
		e := &t.slots[i]
		if e.key != 0 && e.st.A <= now {
			t.remove(i)
			removed++
			continue
		}
		i++
	}
	return removed
}

func (t *table) bytes() int64 { return int64(len(t.slots)) * entryBytes }
