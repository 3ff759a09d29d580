package sluice_test

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/vocab/limits"
)

// TestParamsAgree: the field-to-parameter mapping is written twice, in
// Limit.params (which Validate and Settle use) and in limits.Params (which
// the stores use), because the root cannot import the internal package
// that imports it. Both call algo.LimitParams; this holds their arguments
// equal over random valid limits of every algorithm, so that the two cannot
// drift apart unnoticed.
func TestParamsAgree(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	ints := []int64{0, 1, 3, 7, 100, 1000, 1 << 20, math.MaxUint32}
	durs := []time.Duration{time.Millisecond, time.Second, time.Minute, time.Hour, 24 * time.Hour}
	pick := func(v []int64) int64 { return v[rng.IntN(len(v))] }
	valid := 0
	for range 50000 {
		l := sluice.Limit{
			Algorithm: sluice.Algorithm(rng.IntN(int(sluice.Concurrency) + 1)),
			Rate:      pick(ints),
			Period:    durs[rng.IntN(len(durs))],
		}
		switch rng.IntN(6) {
		case 0:
			l.Burst = pick(ints)
		case 1:
			l.SoftPercent = int(rng.IntN(101))
		case 2:
			l.ElasticCeiling = pick(ints)
		case 3:
			l.RefillInterval = durs[rng.IntN(len(durs))]
		case 4:
			l.WindowOffset = time.Duration(rng.Int64N(int64(l.Period)))
		case 5:
			l.Debit = true
		}
		if l.Validate() != nil {
			continue
		}
		valid++
		if got, want := limits.Params(&l), sluice.ParamsOf(&l); got != want {
			t.Fatalf("limit %+v: limits.Params = %+v, Limit.params = %+v", l, got, want)
		}
	}
	if valid < 10000 {
		t.Fatalf("only %d of 50000 random limits were valid: the test covers too little", valid)
	}
}
