package redisstore

import (
	"context"
	crand "crypto/rand"
	"fmt"
	"os"
	"strconv"
	"time"
)

// The node registry: every node renews its entry in a sorted set in Redis
// once a heartbeat, and learns from it how many nodes share the limits
// (Store.Nodes), which the local failure policy divides every limit by.

// nodesLua is the body of the registry's function (KEYS[1] the registry,
// a sorted set of node ids scored by when they expire, in Redis TIME
// milliseconds; ARGV: the node's id, its time to live in milliseconds, and
// "join" or "leave"): it renews or removes the node, drops the expired
// ones, and returns how many are left.
const nodesLua = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(args[2])
if args[3] == 'leave' then
  redis.call('ZREM', keys[1], args[1])
else
  redis.call('ZADD', keys[1], now + ttl, args[1])
end
redis.call('ZREMRANGEBYSCORE', keys[1], '-inf', '(' .. now)
redis.call('PEXPIRE', keys[1], 2 * ttl)
return redis.call('ZCARD', keys[1])`

// nodeID names this node in the registry: host, process and a random part.
func nodeID() string {
	host, _ := os.Hostname()
	var b [6]byte
	crand.Read(b[:])
	return fmt.Sprintf("%s/%d/%x", host, os.Getpid(), b)
}

// registryKey is the key of the registry of the nodes sharing the prefix.
func (s *Store) registryKey() string { return s.cfg.Prefix + "nodes" }

// heartbeat registers the node every interval until Close, which removes
// it. A node is counted for three intervals after its last beat.
func (s *Store) heartbeat(every time.Duration) {
	defer close(s.hbDone)
	t := time.NewTicker(every)
	defer t.Stop()
	ttl := 3 * every
	for {
		s.beat("join", ttl)
		select {
		case <-s.stop:
			s.beat("leave", ttl)
			return
		case <-t.C:
		}
	}
}

// beat renews (op "join") or removes (op "leave") the node's entry in the
// registry and, on a renewal, records how many nodes are registered. A
// failure leaves the count as it was: during an outage the nodes divide
// by the last count they learnt.
func (s *Store) beat(op string, ttl time.Duration) {
	c := s.client.Load()
	if c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(s.timeout, time.Second))
	defer cancel()
	n, err := s.fcall(ctx, c, nodesFn, []string{s.registryKey()},
		[]string{s.nodeID, strconv.FormatInt(ttl.Milliseconds(), 10), op}).AsInt64()
	if err != nil {
		s.log.Debug("redis: node registry", "op", op, "err", err)
		return
	}
	if op == "join" {
		if old := s.nodes.Swap(n); old != n {
			s.log.Info("redis: nodes sharing the limits", "nodes", n, "was", old)
		}
	}
}

// Nodes returns the number of nodes sharing this store's prefix, as last
// learnt from the registry in Redis (this one included): 0 before the
// first heartbeat succeeded, or with Config.Heartbeat negative. It does no
// I/O.
func (s *Store) Nodes() int { return int(s.nodes.Load()) }
