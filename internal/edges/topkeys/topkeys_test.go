package topkeys

import (
	"fmt"
	"testing"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/edges/hitters"
	"github.com/sluicehq/sluice/rules"
)

// BenchmarkRecord is what top keys add to a decision, alone: the key
// hashed and recorded, for requests of one descriptor over 10,000 keys
// taken in turn, allowed.
func BenchmarkRecord(b *testing.B) {
	top := hitters.New(hitters.Config{})
	defer top.Close()
	descs := make([][]rules.Descriptor, 10_000)
	for i := range descs {
		descs[i] = []rules.Descriptor{{Entries: []rules.Entry{{Key: "user", Value: fmt.Sprint(i)}}, Cost: 1}}
	}
	o := &decide.Outcome{}
	o.Descriptors = []decide.DescriptorOutcome{{Limited: true, Cost: 1, StatKey: "bench.user"}}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		Record(top, descs[i%len(descs)], o, false)
		i++
	}
}

// TestGlobalShadow: in global shadow mode a denial is let through, so the
// top keys count it shadow-denied, not denied; without it, denied. A peek
// (cost 0) is no hit.
func TestGlobalShadow(t *testing.T) {
	for _, shadow := range []bool{false, true} {
		top := hitters.New(hitters.Config{})
		defer top.Close()
		descs := []rules.Descriptor{{Entries: []rules.Entry{{Key: "user", Value: "mallory"}}, Cost: 1}}
		o := &decide.Outcome{}
		o.Descriptors = []decide.DescriptorOutcome{{Limited: true, Over: true, Cost: 1, StatKey: "bench.user"}}
		Record(top, descs, o, shadow)
		o.Descriptors[0].Cost = 0
		Record(top, descs, o, shadow)
		var got [3]int64
		for _, p := range top.Series("bench.user") {
			got[0], got[1], got[2] = got[0]+p.Allowed, got[1]+p.Denied, got[2]+p.Shadow
		}
		want := [3]int64{0, 1, 0}
		if shadow {
			want = [3]int64{0, 0, 1}
		}
		if got != want {
			t.Errorf("global shadow %v: allowed, denied, shadow-denied %v, want %v", shadow, got, want)
		}
	}
}
