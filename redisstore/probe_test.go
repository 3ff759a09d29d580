package redisstore_test

import (
	"testing"

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
