package decide

import (
	"context"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/vocab/permitfunc"
	"github.com/sluicehq/sluice/rules"
)

// The permits the local failure policy holds are handed to the store when
// it answers again, so that it counts their holders, admitted within the
// nodes' shares while it could not decide, and admits no newcomer to
// their slots: none is handed out twice (docs/internals/concurrency.md).
//
// The policy records each Permit it acquires for a request, with the
// store's keys and limits of its permits. The first request the store
// decides after that starts one hand-over in the background, as the
// write-back of its rates (and Failover.Health starts it with no request);
// a request that holds permits, before the store decides it, hands over
// first the recorded permits of its own keys, so that the store never
// decides a key before it counts this node's holders of it. A hand-over
// renews each permit in the store as held whatever the room; a Permit
// handed over renews and releases there from then on, and keeps its
// permits in the node's own store as copies, renewed and released with
// it, so that the node's share counts its holders while they run (as
// mirror does for the permits the store grants). Released permits are
// not handed over; permits
// that a front door releases by token (sluice serve) are forgotten when
// it does. A hand-over that fails leaves the permits where they are for
// the next one.
//
// At most maxLedger Permits are recorded; those beyond are not handed
// over (handOvers.dropped counts them) and run on beside the store's
// until they end, as before hand-overs were made.
type handOvers struct {
	mu      sync.Mutex
	list    []*handed
	ids     map[string]*handed // a token's permits by ID (sluice serve)
	pruned  int                // len(list) after the last prune
	flying  int                // Permits taken from list by a hand-over under way
	n       atomic.Int64       // len(list) + flying: a request waits for them
	busy    sync.Mutex         // one hand-over at a time
	dropped atomic.Int64
	moved   atomic.Int64 // Permits handed over, not logged yet
	ever    atomic.Bool  // some token's Permit was handed over
	sawDown atomic.Bool  // the store was seen down (policy answered, Health) since it last answered
	backAt  atomic.Int64 // when the store answered again after that, Unix ns (reserving)
	tokens  grants       // the token permits the store holds, to hold again (regrant.go)
}

// handed is a Permit of the local policy, to hand over.
type handed struct {
	p      *sluice.Permit
	keys   []string // the store's keys of its permits, in its order
	limits []any    // and their limits (*sluice.Limit)
	ids    []string // its permit IDs, for a token's
	token  bool     // a front door releases it by token, not by p
	until  int64    // a token's: when its permits expire (none renews them), Unix ns
}

// record adds p, acquired by the local policy at now for hits (the
// plan's) as local (the node's keys and shares, with their permit IDs,
// and out their decisions). token: the front door releases by token.
func (h *handOvers) record(p *sluice.Permit, hits, local []sluice.Hit, out []sluice.Decision, token bool, now int64) {
	e := &handed{p: p, token: token, until: math.MaxInt64}
	for i := range local {
		l := &local[i]
		// The hits whose permits p holds, in its order (sluice.Acquire).
		if l.Permit == "" || l.Cost != 1 || l.Limit.Algorithm != sluice.Concurrency || !out[i].Allowed {
			continue
		}
		e.keys = append(e.keys, strings.Clone(hits[i].Key))
		e.limits = append(e.limits, hits[i].Limit)
		e.ids = append(e.ids, l.Permit)
		if token {
			e.until = min(e.until, satAdd(now, int64(l.Limit.Period)))
		}
	}
	if len(e.keys) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.list) >= 2*h.pruned+64 {
		h.pruneLocked()
	}
	if len(h.list) >= maxLedger {
		h.dropped.Add(1)
		return
	}
	h.list = append(h.list, e)
	if token {
		if h.ids == nil {
			h.ids = make(map[string]*handed)
		}
		for _, id := range e.ids {
			h.ids[id] = e
		}
	}
	h.count()
}

// pruneLocked drops the Permits released. h.mu is held.
func (h *handOvers) pruneLocked() {
	keep := h.list[:0]
	for _, e := range h.list {
		if !e.token && permitfunc.Released(e.p) {
			continue
		}
		keep = append(keep, e)
	}
	clear(h.list[len(keep):])
	h.list, h.pruned = keep, len(keep)
	h.count()
}

// count sets n. h.mu is held.
func (h *handOvers) count() { h.n.Store(int64(len(h.list) + h.flying)) }

// forget drops the Permit whose permits a token release gives back, id
// one of them, unless it was handed over. It waits for a hand-over under
// way, so that the release that follows finds the permit where it is.
func (h *handOvers) forget(id string) {
	if h.n.Load() == 0 {
		return
	}
	h.busy.Lock()
	defer h.busy.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.ids[id]
	if e == nil {
		return
	}
	for _, id := range e.ids {
		delete(h.ids, id)
	}
	if i := indexOf(h.list, e); i >= 0 {
		h.list = append(h.list[:i], h.list[i+1:]...)
		h.list = h.list[:len(h.list):len(h.list)]
		h.count()
	}
}

func indexOf(list []*handed, e *handed) int {
	for i := range list {
		if list[i] == e {
			return i
		}
	}
	return -1
}

// take removes and returns the recorded Permits with a permit on one of
// keys (all when keys is nil), counted as flying until land. h.busy is
// held.
func (h *handOvers) take(keys []string) []*handed {
	h.mu.Lock()
	defer h.mu.Unlock()
	var mine []*handed
	keep := h.list[:0]
	for _, e := range h.list {
		if keys == nil || touches(e, keys) {
			mine = append(mine, e)
			continue
		}
		keep = append(keep, e)
	}
	clear(h.list[len(keep):])
	h.list = keep
	h.flying += len(mine)
	h.count()
	return mine
}

func touches(e *handed, keys []string) bool {
	for _, k := range e.keys {
		for _, want := range keys {
			if k == want {
				return true
			}
		}
	}
	return false
}

// dropIDs forgets the IDs of a token's Permit, handed over or dropped.
func (h *handOvers) dropIDs(e *handed) {
	if !e.token {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, id := range e.ids {
		delete(h.ids, id)
	}
}

// land ends the flight of taken Permits: those of rest, not handed over,
// go back to the records.
func (h *handOvers) land(taken int, rest []*handed) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.flying -= taken
	h.list = append(h.list, rest...)
	h.count()
}

// handOver hands the recorded Permits with a permit on one of keys (all
// when keys is nil) to the store of lim, at now. Those it could not hand
// over, on an error, stay recorded; the error is the store's. A token's
// Permit whose permits expired (nothing renews them) is dropped.
func (h *handOvers) handOver(ctx context.Context, lim *sluice.Limiter, keys []string, now int64) error {
	h.busy.Lock()
	defer h.busy.Unlock()
	list := h.take(keys)
	for i, e := range list {
		if e.until <= now {
			h.dropIDs(e)
			continue
		}
		moved, err := permitfunc.HandOver(ctx, e.p, lim, e.keys, e.limits)
		if err != nil {
			h.land(len(list), list[i:])
			return err
		}
		if e.token && moved {
			h.ever.Store(true)
			h.tokens.addHanded(e, now)
		}
		h.dropIDs(e)
		if moved {
			h.moved.Add(1)
		}
	}
	// Landed only now: until then, requests on other keys wait too (n).
	h.land(len(list), nil)
	return nil
}

// heldFirst hands over, before the store decides hits, the local
// policy's Permits with a permit on their keys of concurrency limits, and
// holds again the due token permits on them (regrant.go). While
// Failover.Health says the store is down, it tries nothing and returns
// that: the policy answers at once, rather than each request waiting in
// turn for a store call that times out (the store's own probe tells when
// it is back).
func (d *Decider) heldFirst(ctx context.Context, hits []sluice.Hit) error {
	if h := d.failover.Health; h != nil {
		if err := h(); err != nil {
			return err
		}
	}
	var buf [8]string
	keys := buf[:0]
	for i := range hits {
		if hits[i].Limit.Algorithm == sluice.Concurrency {
			keys = append(keys, hits[i].Key)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	if d.held.n.Load() > 0 {
		if err := d.held.handOver(ctx, d.limiter, keys, d.now()); err != nil {
			return err
		}
	}
	if d.held.tokens.due() {
		return d.held.tokens.regrant(ctx, keys, d.now())
	}
	return nil
}

// mirror holds copies of the permits the store granted p in the node's
// own store, when the request's domain falls back on the local policy:
// the node's share counts them, so that if the store fails while their
// holders run, the policy admits beside them only what the share leaves
// (without them, every outage started at up to 2N in flight). A front
// door that releases by token (sluice serve) keeps no Permit: nothing
// renews the copies, as nothing renews the store's permits, and the
// token's release gives both back (releaseCopies). A copy that fails is
// not made (the node's store is in process: only a bad hit fails it).
// Nor is one made while maxLedger tokens' Permits are recorded (grants):
// tokens never released would otherwise grow the node's memory with
// their copies until their TTL, without a bound.
func (d *Decider) mirror(ctx context.Context, s *scratch, p *sluice.Permit, out []sluice.Decision) {
	f := &d.failover
	if f.Local == nil || d.policyOf(s.plan.Domain) != rules.FailLocal || d.held.tokens.live.Load() >= maxLedger {
		return
	}
	hits := s.plan.Hits
	local := f.localHits(s, f.nodes())
	var kb [4]string
	var lb [4]any
	keys, limits := kb[:0], lb[:0]
	for i := range hits {
		h := &hits[i]
		if h.Permit == "" || h.Cost != 1 || h.Limit.Algorithm != sluice.Concurrency || !out[i].Allowed {
			continue
		}
		keys = append(keys, strings.Clone(local[i].Key))
		limits = append(limits, local[i].Limit)
	}
	if len(keys) > 0 {
		_ = permitfunc.Mirror(ctx, p, f.Local, keys, limits)
	}
}

// reserveFor is how long, after the store answers a node again once its
// local policy has answered, the node leaves to the other nodes their
// shares of each concurrency limit: long enough for each of them to reach
// the store and hand over its policy's holders (the Redis store's breaker
// lets a probe through within its cooldown, 5 s at most by default, and
// an idle node polls Failover.Health every writeBackPoll).
const reserveFor = 6 * time.Second

// reserving returns hits, or, for a domain that falls back on the local
// policy, from the moment this node saw the store down (its policy
// answered, or watchStore saw it) until reserveFor after the store
// answered it again, a copy whose permits of concurrency limits of N
// slots are decided against N − (n−1)·floor(N/n): the other n−1 nodes
// may each still hold a share under their local policy that the store
// does not count yet, and a newcomer admitted here must not take their
// slots (the window of docs/internals/concurrency.md), whether or not
// this node's policy admitted any. It narrows admissions only.
func (d *Decider) reserving(s *scratch, hits []sluice.Hit) []sluice.Hit {
	if back := d.held.backAt.Load(); !d.held.sawDown.Load() && (back == 0 || d.now()-back >= int64(reserveFor)) {
		return hits
	}
	f := &d.failover
	n := f.nodes()
	if n <= 1 || d.policyOf(s.plan.Domain) != rules.FailLocal {
		return hits
	}
	s.reserved = append(s.reserved[:0], hits...)
	for i := range s.reserved {
		if h := &s.reserved[i]; h.Limit.Algorithm == sluice.Concurrency && h.Cost == 1 {
			h.Limit = f.reserve(h.Limit, n)
		}
	}
	return s.reserved
}

// acquire has the store decide hits, a request's that holds permits:
// against the limits reserving says, the permit IDs given back to hits,
// and with the Permit's copies in the node's store (mirror).
func (d *Decider) acquire(ctx context.Context, s *scratch, hits []sluice.Hit, out []sluice.Decision) (*sluice.Permit, sluice.Decision, error) {
	acq := d.reserving(s, hits)
	p, overall, err := d.limiter.Acquire(ctx, acq, out)
	if len(acq) > 0 && &acq[0] != &hits[0] {
		for i := range acq {
			hits[i].Permit = acq[i].Permit // the IDs Acquire gave the copy
		}
	}
	if err == nil && p != nil {
		d.mirror(ctx, s, p, out)
	}
	return p, overall, err
}

// policyAnswered notes that the local policy answered a request the store
// failed (reserving), and records its Permit p, if any, to hand over.
func (d *Decider) policyAnswered(s *scratch, p *sluice.Permit, out []sluice.Decision, token bool) {
	d.held.sawDown.Store(true)
	d.held.tokens.sawDown()
	if p != nil {
		d.held.record(p, s.plan.Hits, s.local, out, token, d.now())
	}
}

// watchStore starts the loop that tells reserving of the store's
// outages that no request of this node meets: a node idle while the
// store is down (or deciding other domains only) has no policy answer to
// note it, yet when the store returns, the other nodes' policy holders
// are not counted until they hand them over, and a newcomer this node
// admits must not take their slots. Every writeBackPoll it asks
// Failover.Health, and Failover.Errors if set: down, or a call failed
// since the last poll, the store was seen down; up after that, it
// answers again (backAt), unless a request saw it first. The loop holds
// the Decider weakly and ends when it is collected (a Decider has no
// Close). Without Health it does nothing: an outage that neither a call
// of this node nor Health met goes unseen by an idle node.
func (d *Decider) watchStore() {
	health, errs := d.failover.Health, d.failover.Errors
	if health == nil {
		return
	}
	go watchStore(weak.Make(d), health, errs)
}

func watchStore(wd weak.Pointer[Decider], health func() error, errs func() int64) {
	t := time.NewTicker(writeBackPoll)
	defer t.Stop()
	var seen int64
	if errs != nil {
		seen = errs()
	}
	for range t.C {
		d := wd.Value()
		if d == nil {
			return
		}
		down := health() != nil
		if errs != nil {
			n := errs()
			down = down || n != seen
			seen = n
		}
		d.sawHealth(down)
	}
}

// sawHealth notes what watchStore saw of the store: down (Health said
// so, or a call failed since the last poll), or up.
func (d *Decider) sawHealth(down bool) {
	h := &d.held
	switch {
	case down:
		h.sawDown.Store(true)
		h.tokens.sawDown()
		return
	case h.sawDown.Load() && h.sawDown.CompareAndSwap(true, false):
		h.backAt.Store(d.now())
	}
	if h.tokens.due() && h.tokens.dueAll(d.now()) {
		d.startWriteBack() // an idle node's token permits, held again
	}
}
