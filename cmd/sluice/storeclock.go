package main

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/internal/stores/redisclock"
	"github.com/sluicehq/sluice/redisstore"
)

// redisClock estimates the clock of the Redis behind store, which chooses
// the window of rules with schedules (decide.Config.Now) as Redis's TIME
// decides every counter: nodes whose clocks disagree change windows
// together. With Redis Cluster, TIME comes from whichever node the client
// picks; the nodes' clocks are as close as their time service keeps them.
// Until Redis first answers, the clock is this process's.
func redisClock(store *redisstore.Store, log *slog.Logger) *redisclock.Clock {
	ask := func(ctx context.Context) (time.Time, error) {
		client, err := store.Client()
		if err != nil {
			return time.Time{}, err
		}
		v, err := client.Do(ctx, client.B().Time().Build().Pin()).AsStrSlice()
		if err != nil {
			return time.Time{}, err
		}
		if len(v) != 2 {
			return time.Time{}, fmt.Errorf("TIME answered %d values", len(v))
		}
		sec, err := strconv.ParseInt(v[0], 10, 64)
		if err != nil {
			return time.Time{}, fmt.Errorf("TIME seconds %q: %w", v[0], err)
		}
		usec, err := strconv.ParseInt(v[1], 10, 64)
		if err != nil {
			return time.Time{}, fmt.Errorf("TIME microseconds %q: %w", v[1], err)
		}
		return time.Unix(sec, usec*1000), nil
	}
	return redisclock.New(redisclock.Config{Time: ask, Logger: log})
}
