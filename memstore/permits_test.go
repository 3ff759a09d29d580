package memstore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
)

// TestPermitsMemory: permits count in Len and Bytes, a sweep drops the
// expired ones, and the memory cap evicts whole keys' permits.
func TestPermitsMemory(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	s := memstore.New(memstore.Config{Shards: 1, SweepInterval: -1, Now: func() time.Time { return now }})
	defer s.Close()
	l := &sluice.Limit{Algorithm: sluice.Concurrency, Rate: 100, Period: time.Minute}
	empty := s.Stats().Bytes
	take := func(key, id string) {
		t.Helper()
		out := make([]sluice.Decision, 1)
		if err := s.Take(ctx, []sluice.Hit{{Key: key, Limit: l, Cost: 1, Permit: id}}, out); err != nil || !out[0].Allowed {
			t.Fatalf("take %s %s: %+v %v", key, id, out[0], err)
		}
	}
	for k := range 10 {
		for i := range 10 {
			take(fmt.Sprint("k", k), fmt.Sprint("permit-", i))
		}
	}
	if s.Stats().Keys != 10 {
		t.Fatalf("Len %d, want 10 keys", s.Stats().Keys)
	}
	per := (s.Stats().Bytes - empty) / 100
	if per < 50 || per > 200 {
		t.Errorf("%d bytes a permit (estimate)", per)
	}
	now = now.Add(time.Minute)
	if n := s.Sweep(); n != 100 {
		t.Errorf("swept %d, want the 100 permits expired", n)
	}
	if s.Stats().Keys != 0 || s.Stats().Bytes != empty {
		t.Fatalf("after the sweep: %d keys, %d bytes, want 0 and %d", s.Stats().Keys, s.Stats().Bytes, empty)
	}

	// Under a cap the permits held are never evicted: once they fill it,
	// new ones are refused.
	capped := memstore.New(memstore.Config{Shards: 1, SweepInterval: -1, MaxBytes: 4096, Now: func() time.Time { return now }})
	defer capped.Close()
	admitted := 0
	for k := range 100 {
		out := make([]sluice.Decision, 1)
		if err := capped.Take(ctx, []sluice.Hit{{Key: fmt.Sprint("k", k), Limit: l, Cost: 1, Permit: "p"}}, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Allowed {
			admitted++
		} else if out[0].RetryAfter <= 0 {
			t.Fatalf("key %d refused for memory without a RetryAfter: %+v", k, out[0])
		}
	}
	st := capped.Stats()
	if admitted == 0 || admitted == 100 || st.Keys != admitted || st.Evictions != 0 {
		t.Errorf("%d of 100 admitted, %d keys, %d evictions: want some refused, the admitted all kept", admitted, st.Keys, st.Evictions)
	}
	if st.Bytes > 4096+256 {
		t.Errorf("Bytes %d over the cap by more than a permit's set", st.Bytes)
	}
}

// TestPermitsNotEvicted: a flood of other keys under the memory cap
// evicts the rates' entries, never a key's permits held: its holders
// still count, and a newcomer is refused. Before, the flood evicted the
// set and the key admitted its limit again (an attack: 6 in flight for 3).
func TestPermitsNotEvicted(t *testing.T) {
	s := memstore.New(memstore.Config{Shards: 1, SweepInterval: -1, MaxBytes: 64 << 10})
	defer s.Close()
	conc := &sluice.Limit{Algorithm: sluice.Concurrency, Rate: 3, Period: time.Minute}
	rate := &sluice.Limit{Rate: 100, Period: time.Hour}
	acquire := func(id string) bool {
		t.Helper()
		out := make([]sluice.Decision, 1)
		if err := s.Take(ctx, []sluice.Hit{{Key: "victim", Limit: conc, Cost: 1, Permit: id}}, out); err != nil {
			t.Fatal(err)
		}
		return out[0].Allowed
	}
	for i := range 3 {
		if !acquire(fmt.Sprint("held-", i)) {
			t.Fatalf("holder %d refused", i)
		}
	}
	// Requests of other keys, 500 at a time in flight, each with a rate
	// and a permit it gives back when the 500 end.
	for b := range 40 {
		var flight []sluice.Hit
		for k := range 500 {
			key := fmt.Sprint("flood-", b, "-", k)
			out := make([]sluice.Decision, 2)
			if err := s.Take(ctx, []sluice.Hit{{Key: key + "/rate", Limit: rate, Cost: 1}, {Key: key, Limit: conc, Cost: 1, Permit: "p"}}, out); err != nil {
				t.Fatal(err)
			}
			if out[1].Allowed {
				flight = append(flight, sluice.Hit{Key: key, Limit: conc, Permit: "p"})
			}
		}
		for _, h := range flight {
			if err := s.Permits(ctx, []sluice.Hit{h}, nil, true); err != nil {
				t.Fatal(err)
			}
		}
	}
	if s.Stats().Evictions == 0 {
		t.Fatal("the flood evicted nothing: the cap was not reached")
	}
	if acquire("newcomer") {
		t.Fatal("a newcomer admitted beside the 3 holders after a flood of keys: their permits were evicted")
	}
}
