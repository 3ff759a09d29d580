package rlqs

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

//go:embed share.lua
var shareLua string

var shareScript = rueidis.NewLuaScript(shareLua)

// RedisPools keeps the pools in Redis, shared by every sluice node on it,
// so that any Envoy may talk to any node: one hash per pool, one script
// call per participant's report (the calls of one report pipelined), with
// Redis's clock.
type RedisPools struct {
	client func() (rueidis.Client, error)
	prefix string

	// The policy as the script's arguments, formatted once.
	ttl, grace, hyst string

	// now, when set (tests only), replaces Redis TIME.
	now func() time.Time
}

// NewRedisPools returns pools in the Redis that client gives (a
// redisstore.Store's Client), under keys starting with prefix.
func NewRedisPools(p Policy, client func() (rueidis.Client, error), prefix string) *RedisPools {
	return &RedisPools{client: client, prefix: prefix,
		ttl:   strconv.FormatInt(p.TTL.Milliseconds(), 10),
		grace: strconv.FormatInt(p.Grace.Milliseconds(), 10),
		hyst:  formatFloat(p.hysteresis()),
	}
}

// Assign implements Pools.
func (r *RedisPools) Assign(ctx context.Context, asks []Ask, out []Share) error {
	if len(asks) == 0 {
		return nil
	}
	c, err := r.client()
	if err != nil {
		return err
	}
	now := ""
	if r.now != nil {
		now = strconv.FormatInt(r.now().UnixMilli(), 10)
	}
	execs := make([]rueidis.LuaExec, len(asks))
	for i, a := range asks {
		execs[i] = rueidis.LuaExec{
			Keys: []string{r.prefix + "rlqs:" + a.Pool},
			Args: []string{a.Client, formatFloat(a.Demand), r.ttl, r.grace, r.hyst, now},
		}
	}
	for i, res := range shareScript.ExecMulti(ctx, c, execs...) {
		vals, err := res.AsStrSlice()
		if err == nil && len(vals) != 2 {
			err = fmt.Errorf("share script answered %d values", len(vals))
		}
		if err != nil {
			return fmt.Errorf("rlqs: pool %q: %w", asks[i].Pool, err)
		}
		if out[i].Share, err = strconv.ParseFloat(vals[0], 64); err == nil {
			out[i].Fair, err = strconv.ParseFloat(vals[1], 64)
		}
		if err != nil {
			return fmt.Errorf("rlqs: pool %q: %w", asks[i].Pool, err)
		}
	}
	return nil
}
