package sluice

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestPlainImpliesValid: the cheap check the Limiter runs on every call
// never accepts a limit that Validate rejects, and accepts the common ones.
func TestPlainImpliesValid(t *testing.T) {
	ints := []int64{-1, 0, 1, 3, 100, MaxCost, MaxCost + 1, math.MaxUint32 - 1, math.MaxUint32, math.MaxInt64}
	durs := []time.Duration{-time.Second, 0, 1, time.Millisecond, time.Second, time.Hour, 100 * 365 * 24 * time.Hour}
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func(v []int64) int64 { return v[rng.IntN(len(v))] }
	pickD := func(v []time.Duration) time.Duration { return v[rng.IntN(len(v))] }
	plain := 0
	for range 200000 {
		l := Limit{
			Algorithm: Algorithm(rng.IntN(int(Sketch) + 2)),
			Rate:      pick(ints),
			Period:    pickD(durs),
			Burst:     pick(ints),
			BlockFor:  pickD(durs),
		}
		if rng.IntN(4) == 0 {
			l.RefillInterval = pickD(durs)
		}
		if rng.IntN(4) == 0 {
			l.SoftPercent = int(pick(ints))
		}
		if rng.IntN(4) == 0 {
			l.ElasticCeiling = pick(ints)
		}
		if rng.IntN(4) == 0 {
			l.Sketch = SketchConfig{Width: int(pick(ints)), Depth: int(pick(ints))}
		}
		if l.plain() {
			plain++
			if err := l.Validate(); err != nil {
				t.Fatalf("plain but invalid: %+v: %v", l, err)
			}
		}
	}
	if plain < 1000 {
		t.Fatalf("only %d plain limits drawn: the test does not exercise plain()", plain)
	}
	for _, l := range []Limit{
		{Rate: 100, Period: time.Second},
		{Algorithm: GCRA, Rate: 10, Period: time.Second, Burst: 5},
		{Algorithm: Sketch, Rate: 600, Period: time.Minute},
	} {
		if !l.plain() {
			t.Errorf("common limit %+v is not plain", l)
		}
	}
}
