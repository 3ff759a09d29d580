package memstore

import (
	"math/rand/v2"
	"testing"

	"github.com/sluicehq/sluice/internal/base/algo"
)

// checkTable verifies the invariants of a Robin Hood table: the count,
// every key findable, no run broken by a gap before its entries, and probe
// distances that grow by at most one from slot to slot.
func checkTable(t *testing.T, tb *table, want map[uint64]algo.State) {
	t.Helper()
	n := 0
	c := len(tb.slots)
	for i, e := range tb.slots {
		if e.key == 0 {
			continue
		}
		n++
		if got, ok := want[e.key]; !ok || got != e.st {
			t.Fatalf("slot %d holds %x=%v, want %v (present %v)", i, e.key, e.st, got, ok)
		}
		prev := tb.slots[(i+c-1)%c]
		if d := tb.dist(i, e.key); d > 0 && (prev.key == 0 || tb.dist((i+c-1)%c, prev.key) < d-1) {
			t.Fatalf("slot %d: distance %d after a gap or a shorter run", i, d)
		}
	}
	if n != tb.n || n != len(want) {
		t.Fatalf("table counts %d, holds %d, want %d", tb.n, n, len(want))
	}
	for k, st := range want {
		i := tb.find(k)
		if i < 0 || tb.slots[i].st != st {
			t.Fatalf("find(%x) = %d", k, i)
		}
	}
}

func TestTableAgainstMap(t *testing.T) {
	for _, c := range []int{8, 13, 100, 1000, 1237} {
		rng := rand.New(rand.NewPCG(uint64(c), 1))
		tb := table{slots: make([]entry, c)}
		want := map[uint64]algo.State{}
		var keys []uint64
		for step := range 20 * c {
			switch op := rng.IntN(10); {
			case op < 5 && tb.n < limitFor(c):
				k := rng.Uint64() | 1
				if c < 100 {
					k = rng.Uint64N(64) + 1 // many collisions
				}
				st := algo.State{A: int64(step) + 1, B: int64(k)}
				if i := tb.find(k); i >= 0 {
					tb.slots[i].st = st
				} else {
					tb.insert(k, st)
					keys = append(keys, k)
				}
				want[k] = st
			case op < 8 && len(keys) > 0:
				j := rng.IntN(len(keys))
				k := keys[j]
				keys[j] = keys[len(keys)-1]
				keys = keys[:len(keys)-1]
				i := tb.find(k)
				if i < 0 {
					t.Fatalf("cap %d: key %x lost", c, k)
				}
				tb.remove(i)
				delete(want, k)
			default:
				if tb.find(rng.Uint64()|1<<63) >= 0 {
					t.Fatalf("found a key never inserted")
				}
			}
			if step%97 == 0 {
				checkTable(t, &tb, want)
			}
		}
		checkTable(t, &tb, want)

		// Sweep at a time that idles about half of the entries.
		now := int64(10 * c)
		for k, st := range want {
			if st.A <= now {
				delete(want, k)
			}
		}
		tb.sweep(0, len(tb.slots), now)
		// An entry shifted across the wrap-around may be left for the
		// next pass; a second pass gets it.
		tb.sweep(0, len(tb.slots), now)
		checkTable(t, &tb, want)

		tb.rebuild(capFor(tb.n), now)
		checkTable(t, &tb, want)
	}
}

func TestCapacityBounds(t *testing.T) {
	for n := 1; n < 1_000_000; n = n*5/4 + 1 {
		c := capFor(n)
		if limitFor(c) < n {
			t.Fatalf("capFor(%d) = %d holds only %d", n, c, limitFor(c))
		}
		if n > 1000 {
			if perKey := float64(c*entryBytes) / float64(n); perKey > 32 {
				t.Fatalf("a table rebuilt for %d keys uses %.1f bytes per key", n, perKey)
			}
		}
	}
}

func TestEvictEarliestIdle(t *testing.T) {
	s := New(Config{Shards: 1, SweepInterval: -1, Seed: 1})
	sh := &s.shards[0]
	sh.t.rebuild(minCap, 0)
	idle := []int64{50, 20, 90, 30, 70, 60, 80}
	for i, a := range idle {
		sh.t.insert(uint64(i+1)*0x9e3779b97f4a7c15, algo.State{A: a})
	}
	for _, want := range []int64{20, 30, 50} {
		s.evict(sh, 0)
		for _, e := range sh.t.slots {
			if e.key != 0 && e.st.A == want {
				t.Fatalf("evict left the entry idle at %d, the earliest", want)
			}
		}
	}
	if sh.t.n != len(idle)-3 || s.Stats().Evictions != 3 {
		t.Fatalf("after 3 evictions: %d entries, %d evictions counted", sh.t.n, s.Stats().Evictions)
	}
}
