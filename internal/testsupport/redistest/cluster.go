package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	clusterCreateTimeout = 60 * time.Second // redis-cli --cluster create
	clusterReadyTimeout  = 30 * time.Second // until every node reports cluster_state:ok
	clusterSlots         = 16384
	maxRedirects         = 5
)

// ClusterSetup is a Redis Cluster of local redis-server processes started
// by [Cluster].
type ClusterSetup struct {
	t      testing.TB
	nodes  []*Server
	dialer Dialer
}

// Cluster starts masters*(1+replicasPerMaster) redis-server processes with
// cluster-enabled on free loopback ports (their bus ports, port+10000, free
// too), joins them with redis-cli --cluster create, and waits until every
// node reports cluster_state:ok with all 16384 slots covered and every
// replica in sync. masters must be at least 3 (a redis-cli rule). The nodes
// run with cluster-node-timeout 1000 (ms), so a failover after a master is
// killed takes a few seconds; WithConfig overrides it. Options apply to
// every node (WithTLS: the bus and replication use TLS too).
func Cluster(t testing.TB, masters, replicasPerMaster int, opts ...Option) *ClusterSetup {
	t.Helper()
	Require(t)
	if masters < 3 || replicasPerMaster < 0 {
		t.Fatalf("redistest: Cluster(%d, %d): need at least 3 masters and no negative replicas", masters, replicasPerMaster)
	}
	o := newOptions(t, opts)
	c := &ClusterSetup{t: t, dialer: o.dialer()}
	role := [][]string{
		{"cluster-enabled", "yes"},
		{"cluster-config-file", "nodes.conf"},
		{"cluster-node-timeout", "1000"},
		{"cluster-replica-validity-factor", "0"},
	}
	for i := range masters * (1 + replicasPerMaster) {
		s, err := launch(t, o, fmt.Sprintf("cluster node %d", i), "redis-server", func(port int, dir string) [][]string {
			return o.dataConfig(port, dir, role)
		})
		if err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, s)
	}

	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicasPerMaster), "--cluster-yes")
	if err := runCLI(t, o, args...); err != nil {
		t.Fatal(err)
	}
	c.WaitHealthy()
	return c
}

// runCLI runs redis-cli with the options' credentials and TLS settings,
// with a deadline; on failure the error holds its output.
func runCLI(t testing.TB, o *options, args ...string) error {
	bin, err := binary("redis-cli")
	if err != nil {
		return err
	}
	var pre []string
	if o.password != "" {
		if o.user != "" {
			pre = append(pre, "--user", o.user)
		}
		pre = append(pre, "--pass", o.password, "--no-auth-warning")
	}
	if o.certs != nil {
		pre = append(pre, "--tls", "--cacert", o.certs.CAFile, "--cert", o.certs.CertFile, "--key", o.certs.KeyFile)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterCreateTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append(pre, args...)...)
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	logPath := filepath.Join(t.TempDir(), "redis-cli.log")
	os.WriteFile(logPath, out, 0o644)
	if err != nil {
		return fmt.Errorf("redistest: redis-cli %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Nodes are the cluster's servers, in the order they were started (which
// is not their role: after a failover a replica may be a master). Kill and
// Restart of a node work as for Standalone; [ClusterSetup.Restart] also
// waits for the cluster to be healthy again.
func (c *ClusterSetup) Nodes() []*Server { return c.nodes }

// Addrs are the nodes' host:port addresses, in the order of Nodes.
func (c *ClusterSetup) Addrs() []string {
	a := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		a[i] = s.Addr()
	}
	return a
}

// Kill ends node i with SIGKILL.
func (c *ClusterSetup) Kill(i int) {
	c.t.Helper()
	c.nodes[i].Kill()
}

// Restart starts node i again on its port, with its cluster identity, and
// waits until the cluster is healthy ([ClusterSetup.WaitHealthy]).
func (c *ClusterSetup) Restart(i int) {
	c.t.Helper()
	c.nodes[i].Restart()
	c.WaitHealthy()
}

// WaitHealthy waits, at most 30 seconds, until every running node reports
// cluster_state:ok, all 16384 slots ok, and knows every node, and every
// running replica's link to its master is up. It fails the test otherwise;
// call it from the test's goroutine.
func (c *ClusterSetup) WaitHealthy() {
	c.t.Helper()
	err := waitUntil(clusterReadyTimeout, nil, func() error {
		running := 0
		for _, s := range c.nodes {
			if !s.Running() {
				continue
			}
			running++
			if err := c.nodeHealthy(s); err != nil {
				return fmt.Errorf("%s: %w", s.Addr(), err)
			}
		}
		if running == 0 {
			return errors.New("no node running")
		}
		return nil
	})
	if err != nil {
		c.t.Fatalf("redistest: cluster not healthy: %v", err)
	}
}

func (c *ClusterSetup) nodeHealthy(s *Server) error {
	v, err := s.Do("CLUSTER", "INFO")
	if err != nil {
		return err
	}
	text, _ := v.(string)
	want := map[string]string{
		"cluster_state":          "ok",
		"cluster_slots_assigned": strconv.Itoa(clusterSlots),
		"cluster_slots_ok":       strconv.Itoa(clusterSlots),
		"cluster_known_nodes":    strconv.Itoa(len(c.nodes)),
	}
	for field, w := range want {
		if got, err := infoField(text, field); err != nil || got != w {
			return fmt.Errorf("%s is %q, want %q", field, got, w)
		}
	}
	if role, err := s.info("replication", "role"); err != nil || role != "slave" {
		return err
	}
	if link, err := s.info("replication", "master_link_status"); err != nil || link != "up" {
		return fmt.Errorf("replica's master_link_status is %q (%v)", link, err)
	}
	return nil
}

// Do runs one command on the cluster: on the first running node, then
// wherever MOVED or ASK redirects point (at most 5 hops), as a cluster
// client would.
func (c *ClusterSetup) Do(args ...any) (any, error) {
	addr := ""
	for _, s := range c.nodes {
		if s.Running() {
			addr = s.Addr()
			break
		}
	}
	if addr == "" {
		return nil, errors.New("redistest: no cluster node running")
	}
	asking := false
	for range maxRedirects + 1 {
		v, err := c.doAt(addr, asking, args)
		var e Error
		if !errors.As(err, &e) {
			return v, err
		}
		kind, target, ok := redirect(e)
		if !ok {
			return v, err
		}
		addr, asking = target, kind == "ASK"
	}
	return nil, fmt.Errorf("redistest: more than %d redirects for %v", maxRedirects, args)
}

func (c *ClusterSetup) doAt(addr string, asking bool, args []any) (any, error) {
	conn, err := c.dialer.Dial(addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if asking {
		if _, err := conn.Do("ASKING"); err != nil {
			return nil, err
		}
	}
	return conn.Do(args...)
}

// redirect parses "MOVED 3999 127.0.0.1:6381" and "ASK 3999 127.0.0.1:6381".
func redirect(e Error) (kind, addr string, ok bool) {
	f := strings.Fields(string(e))
	if len(f) != 3 || (f[0] != "MOVED" && f[0] != "ASK") {
		return "", "", false
	}
	return f[0], f[2], true
}

// Cmd runs one command like Do and fails the test on any error. Call it
// from the test's goroutine.
func (c *ClusterSetup) Cmd(args ...any) any {
	c.t.Helper()
	v, err := c.Do(args...)
	if err != nil {
		c.t.Fatalf("redistest: cluster %v: %v", args, err)
	}
	return v
}

// Slot is the cluster slot of key (CLUSTER KEYSLOT, hash tags included).
func (c *ClusterSetup) Slot(key string) int {
	c.t.Helper()
	n, ok := c.Cmd("CLUSTER", "KEYSLOT", key).(int64)
	if !ok {
		c.t.Fatalf("redistest: CLUSTER KEYSLOT %q did not answer an integer", key)
	}
	return int(n)
}

// Owner is the node that serves key now (the master of its slot, as
// CLUSTER SLOTS reports it).
func (c *ClusterSetup) Owner(key string) *Server {
	c.t.Helper()
	slot := c.Slot(key)
	ranges, _ := c.Cmd("CLUSTER", "SLOTS").([]any)
	for _, r := range ranges {
		r, _ := r.([]any)
		if len(r) < 3 {
			continue
		}
		lo, _ := r[0].(int64)
		hi, _ := r[1].(int64)
		master, _ := r[2].([]any)
		if int64(slot) < lo || int64(slot) > hi || len(master) < 2 {
			continue
		}
		port, _ := master[1].(int64)
		for _, s := range c.nodes {
			if int64(s.Port()) == port {
				return s
			}
		}
	}
	c.t.Fatalf("redistest: no node owns slot %d of %q", slot, key)
	return nil
}

// info returns one field of an INFO section.
func (s *Server) info(section, field string) (string, error) {
	v, err := s.Do("INFO", section)
	if err != nil {
		return "", err
	}
	text, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("INFO answered %T", v)
	}
	return infoField(text, field)
}

// infoField finds "field:value" in the text of INFO or CLUSTER INFO.
func infoField(text, field string) (string, error) {
	for line := range strings.SplitSeq(text, "\n") {
		k, v, ok := strings.Cut(strings.TrimRight(line, "\r"), ":")
		if ok && k == field {
			return v, nil
		}
	}
	return "", errors.New("no field " + field)
}
