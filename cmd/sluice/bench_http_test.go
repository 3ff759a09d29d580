package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/edges/loadgen"
)

// startServing runs a command that prints "NAME: HTTP on ADDR" until the
// test ends, and returns ADDR.
func startServing(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan int)
	go func() {
		done <- run(ctx, args, strings.NewReader(""), io.Discard, pw)
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("%v: exit %d", args, code)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("%v did not stop", args)
		}
	})
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		if _, addr, ok := strings.Cut(sc.Text(), ": HTTP on "); ok {
			go io.Copy(io.Discard, pr)
			return addr
		}
	}
	t.Fatalf("%v did not start", args)
	return ""
}

func TestPlainProxyCommand(t *testing.T) {
	api := startServing(t, "nullapi", "--listen", "127.0.0.1:0")
	front := startServing(t, "plainproxy", "--listen", "127.0.0.1:0", "--upstream", "http://"+api)
	for _, target := range []string{api, front} {
		code, out, errOut := runCmd(t, "", "bench", "--mode", "http", "--target", target, "--path", "/items/1?q=2",
			"--header", "X-Key", "--keys", "10", "--requests", "200", "--duration", "0", "--warmup", "0", "--json")
		if code != 0 {
			t.Fatalf("bench %s: exit %d: %s", target, code, errOut)
		}
		var rep loadgen.Report
		if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.OK != 200 || rep.Path != "/items/1?q=2" || rep.Header != "X-Key" {
			t.Errorf("bench %s: %s %v", target, out, err)
		}
	}
	for _, args := range [][]string{
		{"plainproxy"},
		{"plainproxy", "--upstream", "ftp://x"},
		{"plainproxy", "--upstream", "http://127.0.0.1:1", "extra"},
		{"nullapi", "extra"},
		{"bench", "--mode", "http", "--path", "nope"},
	} {
		if code, _, _ := runCmd(t, "", args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}
