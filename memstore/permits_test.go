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

	capped := memstore.New(memstore.Config{Shards: 1, SweepInterval: -1, MaxBytes: 4096, Now: func() time.Time { return now }})
	defer capped.Close()
	for k := range 100 {
		out := make([]sluice.Decision, 1)
		if err := capped.Take(ctx, []sluice.Hit{{Key: fmt.Sprint("k", k), Limit: l, Cost: 1, Permit: "p"}}, out); err != nil {
			t.Fatal(err)
		}
	}
	if b := capped.Stats().Bytes; b > 4096 {
		t.Errorf("Bytes %d over the cap", b)
	}
	if capped.Stats().Evictions == 0 || capped.Stats().Keys >= 100 {
		t.Errorf("%d evictions, %d keys", capped.Stats().Evictions, capped.Stats().Keys)
	}
}
