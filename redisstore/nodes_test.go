package redisstore

import (
	"errors"
	"fmt"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

// TestNodeCount walks nodeCount through the registry's reads at fixed
// times: a count read higher is taken at once, one read lower only once
// every read for a whole ttl has been lower, with no failed heartbeat
// between.
func TestNodeCount(t *testing.T) {
	const ttl = 3 * time.Second
	type ev struct {
		at   time.Duration // the heartbeat's start
		took time.Duration // until its answer
		read int64         // -1: the heartbeat failed
		want int64         // the count in force after it
	}
	fail := int64(-1)
	cases := []struct {
		name string
		evs  []ev
	}{
		{"first read", []ev{{0, 0, 3, 3}}},
		{"a registry that read 0 counts this node", []ev{{0, 0, 0, 1}}},
		{"rises at once", []ev{{0, 0, 3, 3}, {time.Second, 0, 5, 5}}},
		{"falls once read lower for a whole ttl", []ev{
			{0, 0, 3, 3},
			{1 * time.Second, 0, 2, 3},
			{2 * time.Second, 0, 2, 3},
			{3 * time.Second, 0, 2, 3},
			{4*time.Second - time.Millisecond, 0, 2, 3},
			{4 * time.Second, 0, 2, 2},
		}},
		{"falls to the highest read of the wait", []ev{
			{0, 0, 5, 5},
			{1 * time.Second, 0, 1, 5},
			{2 * time.Second, 0, 3, 5},
			{3 * time.Second, 0, 2, 5},
			{4 * time.Second, 0, 1, 3},
			// The wait for 1 starts again with the next lower read.
			{5 * time.Second, 0, 1, 3},
			{7 * time.Second, 0, 1, 3},
			{8 * time.Second, 0, 1, 1},
		}},
		{"a read at the count starts the wait again", []ev{
			{0, 0, 3, 3},
			{1 * time.Second, 0, 2, 3},
			{2 * time.Second, 0, 3, 3},
			{3 * time.Second, 0, 2, 3},
			{5500 * time.Millisecond, 0, 2, 3},
			{6 * time.Second, 0, 2, 2},
		}},
		{"a failed heartbeat starts the wait again", []ev{
			{0, 0, 3, 3},
			{1 * time.Second, 0, 2, 3},
			{2 * time.Second, 0, fail, 3},
			{3 * time.Second, 0, 2, 3},
			{5 * time.Second, 0, 2, 3},
			{6 * time.Second, 0, 2, 2},
		}},
		// Three nodes; Redis killed, restarted from its file with every
		// entry expired, killed again 1 s later: the first node to renew
		// reads 1. Later Redis comes back with the same file.
		{"a restored registry between two outages", []ev{
			{0, 0, 3, 3},
			{1 * time.Second, 0, 3, 3},
			{2 * time.Second, time.Second, fail, 3},
			{3 * time.Second, time.Second, fail, 3},
			{7 * time.Second, 10 * time.Millisecond, 1, 3},
			{8 * time.Second, time.Second, fail, 3},
			{60 * time.Second, 10 * time.Millisecond, 1, 3},
			{61 * time.Second, 0, 3, 3},
		}},
		// The wait runs from the first lower read's answer to the last
		// read's start: a slow first read counts only from its answer.
		{"the wait counts only time Redis answered in", []ev{
			{0, 0, 3, 3},
			{1 * time.Second, 900 * time.Millisecond, 2, 3},
			{4800 * time.Millisecond, 0, 2, 3},
			{4900 * time.Millisecond, 0, 2, 2},
		}},
		{"a clock that goes back is no wait", []ev{
			{10 * time.Second, 0, 3, 3},
			{11 * time.Second, 0, 2, 3},
			{time.Second, 0, 2, 3},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var n nodeCount
			for i, e := range c.evs {
				if e.read == fail {
					n.failed()
				} else {
					n.read(e.read, int64(e.at), int64(e.at+e.took), int64(ttl))
				}
				if n.n != e.want {
					t.Fatalf("event %d (read %d at %s): %d nodes, want %d", i, e.read, e.at, n.n, e.want)
				}
			}
		})
	}
}

// TestHeartbeatCount runs the heartbeat loop on a fake clock against a
// registry whose reads change with time: three nodes, Redis down, back for
// a moment with a restored registry that reads one node, down again, then
// back with two nodes for good. The count stays three until two have been
// read for a whole ttl (3 heartbeats), and the node leaves when stopped.
func TestHeartbeatCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const every = time.Second
		born := time.Now()
		registry := func(at time.Duration) (int64, error) {
			switch {
			case at < 4500*time.Millisecond:
				return 3, nil
			case at < 9500*time.Millisecond, at >= 10500*time.Millisecond && at < 14500*time.Millisecond:
				return 0, errors.New("connection refused")
			case at < 10500*time.Millisecond:
				return 1, nil
			}
			return 2, nil
		}
		stop := make(chan struct{})
		var counts []string
		var left bool
		done := make(chan struct{})
		go func() {
			defer close(done)
			heartbeat(every, stop, func(op string, ttl time.Duration) (int64, error) {
				if ttl != 3*every {
					t.Errorf("ttl %s", ttl)
				}
				if op == "leave" {
					left = true
					return 0, nil
				}
				time.Sleep(10 * time.Millisecond) // a round trip
				return registry(time.Since(born) - 10*time.Millisecond)
			}, func(n, was, read int64) {
				counts = append(counts, fmt.Sprintf("%s:%d", time.Since(born).Truncate(time.Second), n))
			})
		}()
		time.Sleep(20*time.Second + 500*time.Millisecond)
		close(stop)
		<-done
		want := "[0s:3 1s:3 2s:3 3s:3 4s:3 10s:3 15s:3 16s:3 17s:3 18s:3 19s:2 20s:2]"
		if got := fmt.Sprint(counts); got != want {
			t.Errorf("counts after each read\n got %s\nwant %s", got, want)
		}
		if !left {
			t.Error("the node did not leave the registry when stopped")
		}
	})
}

// TestNodeRegistryRestored checks the registry's function on a registry
// written as Redis would restore it: entries that expired while no node
// could call (the registry's last call long ago) are counted one more
// entry life; entries that had expired before the last call, or that
// expire while nodes call, are not.
func TestNodeRegistryRestored(t *testing.T) {
	srv := redistest.Standalone(t)
	ms := func() int64 {
		v := srv.Cmd("TIME").([]any)
		sec, _ := strconv.ParseInt(v[0].(string), 10, 64)
		us, _ := strconv.ParseInt(v[1].(string), 10, 64)
		return sec*1000 + us/1000
	}
	for _, c := range []struct {
		name    string
		entries func(now int64) []any // ZADD's score, member pairs
		want    int                   // the first count the new node reads
		kept    []string
	}{
		{"restored: the last call 5s ago, two entries expired since", func(now int64) []any {
			return []any{now - 5000, "", now - 3000, "a", now - 2000, "b"}
		}, 3, []string{"a", "b"}},
		{"an entry expired before the last call stays expired", func(now int64) []any {
			return []any{now - 10000, "old", now - 5000, "", now - 2000, "b"}
		}, 2, []string{"b"}},
		{"the last call recent: an expired entry is dropped", func(now int64) []any {
			return []any{now + 60000, "", now - 1000, "a"}
		}, 1, nil},
		{"no record of the last call (a registry of an older version)", func(now int64) []any {
			return []any{now - 1000, "a"}
		}, 1, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv.Cmd("DEL", "sluice:nodes")
			now := ms()
			srv.Cmd(append([]any{"ZADD", "sluice:nodes"}, c.entries(now)...)...)
			s := newTestStore(t, Config{URL: srv.URL(), Prefix: "sluice:", Heartbeat: time.Second}, nil)
			redistest.WaitFor(t, "the first count", func() bool { return s.Nodes() != 0 })
			if got := s.Nodes(); got != c.want {
				t.Errorf("the node counted %d, want %d", got, c.want)
			}
			for _, id := range c.kept {
				score, err := strconv.ParseInt(fmt.Sprint(srv.Cmd("ZSCORE", "sluice:nodes", id)), 10, 64)
				if err != nil || score < now+3000 {
					t.Errorf("entry %s scored %d (%v), want renewed for one more life, from %d", id, score, err, now+3000)
				}
			}
			if ttl := srv.Cmd("PTTL", "sluice:nodes").(int64); ttl < 86400000-60000 {
				t.Errorf("the registry expires in %d ms, want a day", ttl)
			}
			s.Close()
		})
	}
}
