package redishash

import (
	"context"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

// TestDownRedisAnswers: with Redis killed, each call fails within its
// bound though its context has none (the client retries a read on a lost
// connection until its context ends: the dashboard's cluster-wide top
// keys hung while Redis was down).
func TestDownRedisAnswers(t *testing.T) {
	srv := redistest.Standalone(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := New(func() (rueidis.Client, error) { return c, nil }, "h")
	ctx := context.Background()
	if err := h.Set(ctx, "f", "v"); err != nil {
		t.Fatal(err)
	}
	if m, err := h.All(ctx); err != nil || m["f"] != "v" {
		t.Fatalf("All: %v %v", m, err)
	}
	srv.Kill()
	for name, call := range map[string]func() error{
		"All":    func() error { _, err := h.All(ctx); return err },
		"Set":    func() error { return h.Set(ctx, "f", "w") },
		"Delete": func() error { return h.Delete(ctx, "f") },
	} {
		start := time.Now()
		done := make(chan error, 1)
		go func() { done <- call() }()
		select {
		case err := <-done:
			if took := time.Since(start); err == nil || took > callTimeout+time.Second {
				t.Errorf("%s with Redis down: %v after %s, want an error within %s", name, err, took.Round(time.Millisecond), callTimeout)
			}
		case <-time.After(callTimeout + 5*time.Second):
			t.Errorf("%s with Redis down: no answer after %s, want an error within %s", name, time.Since(start).Round(time.Millisecond), callTimeout)
		}
	}
}
