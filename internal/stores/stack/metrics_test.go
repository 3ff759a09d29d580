package stack

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
)

// TestMemCollector: a scrape reports what the store holds, and evictions
// once the memory cap forces them.
func TestMemCollector(t *testing.T) {
	s := memstore.New(memstore.Config{MaxBytes: 64 << 10, Shards: 1})
	defer s.Close()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(memCollector(s))
	lim := sluice.NewLimiter(s)
	l := &sluice.Limit{Rate: 10, Period: time.Hour}
	const keys = 100
	for i := range keys {
		if _, err := lim.Allow(context.Background(), fmt.Sprint("k", i), l); err != nil {
			t.Fatal(err)
		}
	}
	st := s.Stats()
	if st.Keys != keys || st.Bytes <= 0 || st.Evictions != 0 {
		t.Fatalf("stats after %d keys: %+v", keys, st)
	}
	if mfs, err := reg.Gather(); err != nil || len(mfs) != 4 {
		t.Fatalf("%d metric families (%v), want 4", len(mfs), err)
	}
	check := func(name string, want float64) {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			m := mf.GetMetric()[0]
			got := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			if got != want {
				t.Errorf("%s = %v, want %v", name, got, want)
			}
			return
		}
		t.Errorf("%s not gathered", name)
	}
	check("sluice_store_keys", keys)
	check("sluice_store_bytes", float64(st.Bytes))
	check("sluice_store_evictions_total", 0)
	check("sluice_permits_expired_total", 0)

	// Far more keys than 64 KiB holds: the cap evicts, and the scrape
	// says so.
	for i := range 20_000 {
		if _, err := lim.Allow(context.Background(), fmt.Sprint("x", i), l); err != nil {
			t.Fatal(err)
		}
	}
	st = s.Stats()
	if st.Evictions == 0 || st.Bytes > 64<<10 {
		t.Fatalf("stats after the flood: %+v", st)
	}
	check("sluice_store_evictions_total", float64(st.Evictions))
	check("sluice_store_keys", float64(st.Keys))
}
