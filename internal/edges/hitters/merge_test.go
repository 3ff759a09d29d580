package hitters

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/zeebo/xxh3"

	"github.com/sluicehq/sluice/internal/stores/redishash"
	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

// TestMerge: three nodes see different slices of the same traffic; their
// snapshots merged give each key its total within [Low, High], and the
// keys heavy across the nodes, light on each, on top.
func TestMerge(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	truth := map[string]uint64{}
	var snaps []Snapshot
	for n := range 3 {
		tr := New(Config{Counters: 16, Now: func() time.Time { return now }})
		add := func(k string, c int) {
			for range c {
				tr.Add("api.user", xxh3.HashString(k), Denied, name(k))
				truth[k]++
			}
		}
		add("user=spread", 40) // 40 on every node: 120 in all
		add(fmt.Sprint("user=local", n), 60)
		for i := range 200 { // noise: a key each
			add("user=noise"+strconv.Itoa(n*1000+i), 1)
		}
		snaps = append(snaps, tr.Snapshot(fmt.Sprint("n", n), 5))
	}
	top, hits := Merge(snaps, "api.user", Denials, false, 3)
	if hits != 3*(40+60+200) {
		t.Fatalf("%d hits merged, want %d", hits, 3*300)
	}
	if top[0].Key != "user=spread" {
		t.Errorf("top: %v, want user=spread first (120 in all, at most 60 for any other)", top)
	}
	for _, it := range top {
		if tc := truth[it.Key]; tc < it.Low || tc > it.High {
			t.Errorf("%s: true %d outside [%d, %d]", it.Key, tc, it.Low, it.High)
		}
	}
}

// TestShared: two nodes publish to a real redis-server; either reads
// both, and a snapshot older than MaxAge is dropped.
func TestShared(t *testing.T) {
	srv := redistest.Standalone(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	client := func() (rueidis.Client, error) { return c, nil }
	hash := func(prefix string) Hash { return redishash.New(client, prefix+"hitters") }
	now := time.Unix(1_800_000_000, 0)
	prefix := fmt.Sprintf("h%d:", time.Now().UnixNano())
	var shares []*Shared
	for n := range 2 {
		tr := New(Config{Now: func() time.Time { return now }})
		for range 10 + n {
			tr.Add("api.user", 1, Denied, name("user=mallory"))
		}
		shares = append(shares, NewShared(tr, hash(prefix), fmt.Sprint("node", n), 10))
	}
	for _, s := range shares {
		if err := s.Publish(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	snaps, err := shares[0].Snapshots(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	top, hits := Merge(snaps, "api.user", Denials, false, 5)
	if len(snaps) != 2 || hits != 21 || len(top) != 1 || top[0].High != 21 {
		t.Fatalf("%d snapshots, %d hits, top %v; want 2, 21, mallory with 21", len(snaps), hits, top)
	}
	// A node gone quiet: its snapshot ages out.
	old, _ := json.Marshal(Snapshot{Node: "gone", At: now.Add(-MaxAge - time.Second)})
	c.Do(context.Background(), c.B().Hset().Key(prefix+"hitters").FieldValue().FieldValue("gone", string(old)).Build())
	if snaps, _ := shares[1].Snapshots(context.Background()); len(snaps) != 2 {
		t.Fatalf("%d snapshots with one stale, want 2", len(snaps))
	}
	if n, _ := c.Do(context.Background(), c.B().Hlen().Key(prefix+"hitters").Build()).AsInt64(); n != 2 {
		t.Errorf("the stale snapshot is still in Redis: %d fields", n)
	}
}

// TestSnapshotRules: every rule of the snapshots and of more, once each,
// sorted.
func TestSnapshotRules(t *testing.T) {
	snaps := []Snapshot{
		{Node: "a", Lists: []SnapshotList{{Rule: "api.user"}, {Rule: "api.user", Kind: Denials}, {Rule: "api.path"}}},
		{Node: "b", Lists: []SnapshotList{{Rule: "edge.ip"}, {Rule: "api.path"}}},
	}
	if got, want := SnapshotRules(snaps, "api.local", "api.user"), []string{"api.local", "api.path", "api.user", "edge.ip"}; !slices.Equal(got, want) {
		t.Errorf("SnapshotRules: %q, want %q", got, want)
	}
	if got := SnapshotRules(nil); len(got) != 0 {
		t.Errorf("no snapshots: %q", got)
	}
}
