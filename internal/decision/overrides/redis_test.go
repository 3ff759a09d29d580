package overrides_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/internal/decision/overrides"
	"github.com/sluicehq/sluice/internal/testsupport/logtest"
	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

// TestRedisStoreNodes: two nodes' stores on one real redis-server. A
// change on one is in the other's index within a second: a put, a
// replacement, a delete; also after the other's subscription was killed
// (the change's message lost: the poll catches up); and an expired
// override is swept by one of them and gone from both.
func TestRedisStoreNodes(t *testing.T) {
	srv := redistest.Standalone(t)
	prefix := fmt.Sprintf("ov-%d:", time.Now().UnixNano())
	var stores []*overrides.RedisStore
	var idxs []*overrides.Index
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var admin rueidis.Client
	for i := range 2 {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		if i == 0 {
			admin = c
		}
		idx := overrides.NewIndex(nil)
		s := overrides.NewRedisStore(func() (rueidis.Client, error) { return c, nil }, prefix, idx, nil, nil)
		go s.Run(ctx)
		stores, idxs = append(stores, s), append(idxs, idx)
	}
	// within waits until cond holds on node 1, at most a second.
	within := func(what string, cond func() bool) {
		t.Helper()
		start := time.Now()
		for !cond() {
			if time.Since(start) > time.Second {
				t.Fatalf("%s: not seen by the other node within 1 s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Logf("%s: seen by the other node after %v", what, time.Since(start).Round(time.Millisecond))
	}
	limitOf := func(idx *overrides.Index, path string) string {
		o := idx.Lookup("api", entries(path))
		if o == nil {
			return ""
		}
		return string(o.Limit)
	}
	put := func(path, limit string, expires *time.Time) {
		t.Helper()
		p, _ := overrides.ParsePath(path)
		if _, err := stores[0].Put(&overrides.Override{Domain: "api", Path: p, Limit: json.RawMessage(limit), Expires: expires}, "test"); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond) // both subscribed (a put before is caught by the poll anyway)
	put("tenant=acme", `{"unit":"minute","requests_per_unit":5}`, nil)
	within("a put", func() bool { return limitOf(idxs[1], "tenant=acme") != "" })
	put("tenant=acme", `{"unit":"minute","requests_per_unit":7}`, nil)
	within("a replacement", func() bool { return limitOf(idxs[1], "tenant=acme") == `{"unit":"minute","requests_per_unit":7}` })
	if _, err := stores[0].Delete("api", []overrides.Entry{{Key: "tenant", Value: "acme"}}, "test"); err != nil {
		t.Fatal(err)
	}
	within("a delete", func() bool { return limitOf(idxs[1], "tenant=acme") == "" })

	// Kill every subscription, then change at once: node 1 misses the
	// message and must catch up.
	if err := admin.Do(ctx, admin.B().ClientKill().TypePubsub().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	put("tenant=lost", `{"blocked":true}`, nil)
	within("a change whose message was lost", func() bool { return limitOf(idxs[1], "tenant=lost") != "" })

	soon := time.Now().Add(300 * time.Millisecond)
	put("tenant=temp", `{"blocked":true}`, &soon)
	within("an expiring put", func() bool { return len(stores[1].List()) == 2 })
	deadline := time.Now().Add(3 * time.Second)
	for len(stores[0].List()) != 1 || len(stores[1].List()) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the expired override is still held: %d and %d overrides", len(stores[0].List()), len(stores[1].List()))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if idxs[0].Lookup("api", entries("tenant=temp")) != nil || idxs[1].Lookup("api", entries("tenant=temp")) != nil {
		t.Fatal("the expired override still applies")
	}
}

// TestRedisStoreForeignField: an override written into the Redis hash by
// hand under a field other than its ID (this API keys each by its ID) is
// ignored: enforced, it could not be removed through the API. The
// overrides beside it apply; a put of the override whose ID is that
// field replaces it (it is not moved, as one under its legacy ID is).
func TestRedisStoreForeignField(t *testing.T) {
	c, prefix := newRedis(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, _ := overrides.ParsePath("tenant=evil")
	raw, err := json.Marshal(&overrides.Override{Domain: "api", Path: p, Limit: json.RawMessage(`{"blocked":true}`)})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, c.B().Hset().Key(prefix+"{overrides}").FieldValue().FieldValue("somebody's", string(raw)).FieldValue("api|tenant=acme", string(raw)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	idx := overrides.NewIndex(nil)
	s := overrides.NewRedisStore(func() (rueidis.Client, error) { return c, nil }, prefix, idx, nil, nil)
	go s.Run(ctx)
	acme, _ := overrides.ParsePath("tenant=acme")
	if _, err := s.Put(&overrides.Override{Domain: "api", Path: acme, Limit: json.RawMessage(`{"blocked":true}`)}, "test"); err != nil {
		t.Fatal(err)
	}
	// The put has read the whole hash first, if the store had not yet
	// (a change applies only on top of a store in step with Redis).
	if idx.Lookup("api", entries("tenant=acme")) == nil {
		t.Fatal("tenant=acme not in the index")
	}
	if idx.Lookup("api", entries("tenant=evil")) != nil {
		t.Error("the override under a foreign field is enforced")
	}
	for _, o := range s.List() {
		if o.ID() != "api|tenant=acme" {
			t.Errorf("listed: %s", o.ID())
		}
	}
	if n, err := c.Do(ctx, c.B().Hlen().Key(prefix+"{overrides}").Build()).AsInt64(); err != nil || n != 2 {
		t.Errorf("%d fields in the hash (%v), want somebody's and api|tenant=acme", n, err)
	}
}

// newRedis starts a real redis-server and returns a client of it, closed
// when the test ends, and a key prefix of the test's own.
func newRedis(t *testing.T) (rueidis.Client, string) {
	t.Helper()
	srv := redistest.Standalone(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, fmt.Sprintf("ov-%d:", time.Now().UnixNano())
}

// TestRedisStoreRefusedBacksOff: a real redis-server that refuses the
// store's password. The store tries to subscribe again after 200 ms,
// then twice as long each time up to 5 s, not every 200 ms, and logs the
// failures once, not at each try. Given the right password, it catches up
// (an override put meanwhile is in its index) within the longest wait.
func TestRedisStoreRefusedBacksOff(t *testing.T) {
	srv := redistest.Standalone(t, redistest.WithPassword("the-right-password-0123456789"))
	var mu sync.Mutex
	password, tries := "a-wrong-password-0123456789", 0
	var client rueidis.Client
	connect := func() (rueidis.Client, error) {
		mu.Lock()
		defer mu.Unlock()
		tries++
		if client != nil {
			return client, nil
		}
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, Password: password, DisableCache: true})
		if err == nil {
			client = c
			t.Cleanup(c.Close)
		}
		return c, err
	}
	var logs logtest.Buffer
	idx := overrides.NewIndex(nil)
	prefix := fmt.Sprintf("ov-%d:", time.Now().UnixNano())
	s := overrides.NewRedisStore(connect, prefix, idx, nil, logs.Logger())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx)

	time.Sleep(3 * time.Second)
	lost := strings.Count(logs.String(), "subscription to Redis lost")
	mu.Lock()
	n := tries
	mu.Unlock()
	t.Logf("in 3 s: %d tries (the subscription's and the poll's), %d lines", n, lost)
	// The subscription tries at 0, 0.2, 0.6, 1.4 and 3 s; the poll asks
	// for a client every 0.5 s (6 times), and logs nothing.
	if n > 13 || lost != 1 {
		t.Errorf("in 3 s: %d tries, %d lines of a lost subscription; want at most 13 and 1:\n%s", n, lost, logs.String())
	}

	admin, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, Password: "the-right-password-0123456789", DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	other := overrides.NewRedisStore(func() (rueidis.Client, error) { return admin, nil }, prefix, overrides.NewIndex(nil), nil, nil)
	p, _ := overrides.ParsePath("tenant=acme")
	if _, err := other.Put(&overrides.Override{Domain: "api", Path: p, Limit: json.RawMessage(`{"blocked":true}`)}, "test"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	password = "the-right-password-0123456789"
	mu.Unlock()
	start := time.Now()
	for idx.Lookup("api", entries("tenant=acme")) == nil {
		if time.Since(start) > 7*time.Second {
			t.Fatalf("not caught up 7 s after the password was right:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("caught up %v after the password was right", time.Since(start).Round(time.Millisecond))
}
