// Package redishash is one Redis hash behind the few calls that the parts
// sharing state through Redis make (hitters.Hash: set a field, read them
// all, delete one), so that those parts import no Redis client.
//
// It imports rueidis and nothing of sluice.
package redishash

import (
	"context"
	"time"

	"github.com/redis/rueidis"
)

// callTimeout bounds each call, whatever its caller's context says: the
// client retries a read on a lost connection until its context ends, and
// a page or an endpoint that reads the hash (the dashboard's cluster-wide
// top keys) must answer, saying what failed, while Redis is down.
const callTimeout = 2 * time.Second

// Hash is the Redis hash at one key.
type Hash struct {
	client func() (rueidis.Client, error)
	key    string
}

// New returns the hash at key, on the Redis that client gives (the Redis
// store's Client: it fails while the store cannot connect).
func New(client func() (rueidis.Client, error), key string) *Hash {
	return &Hash{client: client, key: key}
}

// Each call is bounded by callTimeout as well as by its context.

// Set sets field to value (HSET).
func (h *Hash) Set(ctx context.Context, field, value string) error {
	c, err := h.client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	return c.Do(ctx, c.B().Hset().Key(h.key).FieldValue().FieldValue(field, value).Build().Pin()).Error()
}

// All returns every field and its value (HGETALL).
func (h *Hash) All(ctx context.Context) (map[string]string, error) {
	c, err := h.client()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	return c.Do(ctx, c.B().Hgetall().Key(h.key).Build().Pin()).AsStrMap()
}

// Delete removes field (HDEL).
func (h *Hash) Delete(ctx context.Context, field string) error {
	c, err := h.client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	return c.Do(ctx, c.B().Hdel().Key(h.key).Field(field).Build().Pin()).Error()
}
