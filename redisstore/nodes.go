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
//
// A count that is too high costs a node some of its share during an
// outage; one that is too low lets the nodes together admit more than the
// limit. So the count a node uses rises at once and falls slowly
// (nodeCount), and a registry that Redis lost track of (down, restored
// from a file, failed over) counts the nodes it held when it did
// (nodesLua). The argument is in docs/internals/redis-store.md.

// nodesLua is the body of the registry's function (KEYS[1] the registry,
// a sorted set of node ids scored by when they expire, in Redis TIME
// milliseconds; ARGV: the node's id, its time to live in milliseconds, and
// "join" or "leave"): it renews or removes the node, drops the expired
// ones, and returns how many are left.
//
// The member "" (no node id is empty) is scored with the last call's
// time. When no node called for more than half an entry's life, Redis
// cannot tell the nodes that stopped from those that could not reach it
// (it was down, restored from an old append-only file or snapshot, failed
// over to a replica, or its clock jumped): the entries that expired since
// are then renewed for one more life, in which every node still running
// renews its own. The registry lives a day after the last call, so that a
// Redis restored within a day still has it.
const nodesLua = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(args[2])
local key = keys[1]
local last = redis.call('ZSCORE', key, '')
if last and now - tonumber(last) > ttl / 2 then
  for _, id in ipairs(redis.call('ZRANGE', key, last, '(' .. now, 'BYSCORE')) do
    if id ~= '' then
      redis.call('ZADD', key, now + ttl, id)
    end
  end
end
if args[3] == 'leave' then
  redis.call('ZREM', key, args[1])
else
  redis.call('ZADD', key, now + ttl, args[1])
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. now)
redis.call('ZADD', key, now, '')
redis.call('PEXPIRE', key, math.max(2 * ttl, 86400000))
return redis.call('ZCARD', key) - 1`

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
	heartbeat(every, s.stop, s.beat, func(n, was, read int64) {
		if n != was {
			s.nodes.Store(n)
			s.log.Info("redis: nodes sharing the limits", "nodes", n, "was", was)
		} else if read < n {
			s.log.Debug("redis: fewer nodes in the registry than counted; counted once read for an entry's life", "registry", read, "nodes", n)
		}
	})
}

// heartbeat calls beat("join", 3·every) at once and then every interval,
// and beat("leave", 3·every) once stop is closed. After each join that
// read the registry it calls counted with the count in force (nodeCount),
// the count before, and the count read.
func heartbeat(every time.Duration, stop <-chan struct{}, beat func(op string, ttl time.Duration) (int64, error), counted func(n, was, read int64)) {
	t := time.NewTicker(every)
	defer t.Stop()
	ttl := 3 * every
	var count nodeCount
	born := time.Now() // the clock is monotonic from here on
	for {
		start := time.Since(born)
		n, err := beat("join", ttl)
		if err != nil {
			count.failed()
		} else {
			was := count.n
			count.read(n, int64(start), int64(time.Since(born)), int64(ttl))
			counted(count.n, was, n)
		}
		select {
		case <-stop:
			beat("leave", ttl)
			return
		case <-t.C:
		}
	}
}

// beat renews (op "join") or removes (op "leave") the node's entry in the
// registry and returns how many nodes the registry holds.
func (s *Store) beat(op string, ttl time.Duration) (int64, error) {
	c := s.client.Load()
	if c == nil {
		return 0, ErrUnavailable
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(s.timeout, time.Second))
	defer cancel()
	n, err := s.fcall(ctx, c, nodesFn, []string{s.registryKey()},
		[]string{s.nodeID, strconv.FormatInt(ttl.Milliseconds(), 10), op}).AsInt64()
	if err != nil {
		s.log.Debug("redis: node registry", "op", op, "err", err)
	}
	return n, err
}

// nodeCount is the number of nodes a store counts (Store.Nodes), from the
// counts its heartbeats read in the registry: it rises at once to a count
// read higher, and falls only once every read for an entry's life (ttl)
// has been lower, with no failed heartbeat between, to the highest of
// those reads. In that time every node that reaches Redis has renewed its
// entry, whatever Redis held before: a registry restored from an old file,
// emptied, or read on a replica with an older copy lowers no count, and a
// node's count never falls below the nodes that reached Redis through the
// whole of its last ttl. A failed heartbeat (Redis down, or a reply lost)
// starts the wait again. Times are nanoseconds of a monotonic clock.
type nodeCount struct {
	n     int64 // the count in force; 0 before the first read
	low   int64 // the highest of the lower reads since since; 0: none
	since int64 // when the first of them was answered
}

// read takes a count m from the registry, read by a heartbeat that started
// at start and was answered at end (the registry was read in between).
// The wait for a fall runs from the first lower read's end to the latest
// one's start, so that it never counts more time than Redis answered.
func (c *nodeCount) read(m, start, end, ttl int64) {
	m = max(m, 1) // this node, which has just renewed its entry
	switch {
	case m >= c.n:
		c.n, c.low = m, 0
		return
	case c.low == 0:
		c.low, c.since = m, end
	default:
		c.low = max(c.low, m)
	}
	if start-c.since >= ttl {
		c.n, c.low = c.low, 0
	}
}

// failed records a heartbeat that read nothing: the lower reads before it
// no longer count towards a fall.
func (c *nodeCount) failed() { c.low = 0 }

// Nodes returns the number of nodes sharing this store's prefix, as learnt
// from the registry in Redis (this one included; see nodeCount for how it
// falls): 0 before the first heartbeat succeeded, or with Config.Heartbeat
// negative. It does no I/O.
func (s *Store) Nodes() int { return int(s.nodes.Load()) }
