package memstore_test

import (
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock) sluice.Store {
		s := memstore.New(memstore.Config{Now: clock.Now, Shards: 4})
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// TestConformanceCapped runs the suite on a store whose memory cap is far
// above what the suite needs: the cap must not change any decision.
func TestConformanceCapped(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock) sluice.Store {
		s := memstore.New(memstore.Config{Now: clock.Now, MaxBytes: 1 << 26, SweepInterval: -1})
		t.Cleanup(func() { s.Close() })
		return s
	})
}
