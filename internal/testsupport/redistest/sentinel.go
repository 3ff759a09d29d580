package redistest

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"
)

const (
	sentinelReadyTimeout    = 30 * time.Second // until the sentinels agree
	sentinelFailoverTimeout = 30 * time.Second // until a new master is reported
	sentinelCount           = 3
)

// SentinelSetup is one master, one replica and three sentinels monitoring
// them, started by [Sentinel].
type SentinelSetup struct {
	MasterName string // the name the sentinels monitor the master under

	t         testing.TB
	servers   []*Server // the data servers: the first master, then its replica
	sentinels []*Server
}

// Sentinel starts a master and a replica (redis-server, no persistence),
// waits until the replica is in sync, then starts three redis-sentinel
// processes monitoring the master as "mymaster" with a quorum of 2, and
// waits until each of them reports the master, knows the replica and
// knows the two other sentinels. The sentinels run with
// down-after-milliseconds 1000 and failover-timeout 3000, so a killed
// master is replaced within a few seconds, and two failovers of one setup
// must be at least 6 seconds apart. Options apply to the data servers
// (WithPassword and WithUser: the sentinels authenticate with them); the
// sentinels themselves need no AUTH unless WithSentinelPassword, and with
// WithTLS they serve TLS too.
func Sentinel(t testing.TB, opts ...Option) *SentinelSetup {
	t.Helper()
	Require(t)
	o := newOptions(t, opts)
	ss := &SentinelSetup{MasterName: "mymaster", t: t}

	master, err := launch(t, o, "sentinel master", "redis-server", func(port int, dir string) [][]string {
		return o.dataConfig(port, dir, nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	mport := strconv.Itoa(master.Port())
	replica, err := launch(t, o, "sentinel replica", "redis-server", func(port int, dir string) [][]string {
		return o.dataConfig(port, dir, [][]string{{"replicaof", "127.0.0.1", mport}})
	})
	if err != nil {
		t.Fatal(err)
	}
	ss.servers = []*Server{master, replica}
	// Sentinels learn of replicas from the master's INFO, which they read at
	// once and then every 10 seconds: start them once the replica is
	// attached, so that they know it from the start.
	if err := waitUntil(startTimeout, replica.proc.done(), func() error {
		return replicaOf(replica, master)
	}); err != nil {
		t.Fatalf("redistest: replica did not sync: %v", err)
	}

	so := *o
	so.user, so.password, so.config = "", o.sentinel, nil
	for i := range sentinelCount {
		s, err := launch(t, &so, fmt.Sprintf("sentinel %d", i), "redis-sentinel", func(port int, dir string) [][]string {
			l := [][]string{
				{"bind", "127.0.0.1"},
				{"daemonize", "no"},
				{"dir", dir},
				{"logfile", dir + "/redis.log"},
			}
			l = append(l, o.tlsLines(port)...)
			name := ss.MasterName
			l = append(l,
				[]string{"sentinel", "monitor", name, "127.0.0.1", mport, "2"},
				[]string{"sentinel", "down-after-milliseconds", name, "1000"},
				[]string{"sentinel", "failover-timeout", name, "3000"},
				[]string{"sentinel", "parallel-syncs", name, "1"})
			if o.password != "" {
				l = append(l, []string{"sentinel", "auth-pass", name, o.password})
			}
			if o.user != "" {
				l = append(l, []string{"sentinel", "auth-user", name, o.user})
			}
			if o.sentinel != "" {
				l = append(l, []string{"requirepass", o.sentinel})
			}
			return l
		})
		if err != nil {
			t.Fatal(err)
		}
		ss.sentinels = append(ss.sentinels, s)
	}

	err = waitUntil(sentinelReadyTimeout, nil, func() error {
		for _, s := range ss.sentinels {
			if err := ss.sentinelReady(s, master); err != nil {
				return fmt.Errorf("%s: %w", s.proc.name, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("redistest: sentinels do not agree: %v", err)
	}
	return ss
}

// replicaOf reports nil when r is a replica of m with its link up.
func replicaOf(r, m *Server) error {
	port, err := r.info("replication", "master_port")
	if err != nil {
		return err
	}
	if port != strconv.Itoa(m.Port()) {
		return fmt.Errorf("%s replicates port %s, not %d", r.Addr(), port, m.Port())
	}
	link, err := r.info("replication", "master_link_status")
	if err != nil {
		return err
	}
	if link != "up" {
		return fmt.Errorf("%s: master_link_status %s", r.Addr(), link)
	}
	return nil
}

func (ss *SentinelSetup) sentinelReady(s, master *Server) error {
	if addr, err := ss.masterAddr(s); err != nil || addr != master.Addr() {
		return fmt.Errorf("master %q (%v), want %s", addr, err, master.Addr())
	}
	v, err := s.Do("SENTINEL", "REPLICAS", ss.MasterName)
	if err != nil {
		return err
	}
	if r, _ := v.([]any); len(r) < len(ss.servers)-1 {
		return fmt.Errorf("knows %d replicas", len(r))
	}
	v, err = s.Do("SENTINEL", "SENTINELS", ss.MasterName)
	if err != nil {
		return err
	}
	if others, _ := v.([]any); len(others) != sentinelCount-1 {
		return fmt.Errorf("knows %d other sentinels", len(others))
	}
	return nil
}

// masterAddr asks sentinel s for the master's host:port.
func (ss *SentinelSetup) masterAddr(s *Server) (string, error) {
	v, err := s.Do("SENTINEL", "GET-MASTER-ADDR-BY-NAME", ss.MasterName)
	if err != nil {
		return "", err
	}
	a, _ := v.([]any)
	if len(a) != 2 {
		return "", fmt.Errorf("GET-MASTER-ADDR-BY-NAME answered %v", v)
	}
	host, _ := a[0].(string)
	port, _ := a[1].(string)
	return net.JoinHostPort(host, port), nil
}

// Addrs are the sentinels' host:port addresses.
func (ss *SentinelSetup) Addrs() []string {
	a := make([]string, len(ss.sentinels))
	for i, s := range ss.sentinels {
		a[i] = s.Addr()
	}
	return a
}

// Sentinels are the three sentinel processes; Kill and Restart work on
// them as on any server.
func (ss *SentinelSetup) Sentinels() []*Server { return ss.sentinels }

// Servers are the data servers: the first master, then its replica.
func (ss *SentinelSetup) Servers() []*Server { return ss.servers }

// Master is the data server the first running sentinel reports as master.
func (ss *SentinelSetup) Master() *Server {
	ss.t.Helper()
	for _, s := range ss.sentinels {
		if !s.Running() {
			continue
		}
		addr, err := ss.masterAddr(s)
		if err != nil {
			ss.t.Fatalf("redistest: %s: %v", s.proc.name, err)
		}
		if m := ss.server(addr); m != nil {
			return m
		}
		ss.t.Fatalf("redistest: sentinels report master %s, not one of ours", addr)
	}
	ss.t.Fatal("redistest: no sentinel running")
	return nil
}

func (ss *SentinelSetup) server(addr string) *Server {
	for _, s := range ss.servers {
		if s.Addr() == addr {
			return s
		}
	}
	return nil
}

// Failover forces a failover with SENTINEL FAILOVER and waits, at most 30
// seconds, until every running sentinel reports the replica as the new
// master and it answers role:master. Then it points the old master at the
// new one with REPLICAOF, which the sentinels would do themselves only
// after a fixed 8 seconds, and waits until it is in sync. It returns the
// new master. Call it from the test's goroutine.
func (ss *SentinelSetup) Failover() *Server {
	ss.t.Helper()
	old := ss.Master()
	var err error
	for _, s := range ss.sentinels {
		if s.Running() {
			_, err = s.Do("SENTINEL", "FAILOVER", ss.MasterName)
			break
		}
	}
	if err != nil {
		ss.t.Fatalf("redistest: SENTINEL FAILOVER: %v", err)
	}
	m := ss.waitNewMaster(old)
	old.Cmd("REPLICAOF", "127.0.0.1", m.Port())
	if err := waitUntil(sentinelFailoverTimeout, old.proc.done(), func() error { return replicaOf(old, m) }); err != nil {
		ss.t.Fatalf("redistest: old master does not follow the new one: %v", err)
	}
	return m
}

// WaitFailover waits, at most 30 seconds, until every running sentinel
// reports a master other than old, and that server answers role:master:
// what follows killing the master (old.Kill()). It returns the new master.
func (ss *SentinelSetup) WaitFailover(old *Server) *Server {
	ss.t.Helper()
	return ss.waitNewMaster(old)
}

func (ss *SentinelSetup) waitNewMaster(old *Server) *Server {
	ss.t.Helper()
	var master *Server
	err := waitUntil(sentinelFailoverTimeout, nil, func() error {
		master = nil
		for _, s := range ss.sentinels {
			if !s.Running() {
				continue
			}
			addr, err := ss.masterAddr(s)
			if err != nil {
				return err
			}
			m := ss.server(addr)
			switch {
			case m == nil:
				return fmt.Errorf("%s reports unknown master %s", s.proc.name, addr)
			case m == old:
				return fmt.Errorf("%s still reports %s", s.proc.name, addr)
			case master != nil && m != master:
				return fmt.Errorf("sentinels disagree: %s and %s", master.Addr(), m.Addr())
			}
			master = m
		}
		if master == nil {
			return errors.New("no sentinel running")
		}
		if role, err := master.info("replication", "role"); err != nil || role != "master" {
			return fmt.Errorf("new master %s has role %q (%v)", master.Addr(), role, err)
		}
		return nil
	})
	if err != nil {
		ss.t.Fatalf("redistest: failover from %s: %v", old.Addr(), err)
	}
	return master
}
