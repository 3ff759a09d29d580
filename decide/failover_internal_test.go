package decide

import (
	"math/bits"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// scale keeps every valid limit valid, divides its counts rounding up, and
// never makes a nonzero limit zero.
func TestScale(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	periods := []time.Duration{time.Millisecond, time.Second, time.Minute, time.Hour, 24 * time.Hour, 90 * time.Second}
	tried, stated := 0, 0
	for tried < 20000 {
		l := &sluice.Limit{
			Algorithm: sluice.Algorithm(r.IntN(7)),
			Rate:      []int64{0, 1, 2, 3, 7, 10, 1000, 1 << 31, sluice.MaxCost}[r.IntN(9)],
			Period:    periods[r.IntN(len(periods))],
		}
		if r.IntN(2) == 0 {
			l.Burst = r.Int64N(100) + 1
		}
		if r.IntN(4) == 0 {
			l.RefillInterval = periods[r.IntN(len(periods))]
		}
		if r.IntN(4) == 0 {
			l.SoftPercent = r.IntN(200)
		}
		if r.IntN(4) == 0 {
			l.ElasticCeiling = l.Nominal() + r.Int64N(100)
		}
		if l.Validate() != nil {
			continue
		}
		tried++
		n := r.Int64N(9) + 1
		c := scale(l, n)
		if err := c.Validate(); err != nil {
			t.Fatalf("scale(%+v, %d) = %+v: %v", l, n, c, err)
		}
		if want := ceilDiv(l.Nominal(), n); c.Nominal() != want {
			t.Fatalf("scale(%+v, %d): nominal %d, want %d", l, n, c.Nominal(), want)
		}
		if l.Rate > 0 && c.Rate == 0 || l.ElasticCeiling != 0 && c.ElasticCeiling != ceilDiv(l.ElasticCeiling, n) {
			t.Fatalf("scale(%+v, %d) = %+v", l, n, c)
		}
		if c.Algorithm != l.Algorithm || c.SoftPercent != l.SoftPercent || c.Shadow != l.Shadow || c.Name != l.Name {
			t.Fatalf("scale(%+v, %d) changed a setting: %+v", l, n, c)
		}
		// The refill per step is divided; the refill rate of a smooth
		// bucket and a window's rate per period too.
		if l.RefillInterval > 0 {
			// Per step: ceil(a/n), or a little more where that cannot be
			// stated, never more than a.
			_, lo := bits.Mul64(uint64(l.Rate), uint64(l.RefillInterval))
			a := int64(lo / uint64(l.Period))
			_, clo := bits.Mul64(uint64(c.Rate), uint64(c.RefillInterval))
			ca := int64(clo / uint64(c.Period))
			if ca < ceilDiv(a, n) || ca > a || c.Period == l.RefillInterval && ca != ceilDiv(a, n) {
				t.Fatalf("scale(%+v, %d) = %+v: %d per step from %d", l, n, c, ca, a)
			}
			if c.Period != l.RefillInterval {
				stated++
			}
		} else if c.Period != l.Period || c.Rate != ceilDiv(l.Rate, n) {
			t.Fatalf("scale(%+v, %d) = %+v: rate", l, n, c)
		}
	}
	if stated == 0 {
		t.Error("no limit needed its rate rounded to a whole step")
	}
	if c := scale(&sluice.Limit{Rate: 5, Period: time.Second}, 1); c.Rate != 5 {
		t.Errorf("one node: %+v", c)
	}
}
