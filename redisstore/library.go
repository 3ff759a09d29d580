package redisstore

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/redisstore/internal/luasrc"
)

//go:embed take.lua
var takeLua string

// The store runs its Lua as a Redis function library (FUNCTION LOAD, then
// FCALL): the exact-integer library, the algorithms and take.lua. A plain
// script (EVALSHA) would run all of their definitions again on every
// call (measured: 30.6 against 21µs of Redis CPU per decision); a library runs them
// once, on its first call (code that runs while a library loads sees only
// the redis table, so the definitions wait for the first call and stay in
// an upvalue). The names carry a hash of the code, so that nodes of two
// sluice versions sharing a Redis each call their own.
var (
	takeCode = luasrc.Lib + "\n" + takeLua
	libHash  = func() string { h := sha1.Sum([]byte(takeCode + "\n" + nodesLua)); return hex.EncodeToString(h[:6]) }()
	fnName   = "sluice_take_" + libHash
	nodesFn  = "sluice_nodes_" + libHash
	libCode  = "#!lua name=sluice_" + libHash + "\n" +
		"local function lib()\n" + takeCode + "\nreturn take\nend\n" +
		"local take\n" +
		"redis.register_function('" + fnName + "', function(keys, args)\n" +
		"  take = take or lib()\n" +
		"  return take(keys, args)\n" +
		"end)\n" +
		"redis.register_function('" + nodesFn + "', function(keys, args)\n" + nodesLua + "\nend)\n"
)

// pinned: the commands of background calls (the node registry, the
// probe, a library load, the overrides' and the clock's reads) are pinned,
// never recycled. rueidis recycles a command once it is answered; the race
// detector, which cannot see that the answer came after the pipe's writer
// had written the command, reports a race between them, and a -race node
// halts on it. A request's calls are not pinned: they are the hot path
// (pinning costs an allocation a call), and the detector has not reported
// them, perhaps because the calls around them order them for it.

// fcall calls the request function. When Redis does not know it (a fresh
// or restarted server, FUNCTION FLUSH, a failover to a replica that was
// never given it), it loads the library and calls again.
func (s *Store) fcall(ctx context.Context, c *conn, fn string, keys, args []string) rueidis.RedisResult {
	call := func() rueidis.RedisResult {
		cmd := c.c.B().Fcall().Function(fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
		if fn != fnName {
			cmd = cmd.Pin() // a background call: see pinned
		}
		return c.c.Do(ctx, cmd)
	}
	res := call()
	if err := res.Error(); err != nil && strings.Contains(err.Error(), "Function not found") {
		if s.loaded.Load() {
			s.forgot()
		}
		if s.load(ctx, c) != nil {
			return res
		}
		res = call()
	}
	return res
}

// load loads the library, one load at a time: the calls that met the
// same restart wait for it, and their own loads then find it there.
func (s *Store) load(ctx context.Context, c *conn) error {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	err := loadLibrary(ctx, c)
	if err == nil {
		s.loaded.Store(true)
	}
	return err
}

// forgot counts a Redis found without the library this node had loaded,
// and logs it (once a minute at most).
func (s *Store) forgot() {
	s.metrics.forgot.Add(1)
	now := time.Now().UnixNano()
	if last := s.forgotLog.Load(); now-last >= int64(time.Minute) && s.forgotLog.CompareAndSwap(last, now) {
		s.log.Warn("redis: the function library is gone: Redis restarted empty, was flushed, or failed over to a replica without it; the counters and permits it held are lost, and the library is loaded again")
	}
}

// forgotten reports whether Redis answers that it has no library of this
// version, after this node loaded it: an idle node's probe asks, since no
// call would find out. An error (an ACL without FUNCTION LIST, say) says
// nothing; nor is a Cluster asked (the question would reach one node,
// perhaps a replica still syncing): there the calls find out.
func (s *Store) forgotten(ctx context.Context, c *conn) bool {
	if !s.loaded.Load() || c.cluster {
		return false
	}
	libs, err := c.c.Do(ctx, c.c.B().FunctionList().Libraryname("sluice_"+libHash).Build().Pin()).ToArray()
	return err == nil && len(libs) == 0
}

// loadLibrary loads the function library on every node that takes writes:
// the server, or each node of a Cluster (replicas refuse it, and get it by
// replication).
func loadLibrary(ctx context.Context, c *conn) error {
	load := func(cl rueidis.Client) error {
		err := cl.Do(ctx, cl.B().FunctionLoad().FunctionCode(libCode).Build().Pin()).Error()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return nil
		}
		return err
	}
	if !c.cluster {
		return load(c.c)
	}
	var errs []error
	loaded := false
	for _, n := range c.c.Nodes() {
		if err := load(n); err != nil {
			errs = append(errs, err)
		} else {
			loaded = true
		}
	}
	if loaded {
		return nil
	}
	return errors.Join(errs...)
}
