package stack_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/stores/stack"
	"github.com/sluicehq/sluice/internal/testsupport/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// families gathers the stack's collectors and returns the prefixes
// (sluice_<part>_) of the metric families they export.
func families(t *testing.T, st *stack.Stack) map[string]bool {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(st.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		for _, p := range []string{"sluice_store_", "sluice_redis_", "sluice_local_cache_", "sluice_lease_", "sluice_region_"} {
			if strings.HasPrefix(mf.GetName(), p) {
				got[p] = true
			}
		}
	}
	return got
}

// The whole stack over a real Redis: regions -> localcache -> lease ->
// redis, each part unwrapping to the next, Redis's clock, health and the
// metrics of every part; Close closes them all, and again does nothing.
func TestOpenRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	st, err := stack.Open(stack.Config{
		Kind:      stack.Redis,
		Redis:     redisstore.Config{URL: srv.URL(), Prefix: "stack:"},
		CacheSize: 100,
		Region:    &stack.RegionConfig{Region: "eu", Regions: []string{"eu", "us"}, Coordinator: srv.URL(), Interval: 50 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	parts := []sluice.Store{st.Regions, st.Cache, st.Lease, st.Redis}
	if st.Store != parts[0] || st.Region != "eu" {
		t.Fatalf("top %T, region %q; want the region tier, eu", st.Store, st.Region)
	}
	for i, p := range parts[:3] {
		if next := p.(interface{ Unwrap() sluice.Store }).Unwrap(); next != parts[i+1] {
			t.Errorf("%T unwraps to %T, want %T", p, next, parts[i+1])
		}
	}
	if st.Now == nil || st.Earliest == nil || st.Earliest().IsZero() {
		t.Fatal("no clock of Redis: Open samples it before it returns")
	}
	if d := time.Until(st.Now()); d < -time.Second || d > time.Second {
		t.Errorf("Redis's clock %v from this process's, on the same machine", d)
	}
	if st.Health == nil || st.Health() != nil {
		t.Fatal("Redis up, and not healthy")
	}
	l := &sluice.Limit{Rate: 1, Period: time.Minute}
	lim := sluice.NewLimiter(st.Store)
	for i, want := range []bool{true, false} {
		d, err := lim.Allow(context.Background(), "k", l)
		if err != nil || d.Allowed != want {
			t.Fatalf("request %d: %+v, %v", i, d, err)
		}
	}
	got := families(t, st)
	for _, p := range []string{"sluice_redis_", "sluice_local_cache_", "sluice_lease_", "sluice_region_"} {
		if !got[p] {
			t.Errorf("no %s* metrics", p)
		}
	}
	if got["sluice_store_"] {
		t.Error("the embedded store's metrics over Redis")
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := st.Redis.Take(context.Background(), []sluice.Hit{{Key: "k", Limit: l, Cost: 1}}, make([]sluice.Decision, 1)); err == nil {
		t.Error("Redis still decides after Close")
	}
	if err := st.Close(); err != nil {
		t.Fatal("a second Close:", err)
	}
}

// The embedded store alone: its clock, no health check, its metrics.
func TestOpenMemory(t *testing.T) {
	before := time.Now()
	st, err := stack.Open(stack.Config{Kind: stack.Memory, MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.Store != st.Mem || st.Redis != nil || st.Lease != nil || st.Cache != nil || st.Regions != nil {
		t.Fatalf("parts %+v, want the embedded store alone", st)
	}
	if st.Now != nil || st.Health != nil {
		t.Error("a clock or a health check of the embedded store: nil means time.Now, always up")
	}
	if e := st.Earliest(); e.Before(before.Add(-time.Second)) || e.After(time.Now()) {
		t.Errorf("Earliest %v, not at or before now, after %v", e, before)
	}
	if got := families(t, st); len(got) != 1 || !got["sluice_store_"] {
		t.Errorf("metric families %v, want sluice_store_* alone", got)
	}
}

// Bad configurations are errors, with nothing left open.
func TestOpenRefuses(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, c := range []struct {
		name string
		cfg  stack.Config
		want string
	}{
		{"kind", stack.Config{Kind: "disk"}, `unknown store "disk"`},
		{"prefix", stack.Config{Kind: stack.Redis, Redis: redisstore.Config{URL: srv.URL(), Prefix: "{x}"}}, "must not contain"},
		{"coordinator", stack.Config{Kind: stack.Redis, Redis: redisstore.Config{URL: srv.URL()},
			Region: &stack.RegionConfig{Region: "eu", Regions: []string{"eu"}, Coordinator: "http://nowhere"}}, "coordinator: "},
		{"region", stack.Config{Kind: stack.Redis, Redis: redisstore.Config{URL: srv.URL()},
			Region: &stack.RegionConfig{Region: "eu", Regions: []string{"us"}, Coordinator: srv.URL()}}, "not among"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := runtime.NumGoroutine()
			st, err := stack.Open(c.cfg)
			if err == nil || st != nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Open: %v, %v; want nil and an error with %q", st, err, c.want)
			}
			var ce *stack.CoordinatorError
			if errors.As(err, &ce) != (c.name == "coordinator") {
				t.Errorf("%v: a CoordinatorError %v", err, ce)
			}
			// What Open had opened, it closed: its goroutines end.
			deadline := time.Now().Add(10 * time.Second)
			for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if n := runtime.NumGoroutine(); n > before {
				t.Errorf("%d goroutines after a refused Open, %d before", n, before)
			}
		})
	}
}
