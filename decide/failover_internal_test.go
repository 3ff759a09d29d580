package decide

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/base/algo"

	"github.com/sluicehq/sluice"
)

// localCost weighs a hit n times its cost, never less than the cost, and
// caps a cost that fits the limit's capacity at that capacity, so that a
// limit smaller than the number of nodes still admits one request a node.
func TestLocalCost(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		l := &sluice.Limit{
			Algorithm: sluice.Algorithm(r.IntN(7)),
			Rate:      []int64{0, 1, 2, 3, 7, 10, 1000, 1 << 31, sluice.MaxCost}[r.IntN(9)],
			Period:    time.Minute,
		}
		if r.IntN(2) == 0 && (l.Algorithm == sluice.TokenBucket || l.Algorithm == sluice.LeakyBucket || l.Algorithm == sluice.GCRA) {
			l.Burst = r.Int64N(100) + 1
		}
		c := []int64{0, 1, 2, 5, 100, sluice.MaxCost}[r.IntN(6)]
		n := r.Int64N(9) + 1
		w := localCost(c, n, l)
		capacity := algo.Nominal(algo.Kind(l.Algorithm), l.Rate, l.Burst)
		switch {
		case w < c || w > sluice.MaxCost:
			t.Fatalf("localCost(%d, %d, %+v) = %d", c, n, l, w)
		case n == 1 && w != c:
			t.Fatalf("one node: localCost(%d, 1, %+v) = %d", c, l, w)
		case c <= capacity && w > capacity:
			t.Fatalf("localCost(%d, %d, %+v) = %d, over the capacity %d", c, n, l, w, capacity)
		case c <= sluice.MaxCost/n && c <= capacity && w != min(c*n, capacity):
			t.Fatalf("localCost(%d, %d, %+v) = %d, want %d", c, n, l, w, min(c*n, capacity))
		case c <= sluice.MaxCost/n && c > capacity && w != c*n:
			t.Fatalf("localCost(%d, %d, %+v) = %d, want %d", c, n, l, w, c*n)
		}
	}
}

// The local policy divides by the larger of Nodes and the count the nodes
// learn (NodeCount): Nodes is a floor the learnt count never goes below.
func TestFailoverNodes(t *testing.T) {
	learnt := func(n int) func() int { return func() int { return n } }
	for _, c := range []struct {
		f    Failover
		want int64
	}{
		{Failover{}, 1},
		{Failover{Nodes: 3}, 3},
		{Failover{NodeCount: learnt(0)}, 1},
		{Failover{NodeCount: learnt(-2)}, 1},
		{Failover{NodeCount: learnt(4)}, 4},
		{Failover{Nodes: 3, NodeCount: learnt(0)}, 3},
		{Failover{Nodes: 3, NodeCount: learnt(1)}, 3},
		{Failover{Nodes: 3, NodeCount: learnt(5)}, 5},
	} {
		got := c.f.nodes()
		n := "nil"
		if c.f.NodeCount != nil {
			n = fmt.Sprint(c.f.NodeCount())
		}
		if got != c.want {
			t.Errorf("Nodes %d, NodeCount %s: %d nodes, want %d", c.f.Nodes, n, got, c.want)
		}
	}
}
