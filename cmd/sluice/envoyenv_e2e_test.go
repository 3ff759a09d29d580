package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestEnvoyRLStartRefused: the binary started as /bin/ratelimit, with
// envoy-rl's environment and no arguments as Envoy Gateway runs it, exits
// 1 before it listens when a variable asks for what it would not do:
// GRPC_SERVER_USE_TLS=true with no certificate, key or CA (it served
// plain text), an unknown REDIS_TYPE or CONFIG_TYPE (accepted), REDIS_URL
// host:port without REDIS_SOCKET_TYPE (a message about unix:// URLs),
// REDIS_TIMEOUT without its unit (a bare "parse error"). Each error names
// the variable and what it takes.
func TestEnvoyRLStartRefused(t *testing.T) {
	bin := sluiceBinary(t)
	dir := t.TempDir()
	ratelimit := binAsRatelimit(t, bin, dir)
	if err := os.MkdirAll(filepath.Join(dir, "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeRules(t, filepath.Join(dir, "config", "rules.yaml"), dayRule("api", "user", 3))
	base := []string{"PATH=" + os.Getenv("PATH"), "RUNTIME_ROOT=" + dir, "RUNTIME_SUBDIRECTORY=.", "RUNTIME_APPDIRECTORY=config",
		"HOST=127.0.0.1", "PORT=" + freePort(t), "GRPC_HOST=127.0.0.1", "GRPC_PORT=" + freePort(t), "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + freePort(t)}
	for _, c := range []struct {
		env  []string
		want []string
	}{
		{[]string{"GRPC_SERVER_USE_TLS=true"}, []string{"GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"}},
		{[]string{"REDIS_TYPE=bogus", "REDIS_URL=127.0.0.1:1", "REDIS_SOCKET_TYPE=tcp"}, []string{`REDIS_TYPE="bogus": not one of single, sentinel, cluster`}},
		{[]string{"CONFIG_TYPE=bogus"}, []string{`CONFIG_TYPE="bogus": not one of FILE, GRPC_XDS_SOTW`}},
		{[]string{"REDIS_URL=127.0.0.1:6390"}, []string{`REDIS_URL="127.0.0.1:6390" with REDIS_SOCKET_TYPE unset`, "set REDIS_SOCKET_TYPE=tcp"}},
		{[]string{"REDIS_URL=garbage", "REDIS_AUTH=s3cretpassw0rd"}, []string{`REDIS_URL="garbage"`, "REDIS_SOCKET_TYPE"}},
		{[]string{"REDIS_URL=127.0.0.1:1", "REDIS_SOCKET_TYPE=tcp", "REDIS_TIMEOUT=5"}, []string{`REDIS_TIMEOUT="5"`, "5s"}},
	} {
		cmd := exec.Command(ratelimit)
		cmd.Env = append(append([]string{}, base...), c.env...)
		done := make(chan struct{})
		var out []byte
		var err error
		go func() { out, err = cmd.CombinedOutput(); close(done) }()
		select {
		case <-done:
		case <-time.After(e2eWait):
			cmd.Process.Kill()
			<-done
			t.Errorf("%v: still running after %s:\n%s", c.env, e2eWait, out)
			continue
		}
		log := string(out)
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
			t.Errorf("%v: %v, want exit status 1:\n%s", c.env, err, log)
		}
		for _, w := range append(c.want, "sluice serve: ") {
			if !strings.Contains(log, w) {
				t.Errorf("%v: the log lacks %q:\n%s", c.env, w, log)
			}
		}
		if strings.Contains(log, "listening") || strings.Contains(log, "s3cretpassw0rd") {
			t.Errorf("%v: listened, or showed the password:\n%s", c.env, log)
		}
	}
}
