package redisstore

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/sluicehq/sluice/fault"
	"github.com/sluicehq/sluice/internal/stores/breaker"
)

// Batching. Every script call costs Redis the same overhead before the
// first hit is decided (the command, the call into Lua, TIME, the reply):
// about a third of a one-hit decision. While a node has calls in flight,
// the requests that arrive meanwhile are independent of each other, so
// they go together in one call, each decided on its own, all-or-nothing,
// in turn. No request waits for a batch to fill: a request goes at once
// while fewer than maxCalls calls are in flight, and otherwise waits for
// one to return and then goes with every request waiting (up to
// maxBatch). A lone request is a call of its own, as before; under load,
// calls carry many.
//
// A lone request makes its call on its own goroutine. The calls of the
// requests that waited are made by the batcher's runner, one goroutine
// for as long as the store is open, which keeps making them while
// requests wait: a request's goroutine (a gRPC handler's, say) may have a
// small stack, and the call, deep under the request's own frames, grew it
// (copying every frame: 4% of the server's CPU in a profile under load,
// once gRPC's workers ran the handlers); the runner's stack grows once.
//
// Only requests decided by one call are batched (all of them on a
// standalone or Sentinel server; on a Cluster, whose calls must keep to
// one slot, none are).
//
// One call in flight at a time gathers the most requests a call, and
// measured best: Redis is one thread, so while it decides one call the
// next gathers. With 64 requests in flight, calls carried about 10 each and
// Redis spent 18 ms of CPU per 1,000 decisions, against 25 with four calls
// in flight and 32 with none gathered (bench/envoyrl.sh, 10k keys).
const (
	maxCalls = 1  // calls in flight at once
	maxBatch = 64 // requests in one call
)

// errOpenWhileQueued fails the requests of a call that would go while the
// circuit breaker is open: they waited while it opened.
var errOpenWhileQueued = fmt.Errorf("%w: circuit breaker opened while the request waited", ErrUnavailable)

// silentWhileQueued is the failure of the requests that waited to go after
// a call that found Redis silent or unreachable: the call's own error, so
// that they fail with its reason, and count for the breaker as it does.
func silentWhileQueued(err error) error {
	return fmt.Errorf("a call this request waited behind failed: %w", err)
}

// batcher gathers the requests of a Store into calls.
type batcher struct {
	s     *Store
	mu    sync.Mutex
	queue []*batchReq
	calls int // calls in flight

	// next hands the runner the batch to call next, and the connection
	// to call it on; the runner ends when the store's stop is closed.
	next chan handOff
}

// handOff is a batch for the runner.
type handOff struct {
	c     *conn
	batch []*batchReq
}

// batchReq is one request waiting to go.
type batchReq struct {
	g   *group
	now string        // the caller's clock, "" for Redis TIME
	ch  chan struct{} // signalled once: the request has its answer
}

var batchReqs = sync.Pool{New: func() any { return &batchReq{ch: make(chan struct{}, 1)} }}

func newBatcher(s *Store) *batcher {
	b := &batcher{s: s, next: make(chan handOff)}
	go b.runner()
	return b
}

// do decides the request of group g, built in mode "t" or "e", with
// others: its answer is in g.res, or its error in g.err.
func (b *batcher) do(c *conn, g *group, now string) {
	r := batchReqs.Get().(*batchReq)
	r.g, r.now = g, now
	b.mu.Lock()
	if b.calls < maxCalls {
		b.calls++
		b.mu.Unlock()
		if next := b.run(c, []*batchReq{r}, 1); next != nil {
			b.handOff(c, next)
		}
	} else {
		b.queue = append(b.queue, r)
		b.mu.Unlock()
		<-r.ch
	}
	r.g = nil
	batchReqs.Put(r)
}

// handOff gives the runner batch, the requests that waited behind a call
// of their caller's; once the store is closed (the runner ended), the
// caller makes the calls itself.
func (b *batcher) handOff(c *conn, batch []*batchReq) {
	select {
	case b.next <- handOff{c, batch}:
	case <-b.s.stop:
		for batch != nil {
			batch = b.run(c, batch, 0)
		}
	}
}

// runner makes the calls it is handed, and those of the requests that
// waited behind them, until the store is closed.
func (b *batcher) runner() {
	for {
		select {
		case h := <-b.next:
			for batch := h.batch; batch != nil; {
				batch = b.run(h.c, batch, 0)
			}
		case <-b.s.stop:
			return
		}
	}
}

// run makes one call for batch; then, if requests wait, it takes them out
// of the queue (up to maxBatch) and returns them, the next call, for its
// caller to make; then it signals the requests of batch from index wake
// on (1 when the first is the caller's own) that they have their answers.
// Every request is signalled exactly once.
//
// When the call found Redis silent or unreachable, every request waiting
// then fails with it instead: each waited for that call, sent before it
// came, so it is answered within the time Redis takes to be found silent
// (about twice Config.Timeout), never after that and a call of its own.
func (b *batcher) run(c *conn, batch []*batchReq, wake int) (next []*batchReq) {
	if b.s.br.State() == breaker.Open {
		for _, r := range batch {
			r.g.res, r.g.err = nil, errOpenWhileQueued
		}
	} else {
		b.s.call(c, batch)
	}
	var failed error
	if err := batch[0].g.err; err != nil {
		if why := reasonOf(err); why == fault.Timeout || why == fault.Unreachable {
			failed = silentWhileQueued(err)
		}
	}
	b.mu.Lock()
	var dropped []*batchReq
	if n := min(len(b.queue), maxBatch); n > 0 && failed == nil {
		next = make([]*batchReq, n)
		copy(next, b.queue)
		b.queue = append(b.queue[:0], b.queue[n:]...)
	} else {
		dropped = append(dropped, b.queue...)
		clear(b.queue)
		b.queue = b.queue[:0]
		b.calls--
	}
	b.mu.Unlock()
	for _, r := range dropped {
		r.g.res, r.g.err = nil, failed
		r.ch <- struct{}{}
	}
	for _, r := range batch[wake:] {
		r.ch <- struct{}{}
	}
	return next
}

// call decides batch in one script call: one request alone as it is, more
// as a batch ("b").
func (s *Store) call(c *conn, batch []*batchReq) {
	if len(batch) == 1 {
		s.run(s.ctx, c, []*group{batch[0].g})
		return
	}
	head := "b " + strconv.Itoa(len(batch))
	nargs, nkeys := 1, 0
	for _, r := range batch {
		nargs += len(r.g.args)
		nkeys += len(r.g.keys)
	}
	args := make([]string, 1, nargs)
	keys := make([]string, 0, nkeys)
	args[0] = head
	for _, r := range batch {
		// A request's own header, "[e]hits keys args [now]" (e: decided
		// one by one; the KEYS and further ARGV it takes), then its hits.
		n, k, a, e := len(r.g.idx), len(r.g.keys), len(r.g.args)-1, 0
		if r.g.args[0][0] == 'e' {
			e = 1
		}
		var h string
		if n < len(batchHeads[e]) && k < len(batchHeads[e][n]) && a < len(batchHeads[e][n][k]) && r.now == "" {
			h = batchHeads[e][n][k][a]
		} else {
			h = strconv.Itoa(n) + " " + strconv.Itoa(k) + " " + strconv.Itoa(a)
			if e == 1 {
				h = "e" + h
			}
			if r.now != "" {
				h += " " + r.now
			}
		}
		args = append(args, h)
		args = append(args, r.g.args[1:]...)
		keys = append(keys, r.g.keys...)
	}
	s.metrics.fcalls.Add(1)
	msgs, err := s.fcall(s.ctx, c, fnName, keys, args).ToArray()
	if err != nil {
		for _, r := range batch {
			r.g.res, r.g.err = nil, err
		}
		return
	}
	// The answers, a request after another; a request that failed in
	// Redis (an error reply on one of its keys) is answered "!error"
	// for each of its hits, the others of the batch were decided.
	nhits := 0
	for _, r := range batch {
		nhits += len(r.g.idx)
	}
	all := make([]answer, 0, nhits)
	for _, r := range batch {
		n := len(r.g.idx)
		res := all[len(all) : len(all)+n : len(all)+n]
		all = all[:len(all)+n]
		used, err := readAnswers(msgs, n, res)
		if _, failed := err.(*requestError); err != nil && !failed {
			for _, r := range batch {
				r.g.res, r.g.err = nil, err
			}
			return
		}
		msgs = msgs[used:]
		r.g.res, r.g.err = res, err
		if err != nil {
			r.g.res = nil
		}
	}
	if len(msgs) != 0 {
		err := fmt.Errorf("script returned %d values more than %d requests take", len(msgs), len(batch))
		for _, r := range batch {
			r.g.res, r.g.err = nil, err
		}
		return
	}
	for _, r := range batch {
		s.metrics.countExpired(r.g.res)
	}
}

// batchHeads[e][n][k][a] is the header of a request of n hits, k keys and
// a further arguments in a batch, "n k a", or with e = 1 "en k a": the
// common ones, made once rather than on every request.
var batchHeads = func() (h [2][4][4][8]string) {
	for e := range h {
		for n := range h[e] {
			for k := range h[e][n] {
				for a := range h[e][n][k] {
					h[e][n][k][a] = strconv.Itoa(n) + " " + strconv.Itoa(k) + " " + strconv.Itoa(a)
					if e == 1 {
						h[e][n][k][a] = "e" + h[e][n][k][a]
					}
				}
			}
		}
	}
	return h
}()

// requestError is an error reply to one request of a batch: Redis is
// there, and refused that request.
type requestError struct{ msg string }

func (e *requestError) Error() string { return "redis: " + e.msg }
