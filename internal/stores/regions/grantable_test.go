package regions_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/stores/regions"
	"github.com/sluicehq/sluice/internal/testsupport/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// TestGrantableLua: the ledger's script grants what Grantable says, for
// what is free from below zero to L and wants from 0 to beyond it: the
// Lua mirrors the Go (which cmd/regionsim runs).
func TestGrantableLua(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	cs, err := redisstore.New(redisstore.Config{URL: srv.URL(), Prefix: "coord:"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	led := &regions.RedisLedger{Client: cs.Client, Prefix: "coord:"}
	const limit = 1000
	ws := time.Now().Truncate(time.Minute).UnixNano()
	for _, free := range []int64{-3, 0, 1, 2, 3, 7, 500, 999, 1000} {
		for _, want := range []int64{0, 1, 2, 3, 4, 250, 499, 500, 501, 1000, 5000} {
			// Region 1 absent holds its share, limit − free; region 2
			// asks, holding none.
			e := regions.Entry{Key: fmt.Sprintf("k%d/%d\x00%d\x00%d\x00g", free, want, limit, time.Minute), Window: ws,
				Period: int64(time.Minute), TTL: int64(2 * time.Minute), Limit: limit, Region: 1, Shares: []int64{limit - free, 0}}
			got, err := led.Grant(context.Background(), e, want)
			if err != nil {
				t.Fatal(err)
			}
			if w := regions.Grantable(free, want); got != w {
				t.Errorf("free %d, want %d: the script granted %d, Grantable %d", free, want, got, w)
			}
		}
	}
}
