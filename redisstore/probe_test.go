package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testsupport/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// TestIdleHealth: a store that decides nothing still sees its Redis die
// and come back (its health, which readiness and sluice_redis_up report):
// it probes Redis itself while no request does. Without the probe an idle
// node reported itself up until enough requests had failed, and, once
// down, until a request found Redis back.
func TestIdleHealth(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	s, err := redisstore.New(redisstore.Config{URL: srv.URL(), Heartbeat: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	redistest.WaitFor(t, "the store up", func() bool { return s.Health() == nil })

	if n := s.Stats().ProbeErrors; n != 0 {
		t.Fatalf("%d failed PINGs with Redis up", n)
	}
	srv.Kill()
	redistest.WaitFor(t, "an idle store to see its Redis gone", func() bool { return s.Health() != nil })
	if s.Stats().ProbeErrors == 0 {
		t.Fatal("the PINGs that opened the breaker are not counted in ProbeErrors")
	}

	srv.Restart()
	redistest.WaitFor(t, "an idle store to see its Redis back", func() bool { return s.Health() == nil })

	srv.Freeze()
	redistest.WaitFor(t, "an idle store to see its Redis silent", func() bool { return s.Health() != nil })
	srv.Thaw()
	redistest.WaitFor(t, "an idle store to see its Redis answer again", func() bool { return s.Health() == nil })
}

// TestForgot: a Redis that lost the function library after the store
// loaded it (restarted empty, flushed) is counted in Stats.Forgot, though
// no call or PING failed: by an idle store's probe, and by a call that
// had to load it again.
func TestForgot(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	s, err := redisstore.New(redisstore.Config{URL: srv.URL(), Heartbeat: -1, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	redistest.WaitFor(t, "the store up", func() bool { return s.Health() == nil })
	if n := s.Stats().Forgot; n != 0 {
		t.Fatalf("Forgot %d with the library loaded", n)
	}
	srv.Cmd("FUNCTION", "FLUSH")
	redistest.WaitFor(t, "an idle store's probe to find the library gone", func() bool { return s.Stats().Forgot == 1 })
	if st := s.Stats(); st.Errors != 0 || st.ProbeErrors != 0 {
		t.Fatalf("Errors %d, ProbeErrors %d: nothing failed", st.Errors, st.ProbeErrors)
	}
	// The probe loaded it again: a call finds it.
	lim := &sluice.Limit{Rate: 10, Period: time.Minute}
	if _, err := sluice.NewLimiter(s).Allow(context.Background(), "k", lim); err != nil {
		t.Fatal(err)
	}
	if n := s.Stats().Forgot; n != 1 {
		t.Fatalf("Forgot %d after a call with the library there, want 1", n)
	}
	srv.Cmd("FUNCTION", "FLUSH")
	if _, err := sluice.NewLimiter(s).Allow(context.Background(), "k", lim); err != nil {
		t.Fatal(err)
	}
	if n := s.Stats().Forgot; n < 2 {
		t.Fatalf("Forgot %d after a call that loaded the library again, want 2", n)
	}
}
