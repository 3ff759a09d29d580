package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/internal/edges/loadgen"
)

func TestBench(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	loadgen.RegisterNullServer(s)
	go s.Serve(lis)
	defer s.Stop()
	addr := lis.Addr().String()

	code, out, errOut := runCmd(t, "", "bench", "--target", addr, "--requests", "300", "--duration", "0", "--warmup", "0", "--keys", "10", "--hot", "0.5")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"requests 300 in", "ok 300", "p99.9", "hot key"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	code, out, errOut = runCmd(t, "", "bench", "--target", addr, "--json", "--duration", "200ms", "--warmup", "50ms", "--concurrency", "4", "--connections", "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep loadgen.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	if rep.Requests == 0 || rep.OK != rep.Requests || rep.RPS <= 0 || rep.P99US <= 0 || rep.Connections != 2 {
		t.Errorf("report %+v", rep)
	}

	for _, args := range [][]string{
		{"bench", "--mode", "udp"},
		{"bench", "--hot", "2"},
		{"bench", "--duration", "0"},
		{"bench", "extra"},
	} {
		if code, _, _ := runCmd(t, "", args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
	if code, _, _ := runCmd(t, "", "bench", "--help"); code != 0 {
		t.Errorf("--help: exit %d", code)
	}
}

func TestNullServerCommand(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan int)
	go func() {
		done <- run(ctx, []string{"nullserver", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, strings.NewReader(""), io.Discard, pw)
		pw.Close()
	}()
	addrs := map[string]string{}
	sc := bufio.NewScanner(pr)
	for len(addrs) < 2 && sc.Scan() {
		// "nullserver: gRPC on 127.0.0.1:PORT"
		if f := strings.Fields(sc.Text()); len(f) == 4 {
			addrs[f[1]] = f[3]
		}
	}
	go io.Copy(io.Discard, pr)
	for _, tc := range []struct{ mode, proto string }{{"grpc", "gRPC"}, {"json", "HTTP"}} {
		code, out, errOut := runCmd(t, "", "bench", "--mode", tc.mode, "--target", addrs[tc.proto], "--requests", "100", "--duration", "0", "--warmup", "0", "--json")
		if code != 0 {
			t.Fatalf("%s against %v: exit %d: %s", tc.mode, addrs, code, errOut)
		}
		var rep loadgen.Report
		if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.OK != 100 {
			t.Errorf("%s: %s %v", tc.mode, out, err)
		}
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("nullserver exit %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nullserver did not stop")
	}
	if code, _, _ := runCmd(t, "", "nullserver", "--grpc-addr", "", "--http-addr", ""); code != 2 {
		t.Errorf("nothing to serve: exit %d, want 2", code)
	}
}
