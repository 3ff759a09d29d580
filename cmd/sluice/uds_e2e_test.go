package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestServeE2EUnixSocket: with envoy-rl's GRPC_UDS the gRPC listener is a
// Unix socket, answered by a real gRPC client; a second sluice on the same
// socket refuses to start while the first serves; a socket left by a
// killed process is taken over.
func TestServeE2EUnixSocket(t *testing.T) {
	beside(t)
	// Short: a socket path has a limit of about 100 bytes.
	dir, err := os.MkdirTemp("", "uds")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "rl.sock")
	rules := filepath.Join(dir, "rules.yaml")
	writeRules(t, rules, dayRule("uds", "k", 1))
	env := []string{"GRPC_UDS=" + sock, "GRPC_HOST=127.0.0.1", "GRPC_PORT=1"}

	call := func() string {
		t.Helper()
		conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
		defer cancel()
		resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "uds", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", "v")}})
		if err != nil {
			t.Fatalf("over the Unix socket: %v", err)
		}
		return codesOf(resp)
	}

	first := launch(t, env, "--config", rules)
	first.waitReady()
	first.waitLog(`"listener":"grpc"`, sock)
	if got := call(); got != "OK:OK" {
		t.Errorf("first request: %s, want OK:OK", got)
	}
	second := launch(t, env, "--config", rules)
	if code := second.wait(); code == 0 || !strings.Contains(second.log(), "a process is serving on it") {
		t.Errorf("a second sluice on a socket in use: exit %d\n%s", code, second.log())
	}
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.wait()
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("the killed process left no socket file to take over: %v", err)
	}
	third := launch(t, env, "--config", rules)
	third.waitReady()
	// The embedded store's counts died with the first process.
	if got := call(); got != "OK:OK" {
		t.Errorf("after taking over the socket: %s, want OK:OK", got)
	}
	if got := call(); got != "OVER_LIMIT:OVER_LIMIT" {
		t.Errorf("second request to the third sluice: %s, want OVER_LIMIT:OVER_LIMIT", got)
	}
	if third.stop(syscall.SIGTERM) != 0 {
		t.Errorf("the third sluice did not stop cleanly:\n%s", third.log())
	}
	deadline := time.Now().Add(e2eWait)
	for {
		if _, err := os.Stat(sock); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the socket file stayed after a clean stop")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
