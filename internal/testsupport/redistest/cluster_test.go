package redistest

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

func TestCluster(t *testing.T) {
	t.Parallel()
	c := Cluster(t, 3, 0)
	if len(c.Nodes()) != 3 || len(c.Addrs()) != 3 {
		t.Fatalf("%d nodes, want 3", len(c.Nodes()))
	}
	for _, s := range c.Nodes() {
		if role, err := s.info("replication", "role"); err != nil || role != "master" {
			t.Fatalf("%s: role %q (%v), want master", s.Addr(), role, err)
		}
	}

	// The key lives on the node that owns its slot; any other node answers
	// MOVED to it, and a client that follows the redirect reads the value.
	key := "user:{kristie}"
	owner := c.Owner(key)
	if got := owner.Cmd("SET", key, "v"); got != "OK" {
		t.Fatalf("SET on the owner = %v", got)
	}
	slot := c.Slot(key)
	if slot != c.Slot("other:{kristie}") {
		t.Fatal("keys with one hash tag in different slots")
	}
	moved := 0
	for _, s := range c.Nodes() {
		if s == owner {
			continue
		}
		_, err := s.Do("GET", key)
		var e Error
		if !errors.As(err, &e) {
			t.Fatalf("GET on a node that does not own the slot: err = %v, want MOVED", err)
		}
		kind, addr, ok := redirect(e)
		if !ok || kind != "MOVED" || addr != owner.Addr() || !strings.HasPrefix(string(e), "MOVED "+itoa(slot)+" ") {
			t.Fatalf("GET elsewhere: %q, want MOVED %d %s", e, slot, owner.Addr())
		}
		moved++
	}
	if moved != 2 {
		t.Fatalf("%d MOVED replies, want 2", moved)
	}
	if got := c.Cmd("GET", key); got != "v" {
		t.Fatalf("GET through redirects = %v", got)
	}
	// Keys spread over every master.
	owners := map[*Server]bool{}
	for i := range 30 {
		owners[c.Owner("k"+itoa(i))] = true
	}
	if len(owners) != 3 {
		t.Fatalf("30 keys on %d masters, want 3", len(owners))
	}

	// A killed master takes its slots down; restarted, it rejoins with its
	// identity and the cluster is whole again (empty: no persistence).
	c.Kill(0)
	c.Restart(0)
	k := ""
	for i := 0; k == ""; i++ {
		if c.Owner("k"+itoa(i)) == c.Nodes()[0] {
			k = "k" + itoa(i)
		}
	}
	if got := c.Cmd("SET", k, 1); got != "OK" {
		t.Fatalf("SET after restart = %v", got)
	}
}

// TestClusterFailover kills a master of a cluster with replicas: its
// replica takes over its slots; the old master comes back as a replica.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	c := Cluster(t, 3, 1)
	if len(c.Nodes()) != 6 {
		t.Fatalf("%d nodes, want 6", len(c.Nodes()))
	}
	key := "hot"
	old := c.Owner(key)
	setReplicated(t, old, key, "v")
	i := indexOf(c.Nodes(), old)
	c.Kill(i)
	c.WaitHealthy()
	now := c.Owner(key)
	if now == old {
		t.Fatal("the killed master still owns the key's slot")
	}
	if got := c.Cmd("GET", key); got != "v" {
		t.Fatalf("GET after failover = %v, want the replicated value", got)
	}
	c.Restart(i)
	if role, err := old.info("replication", "role"); err != nil || role != "slave" {
		t.Fatalf("restarted old master: role %q (%v), want slave", role, err)
	}
}

func TestClusterAuthTLS(t *testing.T) {
	t.Parallel()
	c := Cluster(t, 3, 0, WithUser("sluice", "pw"), WithTLS())
	c.Cmd("SET", "a", 1)
	c.Cmd("SET", "b", 2)
	if got := c.Cmd("GET", "b"); got != "2" {
		t.Fatalf("GET = %v", got)
	}
}

func TestRedirect(t *testing.T) {
	for in, want := range map[Error][3]string{
		"MOVED 3999 127.0.0.1:6381": {"MOVED", "127.0.0.1:6381", "true"},
		"ASK 1 127.0.0.1:7000":      {"ASK", "127.0.0.1:7000", "true"},
		"ERR wrong":                 {"", "", "false"},
		"MOVED 1":                   {"", "", "false"},
	} {
		k, a, ok := redirect(in)
		if got := [3]string{k, a, boolString(ok)}; got != want {
			t.Errorf("redirect(%q) = %v, want %v", in, got, want)
		}
	}
}

func boolString(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

func indexOf(nodes []*Server, s *Server) int {
	for i, n := range nodes {
		if n == s {
			return i
		}
	}
	return -1
}

func itoa(i int) string { return strconv.Itoa(i) }

// setReplicated sets key on master and waits until a replica has it. WAIT
// counts the writes of its own connection, so both go on one.
func setReplicated(t *testing.T, master *Server, key, value string) {
	t.Helper()
	conn, err := master.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Do("SET", key, value); err != nil {
		t.Fatal(err)
	}
	if got, err := conn.Do("WAIT", 1, 5000); err != nil || got != int64(1) {
		t.Fatalf("WAIT = %v (%v), want 1 replica", got, err)
	}
}
