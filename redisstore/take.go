package redisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/fault"
	"github.com/sluicehq/sluice/internal/base/algo"
)

// Take implements sluice.Store; see its documentation for the contract.
// The hits whose keys share a Cluster slot (all of them, on a standalone or
// Sentinel server) are decided by one script call; a request spanning
// several slots makes one call per slot, in parallel, and takes back what
// the allowing slots consumed when another slot denies (see the package
// documentation).
//
// ctx bounds only the wait for a slot among the calls in flight
// (Config.MaxInFlight): once sent, a call waits for Redis's answer, or for
// Redis to be found silent (Config.Timeout), whatever ctx does, so that a
// caller's deadline, which measures the node's own queue as much as Redis,
// never takes a busy Redis for a dead one. Errors are
// *fault.StoreError, whose reason says what failed.
func (s *Store) Take(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	return s.call1(ctx, hits, out, false)
}

// TakeEach implements sluice.Store's TakeEach: the hits decided one by one, in
// order, in the same script calls as Take (mode "e"), a denied hit with
// room left consumed past its limit (algo.Overdraw). On a Cluster, the
// slots' calls need no refund: each hit stands on its own.
func (s *Store) TakeEach(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	return s.call1(ctx, hits, out, true)
}

// call1 is Take, or TakeEach when each is set: one request, through the
// gate, the breaker and the batcher.
func (s *Store) call1(ctx context.Context, hits []sluice.Hit, out []sluice.Decision, each bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(out) < len(hits) {
		return fmt.Errorf("redisstore: %d decisions for %d hits", len(out), len(hits))
	}
	if len(hits) == 0 {
		return nil
	}
	return s.guarded(ctx, func(c *conn) error { return s.take(s.ctx, c, hits, out, each) })
}

// guarded runs call, the store's work for one caller's request, through
// the gate (Config.MaxInFlight), the breaker and the store's metrics, and
// returns its error as a *fault.StoreError whose reason says what failed
// (or ctx's error, when the caller gave up waiting for a slot). call talks
// to Redis with s.ctx, not the caller's ctx (see Take).
func (s *Store) guarded(ctx context.Context, call func(c *conn) error) error {
	c := s.client.Load()
	if c == nil {
		s.metrics.rejected.Add(1)
		return &fault.StoreError{Reason: fault.Unreachable, Err: s.notConnected()}
	}
	if err := s.gate.enter(ctx); err != nil {
		if err != errShed {
			return err // the caller gave up waiting
		}
		s.metrics.shed.Add(1)
		if n, ok := s.shedLog.Allow(time.Now()); ok {
			s.log.Warn("redis: calls in flight and queue full; shedding calls to the failure policy",
				"in_flight", s.gate.inFlight(), "queued", s.gate.queued(), "shed_not_logged", n)
		}
		return &fault.StoreError{Reason: fault.Overload, Err: fmt.Errorf("redisstore: %w", ErrOverload)}
	}
	defer s.gate.leave()
	if err := s.br.Allow(); err != nil {
		s.metrics.rejected.Add(1)
		return &fault.StoreError{Reason: fault.BreakerOpen, Err: fmt.Errorf("%w: %v", ErrUnavailable, err)}
	}
	start := time.Now()
	err := call(c)
	s.metrics.observe(time.Since(start), err)
	if err != nil && s.ctx.Err() != nil {
		// Closed under the call: that says nothing about Redis.
		return &fault.StoreError{Reason: fault.Unreachable, Err: fmt.Errorf("redisstore: closed: %w", err)}
	}
	switch {
	case errors.Is(err, errOpenWhileQueued):
		// Never sent: it says nothing of Redis.
	case err != nil && reasonOf(err) == fault.Error:
		s.br.Done(nil) // Redis answered, refusing this request
	default:
		s.br.Done(err)
	}
	if err != nil {
		why := reasonOf(err)
		if errors.Is(err, errOpenWhileQueued) {
			why = fault.BreakerOpen
		}
		return &fault.StoreError{Reason: why, Err: fmt.Errorf("redisstore: %w", err)}
	}
	return nil
}

// reasonOf classifies the error of a call that reached rueidis: an error
// reply is Redis refusing; a deadline is a connection found silent (or a
// handshake that had no answer); a network error or a closed connection is
// Redis unreachable; anything else (a malformed answer) an error.
func reasonOf(err error) fault.Reason {
	var re *rueidis.RedisError
	var ne net.Error
	switch {
	case errors.As(err, &re):
		return fault.Error
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return fault.Timeout
	case errors.As(err, &ne):
		if ne.Timeout() {
			return fault.Timeout
		}
		return fault.Unreachable
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, rueidis.ErrClosing),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EPIPE):
		return fault.Unreachable
	}
	return fault.Error
}

// op is one hit, encoded for the script.
type op struct {
	p     algo.Params
	slot  uint16 // on a Cluster
	state string // the state key, or a sketch's meta key
	spec  string // the limit's spec (spec.go)
	req   []byte // build's scratch for "cost prev [counters]"
	cells []uint32
	keys  []string
	key2  [2]string // keys' array for a state and its block key
}

// group is the hits of one script call.
type group struct {
	idx  []int // indexes into hits
	keys []string
	args []string
	res  []answer // a hit each
	undo []string // modes "u" and "r": two a hit
	err  error
}

// take decides hits all-or-nothing in one script call per slot (one call
// on a standalone server or Sentinel, batched with concurrent requests):
// when several slots are involved and one denies or fails, the others'
// consumption is taken back.
func (s *Store) take(ctx context.Context, c *conn, hits []sluice.Hit, out []sluice.Decision, each bool) error {
	ops := make([]op, len(hits))
	var kb [128]byte // the keys are built here, then copied: most fit
	k := keyer{prefix: s.cfg.Prefix, tag: s.tag, buf: kb[:0]}
	for i := range hits {
		s.encode(&k, &hits[i], &ops[i])
		if c.cluster {
			ops[i].slot = slotOf(ops[i].state)
		}
	}
	groups := groupBySlot(c, ops)
	nowArg := ""
	if s.now != nil {
		nowArg = strconv.FormatInt(s.now().UnixNano(), 10)
	}
	mode := "t"
	switch {
	case each:
		mode = "e" // one by one: nothing to refund
	case len(groups) > 1:
		mode = "u" // with the undo strings of a refund
	}
	for _, g := range groups {
		g.build(hits, ops, nowArg, mode, nil)
	}
	if len(groups) == 1 && !c.cluster {
		s.batch.do(c, groups[0], nowArg)
	} else {
		s.run(ctx, c, groups)
	}
	failed, allowed := verdict(hits, groups)
	if (failed != nil || !allowed) && len(groups) > 1 && !each {
		s.refund(ctx, c, hits, ops, groups, nowArg)
	}
	if failed != nil {
		return failed
	}
	for _, g := range groups {
		for j, i := range g.idx {
			out[i] = decision(&hits[i], &ops[i].p, g.res[j])
		}
	}
	return nil
}

// groupBySlot puts the hits in script calls: all in one, or on a Cluster
// one a slot.
func groupBySlot(c *conn, ops []op) []*group {
	if !c.cluster {
		// One allocation for the group, its list and (for a few hits)
		// its indexes, keys and arguments.
		one := &struct {
			g    group
			gs   [1]*group
			idx  [4]int
			keys [4]string
			args [8]string
		}{}
		one.g.idx, one.g.keys, one.g.args = one.idx[:0], one.keys[:0], one.args[:0]
		for i := range ops {
			one.g.idx = append(one.g.idx, i)
		}
		one.gs[0] = &one.g
		return one.gs[:]
	}
	var groups []*group
	bySlot := make(map[uint16]*group, 1)
	for i := range ops {
		g := bySlot[ops[i].slot]
		if g == nil {
			g = &group{}
			bySlot[ops[i].slot] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
	}
	return groups
}

// verdict reads the calls' answers: an error of a call, and whether every
// enforced hit allowed.
func verdict(hits []sluice.Hit, groups []*group) (failed error, allowed bool) {
	allowed = true
	for _, g := range groups {
		if g.err != nil {
			failed = g.err
			continue
		}
		for j, i := range g.idx {
			if g.res[j].v[0] != 1 && !hits[i].Limit.Shadow {
				allowed = false
			}
		}
	}
	return failed, allowed
}

// refund takes back what the allowing slots consumed when another slot
// denied, or failed, and has their hits report peeks.
func (s *Store) refund(ctx context.Context, c *conn, hits []sluice.Hit, ops []op, groups []*group, nowArg string) {
	var refunds []*group
	var taken [][]answer
	for _, g := range groups {
		if g.err != nil {
			continue
		}
		committed := false
		for j := range g.idx {
			committed = committed || g.res[j].v[5] == 1
		}
		if committed {
			g.build(hits, ops, nowArg, "r", g.undo)
			refunds = append(refunds, g)
			taken = append(taken, g.res)
		}
	}
	s.run(ctx, c, refunds)
	for k, g := range refunds {
		if g.err != nil {
			// The slot's consumption stays (the safe side); its
			// hits report what the take answered.
			s.metrics.refundFailed.Add(1)
			s.log.Warn("redis: could not take back a cross-slot request's consumption", "err", g.err)
			g.err, g.res = nil, taken[k]
			continue
		}
		// The refund answers peeks; as in a request denied in one
		// slot, only the hits that allowed and would have consumed
		// report them, the others (denying shadow limits, peeks)
		// keep their answers.
		for j, i := range g.idx {
			if taken[k][j].v[0] != 1 || hits[i].Cost == 0 {
				g.res[j] = taken[k][j]
			}
		}
	}
}

// run executes the script for every group, in parallel when there are
// several.
func (s *Store) run(ctx context.Context, c *conn, groups []*group) {
	exec := func(g *group) {
		g.res, g.undo, g.err = nil, nil, nil
		s.metrics.fcalls.Add(1)
		msgs, err := s.fcall(ctx, c, fnName, g.keys, g.args).ToArray()
		n := len(g.idx)
		res := make([]answer, n)
		if err == nil {
			var used int
			used, err = readAnswers(msgs, n, res)
			msgs = msgs[min(used, len(msgs)):]
		}
		if m := g.args[0][0]; err == nil && (m == 'u' || m == 'r') {
			// and two undo strings a hit
			g.undo = make([]string, 0, 2*n)
			for i := 0; err == nil && i < len(msgs); i++ {
				var u string
				u, err = msgs[i].ToString()
				g.undo = append(g.undo, u)
			}
			msgs = nil
			if err == nil && len(g.undo) != 2*n {
				err = fmt.Errorf("script returned %d undo strings for %d hits", len(g.undo), n)
			}
		}
		if err == nil && len(msgs) != 0 {
			err = fmt.Errorf("script returned %d values more than %d hits take", len(msgs), n)
		}
		if err == nil {
			s.metrics.countExpired(res)
		} else {
			res = nil
		}
		g.res, g.err = res, err
	}
	if len(groups) == 1 {
		exec(groups[0])
		return
	}
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			exec(g)
		}()
	}
	wg.Wait()
}
