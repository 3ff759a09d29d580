package redistest

import "testing"

func TestSentinel(t *testing.T) {
	t.Parallel()
	ss := Sentinel(t)
	if len(ss.Addrs()) != 3 || ss.MasterName != "mymaster" {
		t.Fatalf("Addrs %v, MasterName %q", ss.Addrs(), ss.MasterName)
	}
	first, replica := ss.Servers()[0], ss.Servers()[1]
	if m := ss.Master(); m != first {
		t.Fatalf("Master = %s, want %s", m.Addr(), first.Addr())
	}
	setReplicated(t, first, "k", "v")
	if got := replica.Cmd("GET", "k"); got != "v" {
		t.Fatalf("GET on the replica = %v", got)
	}

	m := ss.Failover()
	if m != replica || ss.Master() != replica {
		t.Fatalf("after Failover the master is %s, want the replica %s", m.Addr(), replica.Addr())
	}
	if got := m.Cmd("GET", "k"); got != "v" {
		t.Fatalf("GET on the new master = %v", got)
	}
	if got := m.Cmd("SET", "k", "w"); got != "OK" {
		t.Fatalf("SET on the new master = %v", got)
	}
	if _, err := first.Do("SET", "k", "x"); err == nil {
		t.Fatal("SET on the old master, now a replica, succeeded")
	}
}

// TestSentinelKillMaster is the outage path: the master dies, the sentinels
// agree it is down and promote the replica.
func TestSentinelKillMaster(t *testing.T) {
	t.Parallel()
	ss := Sentinel(t, WithPassword("pw"))
	first, replica := ss.Servers()[0], ss.Servers()[1]
	first.Kill()
	if m := ss.WaitFailover(first); m != replica {
		t.Fatalf("new master %s, want %s", m.Addr(), replica.Addr())
	}
	if got := replica.Cmd("SET", "k", "v"); got != "OK" {
		t.Fatalf("SET on the promoted replica = %v", got)
	}
	// The old master comes back; the sentinels stay with the new one.
	first.Restart()
	if m := ss.Master(); m != replica {
		t.Fatalf("after the old master's restart the sentinels report %s", m.Addr())
	}
}

func TestSentinelTLSUser(t *testing.T) {
	t.Parallel()
	ss := Sentinel(t, WithTLS(), WithUser("sluice", "pw"))
	if got := ss.Master().Cmd("ACL", "WHOAMI"); got != "sluice" {
		t.Fatalf("ACL WHOAMI = %v", got)
	}
	if got := ss.Sentinels()[0].Cmd("PING"); got != "PONG" {
		t.Fatalf("sentinel PING over TLS = %v", got)
	}
}
