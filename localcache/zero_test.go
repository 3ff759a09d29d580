package localcache

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
)

// TestZeroWindowEach: a zero fixed window decided one by one, through the
// cache, answers as the store alone and as envoyproxy/ratelimit: in each
// window a check passes, the charge is denied (and counted by the store),
// and the check after it is denied. A cached denial that outlived its
// window kept the next window's charge from the store, whose checks then
// all passed.
func TestZeroWindowEach(t *testing.T) {
	wall := time.Unix(1_800_000_000, 0)
	var mono time.Duration
	ms := memstore.New(memstore.Config{Now: func() time.Time { return wall.Add(mono) }, SweepInterval: -1})
	defer ms.Close()
	c := New(ms, Config{Now: func() time.Duration { return mono }})
	l := &sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 0, Period: time.Minute}
	var got []bool
	for range 3 {
		for _, cost := range []int64{0, 1, 0, 1, 0} {
			out := make([]sluice.Decision, 1)
			if err := c.TakeEach(context.Background(), []sluice.Hit{{Key: "k", Limit: l, Cost: cost}}, out); err != nil {
				t.Fatal(err)
			}
			got = append(got, out[0].Allowed)
		}
		mono += time.Minute
	}
	want := []bool{true, false, false, false, false}
	for i, a := range got {
		if a != want[i%5] {
			t.Fatalf("check, charge, check, charge, check in 3 windows: %v, want %v each window", got, want)
		}
	}
}
