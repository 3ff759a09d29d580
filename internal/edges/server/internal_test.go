package server

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

// watchStream is the server side of a Watch stream, recording what is sent.
type watchStream struct {
	grpc.ServerStream
	ctx  context.Context
	mu   sync.Mutex
	sent []healthpb.HealthCheckResponse_ServingStatus
}

func (w *watchStream) Context() context.Context { return w.ctx }

func (w *watchStream) Send(r *healthpb.HealthCheckResponse) error {
	w.mu.Lock()
	w.sent = append(w.sent, r.Status)
	w.mu.Unlock()
	return nil
}

func (w *watchStream) statuses() []healthpb.HealthCheckResponse_ServingStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]healthpb.HealthCheckResponse_ServingStatus(nil), w.sent...)
}

// Watch sends changes of configuration and draining at once, and a failing
// Ready check within healthPoll.
func TestHealthWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New(memstore.Config{SweepInterval: -1})
		defer store.Close()
		var mu sync.Mutex
		var storeErr error
		s, err := New(Config{
			Decide: decide.Config{Limiter: sluice.NewLimiter(store)},
			Ready: func(context.Context) error {
				mu.Lock()
				defer mu.Unlock()
				return storeErr
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		stream := &watchStream{ctx: ctx}
		done := make(chan error)
		go func() { done <- health{s: s}.Watch(&healthpb.HealthCheckRequest{}, stream) }()
		const (
			serving    = healthpb.HealthCheckResponse_SERVING
			notServing = healthpb.HealthCheckResponse_NOT_SERVING
		)
		expect := func(want ...healthpb.HealthCheckResponse_ServingStatus) {
			t.Helper()
			synctest.Wait()
			got := stream.statuses()
			if len(got) != len(want) {
				t.Fatalf("sent %v, want %v", got, want)
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("sent %v, want %v", got, want)
				}
			}
		}
		expect(notServing)
		d, err := rules.Parse("r.yaml", []byte("domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := rules.NewConfig(d)
		if err != nil {
			t.Fatal(err)
		}
		s.ConfigLoaded(cfg, time.Now())
		expect(notServing, serving)

		mu.Lock()
		storeErr = errors.New("store down")
		mu.Unlock()
		time.Sleep(healthPoll - time.Millisecond)
		expect(notServing, serving)
		time.Sleep(time.Millisecond)
		expect(notServing, serving, notServing)

		mu.Lock()
		storeErr = nil
		mu.Unlock()
		time.Sleep(healthPoll)
		expect(notServing, serving, notServing, serving)

		s.SetDraining()
		expect(notServing, serving, notServing, serving, notServing)
		cancel()
		if err := <-done; err == nil {
			t.Error("Watch ended without an error")
		}
	})
}

// Watch follows the store's health within healthPoll when the default
// failure policy is fail_closed.
func TestHealthWatchStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New(memstore.Config{SweepInterval: -1})
		defer store.Close()
		var down atomic.Bool
		s, err := New(Config{Decide: decide.Config{Limiter: sluice.NewLimiter(store), Failover: decide.Failover{Default: rules.FailClosed}}, StoreHealth: func() error {
			if down.Load() {
				return errors.New("store down")
			}
			return nil
		}})
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := rules.NewConfig()
		if err != nil {
			t.Fatal(err)
		}
		s.ConfigLoaded(cfg, time.Now())
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		stream := &watchStream{ctx: ctx}
		go health{s: s}.Watch(&healthpb.HealthCheckRequest{}, stream)
		synctest.Wait()
		down.Store(true)
		time.Sleep(healthPoll)
		synctest.Wait()
		got := stream.statuses()
		if len(got) != 2 || got[0] != healthpb.HealthCheckResponse_SERVING || got[1] != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("sent %v", got)
		}
	})
}
