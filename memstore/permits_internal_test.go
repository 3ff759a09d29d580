package memstore

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// checkPermits verifies a permit set's invariants: every permit has a
// live entry, the entries from head on are sorted by expiry, the front
// one is live, the ID bytes add up, and stale entries are bounded.
func checkPermits(t *testing.T, ps *permitSet) {
	t.Helper()
	live := map[string]int{}
	var idBytes int64
	for id := range ps.ids {
		idBytes += int64(len(id))
	}
	if idBytes != ps.idBytes {
		t.Fatalf("idBytes %d, want %d", ps.idBytes, idBytes)
	}
	for i := ps.head; i < len(ps.q); i++ {
		e := &ps.q[i]
		if i > ps.head && ps.q[i-1].exp > e.exp {
			t.Fatalf("queue unsorted at %d: %d after %d", i, e.exp, ps.q[i-1].exp)
		}
		if ps.live(e) {
			live[e.id]++
		}
	}
	for id := range ps.ids {
		if live[id] < 1 {
			t.Fatalf("permit %q has %d live entries", id, live[id])
		}
	}
	if ps.head < len(ps.q) && len(ps.ids) > 0 && !ps.live(&ps.q[ps.head]) {
		t.Fatalf("the front entry is stale after drop")
	}
	if stale := len(ps.q) - ps.head - len(ps.ids); stale > 2*len(ps.ids)+16 {
		t.Fatalf("%d stale entries for %d permits", stale, len(ps.ids))
	}
}

// TestPermitSetRandom drives a permit set with random holds (times that
// may go backwards), renewals, releases and drops, against a map.
func TestPermitSetRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		ps := &permitSet{ids: map[string]int64{}}
		want := map[string]int64{}
		now := int64(1e12)
		for range 500 {
			id := fmt.Sprint("p", r.IntN(12))
			switch r.IntN(6) {
			case 0, 1: // hold or refresh, a period on
				exp := now + int64(r.IntN(50))
				ps.hold(id, max(exp, want[id]))
				want[id] = max(exp, want[id])
			case 2: // release
				ps.del(id)
				delete(want, id)
			case 3: // time passes, or goes back
				now += int64(r.IntN(30)) - 5
			}
			ps.drop(now)
			for id, e := range want {
				if e <= now {
					delete(want, id)
				}
			}
			checkPermits(t, ps)
			if len(ps.ids) != len(want) {
				t.Fatalf("%d held, want %d", len(ps.ids), len(want))
			}
			earliest := int64(0)
			for id, e := range want {
				if ps.ids[id] != e {
					t.Fatalf("%s expires at %d, want %d", id, ps.ids[id], e)
				}
				if earliest == 0 || e < earliest {
					earliest = e
				}
			}
			if v := ps.view("x"); v.Earliest != earliest {
				t.Fatalf("earliest %d, want %d", v.Earliest, earliest)
			}
		}
	}
}

// TestPermitSetRenewStorm: a holder renewing in a loop leaves stale
// entries that stay bounded.
func TestPermitSetRenewStorm(t *testing.T) {
	ps := &permitSet{ids: map[string]int64{}}
	for i := range 3 {
		ps.hold(fmt.Sprint(i), 1000)
	}
	for i := range 100000 {
		ps.hold("0", int64(1001+i))
	}
	checkPermits(t, ps)
	if len(ps.q) > 40 {
		t.Fatalf("%d entries for 3 permits", len(ps.q))
	}
}
